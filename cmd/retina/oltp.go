package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/retinadb/retina/internal/oltp/oltpserver"
)

func newOLTPCommand() *cobra.Command {
	var cfg oltpserver.Config
	var logFormat string
	cmd := &cobra.Command{
		Use:   "oltp",
		Short: "Run the Skeena OLTP store with a MySQL-protocol endpoint",
		Long: `Run the Skeena OLTP store (an in-memory engine and a Pebble storage engine,
one transaction across both) behind a MySQL wire-protocol endpoint.

CREATE TABLE … ENGINE=MEMORY places a table in the memory engine and
ENGINE=InnoDB in the storage engine; tables whose DDL names no engine go to
the memory engine if --memory-tables lists them, else to the storage engine.
User root with an empty password is accepted unless --mysql-users names a
users file. SIGINT or SIGTERM stops it cleanly; a restart on the same --data
recovers every acknowledged commit.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Logger = newLogger(cmd.ErrOrStderr(), logFormat)
			srv, err := oltpserver.Start(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "retina oltp: MySQL protocol on %s (mysql -h 127.0.0.1 -P <port> -u root)\n", srv.MySQLAddr())
			return srv.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Dir, "data", "retina-oltp", "data directory of the store")
	f.StringVar(&cfg.MySQLAddr, "mysql-addr", "127.0.0.1:3306", "MySQL wire-protocol endpoint (host:port)")
	f.StringSliceVar(&cfg.MemoryTables, "memory-tables", nil, "tables placed in the memory engine when their DDL names no engine (comma list)")
	f.StringVar(&cfg.UsersFile, "mysql-users", "", `JSON users file: {"user": [{"Password": "…"}]} (default: root, empty password)`)
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	return cmd
}
