package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/server"
)

// serveFlags are the serve command's flags, bound to a config.
type serveFlags struct {
	configFile string
	cfg        server.Config
}

func newServeCommand() *cobra.Command {
	cmd, _ := serveCommand()
	return cmd
}

func serveCommand() (*cobra.Command, *serveFlags) {
	sf := &serveFlags{cfg: server.DefaultConfig()}
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
			cfg, err := sf.resolve(cmd.Flags(), os.Getenv)
			if err != nil {
				return err
			}
			log := newLogger(cmd.ErrOrStderr(), cfg.LogFormat)
			fps, err := failpoint.Parse(os.Getenv(failpoint.EnvVar))
			if err != nil {
				return fmt.Errorf("%s: %w", failpoint.EnvVar, err)
			}
			srv, err := server.Start(cmd.Context(), cfg, server.Options{Logger: log, Failpoints: fps})
			if err != nil {
				return err
			}
			host, port, _ := net.SplitHostPort(srv.SQLAddr())
			fmt.Fprintf(cmd.OutOrStdout(), "retina serving: SQL on %s (psql -h %s -p %s), metrics on http://%s/metrics\n",
				srv.SQLAddr(), host, port, srv.HTTPAddr())
			fmt.Fprintf(cmd.OutOrStdout(), "retina serving: console on %s\n", srv.ConsoleURL())
			if a := srv.IcebergAddr(); a != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "retina serving: Iceberg REST catalog on %s (uri %s)\n", a, srv.IcebergURI())
			}
			if a := srv.MySQLAddr(); a != "" {
				mh, mp, _ := net.SplitHostPort(a)
				fmt.Fprintf(cmd.OutOrStdout(), "retina serving: OLTP writes over MySQL protocol on %s (mysql -h %s -P %s -u root), replicated into Retina's tables\n", a, mh, mp)
			}
			return srv.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	c := &sf.cfg
	f.StringVar(&sf.configFile, "config", "", "YAML configuration file")
	f.StringVar(&c.DataDir, "data", c.DataDir, "data directory (catalog, index, transaction state, default lake)")
	f.StringVar(&c.Lake, "lake", "", "lake bucket URL (default file://<data>/lake)")
	f.StringArrayVar(&c.Sources, "source", nil, "change source URI, repeatable: file:PATH, file:-, kafka://HOST:PORT?topics=…, postgres://USER@HOST:PORT/DB?slot=…&publication=…")
	f.StringVar(&c.SourceEOF, "source-eof", c.SourceEOF, "at the end of a file source: follow (keep reading as it grows) or stop")
	f.StringVar(&c.SQLAddr, "sql-addr", c.SQLAddr, "PostgreSQL wire protocol endpoint")
	f.StringVar(&c.SQLTLSCert, "sql-tls-cert", "", "PEM certificate for TLS on the SQL endpoint (with --sql-tls-key)")
	f.StringVar(&c.SQLTLSKey, "sql-tls-key", "", "PEM private key of --sql-tls-cert")
	f.BoolVar(&c.SQLTLSRequired, "sql-tls-required", false, "refuse SQL clients that do not use TLS")
	f.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "HTTP endpoint for /metrics and /healthz")
	f.StringVar(&c.MySQLAddr, "mysql-addr", "", "run the OLTP store in this process with a MySQL-protocol endpoint here (host:port); its tables replicate into Retina")
	f.StringVar(&c.OLTPData, "oltp-data", "", "the OLTP store's data directory (default <data>/oltp)")
	f.StringSliceVar(&c.OLTPMemoryTables, "memory-tables", nil, "OLTP tables placed in the memory engine when CREATE TABLE names no engine (comma-separated)")
	f.StringVar(&c.MySQLUsers, "mysql-users", "", "users file for the MySQL endpoint (vitess static JSON; default root without password)")
	f.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format: text or json")
	f.StringVar(&c.IndexBackend, "index", c.IndexBackend, "index backend: memory or pebble")
	f.IntVar(&c.Replayers, "replayers", c.Replayers, "replayers in this process (fixed for a data directory)")
	f.IntVar(&c.Buckets, "buckets", c.Buckets, "sink buckets, parallel apply lanes (fixed for a data directory)")
	f.StringVar(&c.BadInput, "bad-input", c.BadInput, "on a message or transaction that cannot be applied: fail or dead-letter")
	f.StringVar(&c.DeadLetter, "dead-letter", "", "file the dead-letter policy appends to")
	f.DurationVar(&c.CheckpointInterval, "checkpoint-interval", c.CheckpointInterval, "how often a replay checkpoint is taken; a crash redoes what came after the last one from the sources")
	f.DurationVar(&c.IndexPurgeInterval, "index-purge-interval", c.IndexPurgeInterval, "how often the index drops the versions no running query can see")
	f.DurationVar(&c.IdleInTransactionTimeout, "idle-in-transaction-session-timeout", c.IdleInTransactionTimeout, "end SQL sessions idle inside a transaction this long (SQLSTATE 25P03; 0: no limit)")
	f.DurationVar(&c.QueryHistory, "query-history", c.QueryHistory, "how far back SQL sessions can read with SET retina.as_of; GC keeps what that needs (0: no time travel)")
	f.IntVar(&c.BlockCacheMiB, "block-cache-mib", c.BlockCacheMiB, "MiB of flushed write-buffer blocks kept decoded in memory for scans (0: off)")
	f.DurationVar(&c.VisibilityCheckpointAfter, "visibility-checkpoint-after", c.VisibilityCheckpointAfter, "checkpoint the visibility of queries and read transactions this old so they stop holding back GC (0: never)")
	f.DurationVar(&c.StorageGCInterval, "storage-gc-interval", c.StorageGCInterval, "how often storage GC looks for files to rewrite (0: off)")
	f.Float64Var(&c.StorageGCStaleShare, "storage-gc-stale-share", c.StorageGCStaleShare, "share of a file's versions that must be stale before storage GC rewrites it")
	f.DurationVar(&c.IcebergInterval, "iceberg-interval", c.IcebergInterval, "publish every table as an Iceberg snapshot this often, all at one Retina timestamp (0: off)")
	f.IntVar(&c.IcebergFormatVersion, "iceberg-format-version", c.IcebergFormatVersion, "Iceberg format version: 2 (positional delete files) or 3 (deletion vectors)")
	f.DurationVar(&c.IcebergRetention, "iceberg-retention", c.IcebergRetention, "how long published Iceberg snapshots stay listed (every one of the last 10s, then one a minute)")
	f.StringVar(&c.IcebergAddr, "iceberg-addr", "", "serve the Iceberg REST catalog here (host:port; off by default)")
	f.StringVar(&c.DecimalHandling, "decimal-handling", c.DecimalHandling, "how schema-less messages encode decimals (Debezium's decimal.handling.mode): precise, string or double")
	return cmd, sf
}

