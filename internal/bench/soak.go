package bench

import (
	"context"
	"log/slog"

	"github.com/retinadb/retina/internal/demo"
)

// SoakConfig parameterises `retina bench soak`.
type SoakConfig = demo.SoakConfig

// DefaultSoakConfig is 10 minutes at 30K row changes/s.
func DefaultSoakConfig() SoakConfig { return demo.DefaultSoakConfig() }

// Soak runs the steady-state benchmark: the HyBench-like mix at a steady
// rate with queries and one long read transaction, sampled over time, and
// reports whether memory, storage, freshness and query latency stay flat.
func Soak(ctx context.Context, r *Report, cfg SoakConfig) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	res, err := demo.RunSoak(ctx, cfg, r.Printf)
	if err != nil {
		return err
	}
	r.Set("scale_factor", cfg.SF)
	r.Set("rate_target", cfg.Rate)
	r.Set("duration_s", cfg.Duration.Seconds())
	for _, k := range []string{"rows_per_sec", "rss_growth_ratio", "lake_to_live_bytes_max", "stale_share_max",
		"freshness_p99_ms_first_minute", "freshness_p99_ms_last_minute", "ap_latency_ratio_last_vs_first", "live_rows_ratio_last_vs_first",
		"lwm_lag_max_s", "lwm_catchup_s", "lwm_freed_while_held_s", "visibility_bits_per_tuple", "samples", "invariant_checks", "invariant_failures"} {
		r.Set(k, res.Figures[k])
	}
	if len(res.InvariantFailures) > 0 {
		r.Set("failures", res.InvariantFailures)
	}
	if len(res.ProbeErrors) > 0 {
		r.Set("probe_errors", res.ProbeErrors)
	}
	return nil
}
