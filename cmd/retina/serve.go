package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/retinadb/retina/internal/server"
)

func newServeCommand() *cobra.Command {
	var configFile string
	flagCfg := server.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run every Retina component in one process: sources → sink → replay → SQL endpoint",
		Long: `Run every Retina component in one process (embedded mode).

Configuration, in increasing precedence: defaults, --config FILE (YAML),
RETINA_* environment variables (RETINA_DATA, RETINA_SOURCE as a comma
list, RETINA_SQL_ADDR, ...), then the flags given on the command line.
SIGINT or SIGTERM stops it cleanly; a restart on the same --data resumes
exactly where it stopped.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := server.DefaultConfig()
			if configFile != "" {
				if err := cfg.LoadFile(configFile); err != nil {
					return err
				}
			}
			if err := cfg.ApplyEnv(os.Getenv); err != nil {
				return err
			}
			applyChangedFlags(cmd.Flags(), &cfg, flagCfg)
			if err := cfg.Validate(); err != nil {
				return err
			}
			log := newLogger(cmd.ErrOrStderr(), cfg.LogFormat)
			srv, err := server.Start(cmd.Context(), cfg, server.Options{Logger: log})
			if err != nil {
				return err
			}
			host, port, _ := net.SplitHostPort(srv.SQLAddr())
			fmt.Fprintf(cmd.OutOrStdout(), "retina serving: SQL on %s (psql -h %s -p %s), metrics on http://%s/metrics\n",
				srv.SQLAddr(), host, port, srv.HTTPAddr())
			return srv.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML configuration file")
	f.StringVar(&flagCfg.DataDir, "data", flagCfg.DataDir, "data directory (catalog, index, transaction state, default lake)")
	f.StringVar(&flagCfg.Lake, "lake", "", "lake bucket URL (default file://<data>/lake)")
	f.StringArrayVar(&flagCfg.Sources, "source", nil, "change source URI, repeatable: file:PATH, file:-, kafka://HOST:PORT?topics=…")
	f.StringVar(&flagCfg.SourceEOF, "source-eof", flagCfg.SourceEOF, "at the end of a file source: follow (keep reading as it grows) or stop")
	f.StringVar(&flagCfg.SQLAddr, "sql-addr", flagCfg.SQLAddr, "PostgreSQL wire protocol endpoint")
	f.StringVar(&flagCfg.HTTPAddr, "http-addr", flagCfg.HTTPAddr, "HTTP endpoint for /metrics and /healthz")
	f.StringVar(&flagCfg.LogFormat, "log-format", flagCfg.LogFormat, "log format: text or json")
	f.StringVar(&flagCfg.IndexBackend, "index", flagCfg.IndexBackend, "index backend: memory or pebble")
	f.IntVar(&flagCfg.Replayers, "replayers", flagCfg.Replayers, "replayers in this process (keep it across restarts)")
	f.IntVar(&flagCfg.Buckets, "buckets", flagCfg.Buckets, "sink buckets (parallel apply lanes)")
	f.StringVar(&flagCfg.BadInput, "bad-input", flagCfg.BadInput, "on a message that cannot be applied: fail or dead-letter")
	f.StringVar(&flagCfg.DeadLetter, "dead-letter", "", "file the dead-letter policy appends to")
	return cmd
}

// applyChangedFlags copies the flags given on the command line onto cfg:
// unset flags must not override the file or the environment.
func applyChangedFlags(fs *pflag.FlagSet, cfg *server.Config, from server.Config) {
	set := map[string]func(){
		"data": func() { cfg.DataDir = from.DataDir }, "lake": func() { cfg.Lake = from.Lake },
		"source": func() { cfg.Sources = from.Sources }, "source-eof": func() { cfg.SourceEOF = from.SourceEOF },
		"sql-addr": func() { cfg.SQLAddr = from.SQLAddr }, "http-addr": func() { cfg.HTTPAddr = from.HTTPAddr },
		"log-format": func() { cfg.LogFormat = from.LogFormat }, "index": func() { cfg.IndexBackend = from.IndexBackend },
		"replayers": func() { cfg.Replayers = from.Replayers }, "buckets": func() { cfg.Buckets = from.Buckets },
		"bad-input": func() { cfg.BadInput = from.BadInput }, "dead-letter": func() { cfg.DeadLetter = from.DeadLetter },
	}
	fs.Visit(func(f *pflag.Flag) {
		if apply, ok := set[f.Name]; ok {
			apply()
		}
	})
}

func newLogger(w io.Writer, format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}