// resolve merges, in increasing precedence, the defaults, the config file,
// the environment and the flags given, and validates the result.
func (sf *serveFlags) resolve(fs *pflag.FlagSet, getenv func(string) string) (server.Config, error) {
	cfg := server.DefaultConfig()
	if sf.configFile != "" {
		if err := cfg.LoadFile(sf.configFile); err != nil {
			return cfg, err
		}
	}
	if err := cfg.ApplyEnv(getenv); err != nil {
		return cfg, err
	}
	applyChangedFlags(fs, &cfg, sf.cfg)
	return cfg, cfg.Validate()
}

// applyChangedFlags copies the flags given on the command line onto cfg:
// unset flags must not override the file or the environment.
func applyChangedFlags(fs *pflag.FlagSet, cfg *server.Config, from server.Config) {
	set := map[string]func(){
		"data": func() { cfg.DataDir = from.DataDir }, "lake": func() { cfg.Lake = from.Lake },
		"source": func() { cfg.Sources = from.Sources }, "source-eof": func() { cfg.SourceEOF = from.SourceEOF },
		"sql-addr": func() { cfg.SQLAddr = from.SQLAddr }, "http-addr": func() { cfg.HTTPAddr = from.HTTPAddr },
		"mysql-addr": func() { cfg.MySQLAddr = from.MySQLAddr }, "oltp-data": func() { cfg.OLTPData = from.OLTPData },
		"memory-tables": func() { cfg.OLTPMemoryTables = from.OLTPMemoryTables }, "mysql-users": func() { cfg.MySQLUsers = from.MySQLUsers },
		"sql-tls-cert": func() { cfg.SQLTLSCert = from.SQLTLSCert }, "sql-tls-key": func() { cfg.SQLTLSKey = from.SQLTLSKey },
		"sql-tls-required": func() { cfg.SQLTLSRequired = from.SQLTLSRequired },
		"log-format":       func() { cfg.LogFormat = from.LogFormat }, "index": func() { cfg.IndexBackend = from.IndexBackend },
		"replayers": func() { cfg.Replayers = from.Replayers }, "buckets": func() { cfg.Buckets = from.Buckets },
		"bad-input": func() { cfg.BadInput = from.BadInput }, "dead-letter": func() { cfg.DeadLetter = from.DeadLetter },
		"decimal-handling":                    func() { cfg.DecimalHandling = from.DecimalHandling },
		"checkpoint-interval":                 func() { cfg.CheckpointInterval = from.CheckpointInterval },
		"index-purge-interval":                func() { cfg.IndexPurgeInterval = from.IndexPurgeInterval },
		"idle-in-transaction-session-timeout": func() { cfg.IdleInTransactionTimeout = from.IdleInTransactionTimeout },
		"storage-gc-interval":                 func() { cfg.StorageGCInterval = from.StorageGCInterval },
		"visibility-checkpoint-after":         func() { cfg.VisibilityCheckpointAfter = from.VisibilityCheckpointAfter },
		"block-cache-mib":                     func() { cfg.BlockCacheMiB = from.BlockCacheMiB },
		"query-history":                       func() { cfg.QueryHistory = from.QueryHistory },
		"storage-gc-stale-share":              func() { cfg.StorageGCStaleShare = from.StorageGCStaleShare },
		"iceberg-interval":                    func() { cfg.IcebergInterval = from.IcebergInterval },
		"iceberg-format-version":              func() { cfg.IcebergFormatVersion = from.IcebergFormatVersion },
		"iceberg-retention":                   func() { cfg.IcebergRetention = from.IcebergRetention },
		"iceberg-addr":                        func() { cfg.IcebergAddr = from.IcebergAddr },
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
