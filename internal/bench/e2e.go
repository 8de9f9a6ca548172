package bench

import (
	"context"
	"log/slog"
	"math"

	"github.com/retinadb/retina/internal/demo"
)

// E2EConfig parameterises `retina bench e2e`.
type E2EConfig = demo.E2EConfig

// DefaultE2EConfig runs in under a minute on two cores.
func DefaultE2EConfig() E2EConfig { return demo.DefaultE2EConfig() }

// E2E runs the HyBench-like pipeline (generator → file source → sink →
// replayers → SQL endpoint) and reports sustained throughput, freshness,
// query slowdown under change, visibility memory and invariant failures.
func E2E(ctx context.Context, r *Report, cfg E2EConfig) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	res, err := demo.RunE2E(ctx, cfg, r.Printf)
	if err != nil {
		return err
	}
	round := func(x float64, digits int) float64 {
		p := math.Pow(10, float64(digits))
		return math.Round(x*p) / p
	}
	r.Set("scale_factor", cfg.SF)
	r.Set("base_rows", res.BaseRows)
	r.Set("load_rows_per_sec", math.Round(res.LoadRowsPerSec))
	r.Set("rows_per_sec_sustained", math.Round(res.RowsPerSecSustain))
	r.Set("freshness_rate_target", cfg.FreshRate)
	r.Set("freshness_rate_achieved", math.Round(res.FreshAchievedRate))
	r.Set("freshness_p50_ms", round(float64(res.FreshP50)/1e6, 2))
	r.Set("freshness_p99_ms", round(float64(res.FreshP99)/1e6, 2))
	r.Set("freshness_samples", res.FreshSamples)
	r.Set("ap_slowdown_ratio", round(res.APSlowdown, 3))
	r.Set("ap_ratios", res.APRatios)
	r.Set("visibility_bits_per_tuple", round(res.VisibilityBits, 3))
	if res.ConsoleCPUShare >= 0 {
		r.Set("console_cpu_share", round(res.ConsoleCPUShare, 4))
	}
	r.Set("invariant_checks", res.InvariantChecks)
	r.Set("invariant_failures", res.InvariantFailures)
	if len(res.Failures) > 0 {
		r.Set("failures", res.Failures)
	}
	if len(res.ProbeErrors) > 0 {
		r.Set("probe_errors", res.ProbeErrors)
	}
	return nil
}
