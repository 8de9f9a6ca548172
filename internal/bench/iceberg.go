package bench

import (
	"context"
	"log/slog"
	"math"

	"github.com/retinadb/retina/internal/demo"
)

// IcebergConfig parameterises `retina bench iceberg`.
type IcebergConfig = demo.IcebergConfig

// DefaultIcebergConfig streams 50K row changes/s for 60 s, publishing
// every second.
func DefaultIcebergConfig() IcebergConfig { return demo.DefaultIcebergConfig() }

// Iceberg runs the HyBench-like stream with Iceberg publication and
// reports publication lag, its CPU share, file counts, metadata bytes per
// snapshot, whether an iceberg-go scan equals Retina, and the ingest
// slowdown publication costs.
func Iceberg(ctx context.Context, r *Report, cfg IcebergConfig) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	res, err := demo.RunIceberg(ctx, cfg, r.Printf)
	if err != nil {
		return err
	}
	round := func(x float64, digits int) float64 {
		p := math.Pow(10, float64(digits))
		return math.Round(x*p) / p
	}
	maxOf := func(m map[string]int) int {
		out := 0
		for _, v := range m {
			out = max(out, v)
		}
		return out
	}
	r.Set("scale_factor", cfg.SF)
	r.Set("format_version", cfg.FormatVersion)
	r.Set("rate", cfg.Rate)
	r.Set("publish_lag_p50_ms", round(float64(res.LagP50)/1e6, 1))
	r.Set("publish_lag_p99_ms", round(float64(res.LagP99)/1e6, 1))
	r.Set("publish_cpu_share", round(res.CPUShare, 4))
	r.Set("snapshots", res.Publications)
	r.Set("data_files_max", maxOf(res.DataFilesMax))
	r.Set("delete_files_max", maxOf(res.DeleteFilesMax))
	r.Set("retina_files_max", maxOf(res.RetinaFilesMax))
	r.Set("data_files_per_table", res.DataFilesMax)
	r.Set("delete_files_per_table", res.DeleteFilesMax)
	r.Set("retina_files_per_table", res.RetinaFilesMax)
	r.Set("data_files_over_retina_files_max", round(res.DataOverRetina, 3))
	r.Set("metadata_bytes_per_snapshot", math.Round(res.MetadataBytes))
	r.Set("metadata_bytes_per_snapshot_20_30s", math.Round(res.MetadataEarly))
	r.Set("metadata_bytes_per_snapshot_last_10s", math.Round(res.MetadataLate))
	r.Set("written_data_bytes", res.Written.Data)
	r.Set("written_delete_bytes", res.Written.Deletes)
	r.Set("written_metadata_bytes", res.Written.Metadata)
	r.Set("piece_rows_written", res.Written.PieceRows)
	rowsEqual := 0
	if res.RowsEqual {
		rowsEqual = 1
	}
	r.Set("rows_equal", rowsEqual)
	if len(res.Differences) > 0 {
		r.Set("differences", res.Differences)
	}
	r.Set("rows_per_sec_publication_off", math.Round(res.RowsPerSecOff))
	r.Set("rows_per_sec_publication_on", math.Round(res.RowsPerSecOn))
	r.Set("ingest_slowdown_ratio", round(res.IngestSlowdown, 3))
	r.Set("cpu_us_per_row_publication_off", round(res.CPUPerRowOff*1e6, 3))
	r.Set("cpu_us_per_row_publication_on", round(res.CPUPerRowOn*1e6, 3))
	r.Set("gc_cpu_share_publication_off", round(res.GCShareOff, 3))
	r.Set("gc_cpu_share_publication_on", round(res.GCShareOn, 3))
	r.Set("invariant_checks", res.InvariantChecks)
	r.Set("invariant_failures", res.InvariantFailures)
	if len(res.Failures) > 0 {
		r.Set("failures", res.Failures)
	}
	return nil
}
