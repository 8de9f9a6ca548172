package main

import (
	"github.com/spf13/cobra"

	"github.com/retinadb/retina/internal/bench"
)

func newBenchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench <name>",
		Short: "Run a named benchmark; the last line of output is one JSON object of figures",
	}
	cmd.AddCommand(newVisibilityBenchCommand())
	return cmd
}

// runReport runs one benchmark and prints its JSON line.
func runReport(cmd *cobra.Command, name string, run func(*bench.Report) error) error {
	r := bench.NewReport(cmd.OutOrStdout(), name)
	r.Printf("retina bench %s", name)
	if err := run(r); err != nil {
		return err
	}
	return r.Finish()
}

func newVisibilityBenchCommand() *cobra.Command {
	cfg := bench.DefaultVisibilityConfig()
	cmd := &cobra.Command{
		Use:   "visibility",
		Short: "Tile visibility: delete throughput, bitmap latency, memory per tuple after GC",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReport(cmd, "visibility", func(r *bench.Report) error {
				return bench.Visibility(cmd.Context(), r, cfg)
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.TileSize, "tile-size", cfg.TileSize, "tuples per tile (power of two, 64..4096)")
	f.IntVar(&cfg.Deletes, "deletes", cfg.Deletes, "deletes timed for deletes_per_sec")
	f.IntVar(&cfg.DeleteRows, "delete-rows", cfg.DeleteRows, "row-group size the deletes spread over")
	f.IntVar(&cfg.MemoryRows, "memory-rows", cfg.MemoryRows, "row-group size for the memory figure")
	f.Float64Var(&cfg.DeletedPct, "deleted-pct", cfg.DeletedPct, "percent of tuples deleted for the memory figure")
	f.IntVar(&cfg.BitmapRows, "bitmap-rows", cfg.BitmapRows, "row-group size for the bitmap timings")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
	return cmd
}
