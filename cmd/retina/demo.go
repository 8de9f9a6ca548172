package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/retinadb/retina/internal/demo"
)

// errInvariant makes the demo exit non-zero after printing its report.
var errInvariant = errors.New("demo: consistency check failed")

func newDemoCommand() *cobra.Command {
	cfg := demo.DefaultConfig()
	var verbose bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Load a HyBench-like bank, stream changes through the sink, and measure freshness, throughput and consistency over SQL",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			cfg.Out = out
			if f, ok := out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				cfg.Interactive = true
			}
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelInfo
			}
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			if cfg.SF <= 0 || cfg.Rate < 0 || cfg.Duration <= 0 {
				return fmt.Errorf("demo: --sf and --duration must be positive, --rate not negative")
			}
			rep, err := demo.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if rep.InvariantFailures > 0 {
				return fmt.Errorf("%w: %d of %d checks failed", errInvariant, rep.InvariantFailures, rep.InvariantChecks)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.Float64Var(&cfg.SF, "sf", cfg.SF, "HyBench-like scale factor (1 ≈ 7.6M base rows)")
	f.IntVar(&cfg.Rate, "rate", cfg.Rate, "row changes per second to stream (0 = as fast as possible)")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long to stream changes")
	f.StringVar(&cfg.DataDir, "data", "", "data directory, new or empty (default: a temporary one, removed afterwards)")
	f.StringVar(&cfg.OutDir, "out", cfg.OutDir, "directory for report.json and freshness.svg")
	f.StringVar(&cfg.SQLAddr, "sql-addr", "", "SQL endpoint while the demo runs (default: a free loopback port)")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed of the dataset and the stream")
	f.BoolVar(&verbose, "verbose", false, "log the server's info messages to stderr")
	return cmd
}
