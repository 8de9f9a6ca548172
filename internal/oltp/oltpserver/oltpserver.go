// Package oltpserver assembles the OLTP side into one running service: the
// Skeena store in a data directory, its SQL catalog and engine, and the
// MySQL-protocol listener. `retina oltp` runs it on its own.
package oltpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/retinadb/retina/internal/oltp/mysqlwire"
	"github.com/retinadb/retina/internal/oltp/skeena"
	"github.com/retinadb/retina/internal/oltp/sqlexec"
	"github.com/retinadb/retina/internal/oltp/sqlstore"
)

// Config configures the service.
type Config struct {
	Dir       string // data directory of the store
	MySQLAddr string // host:port of the MySQL endpoint
	// MemoryTables are placed in the memory engine when their CREATE TABLE
	// names no engine; the rest go to the storage engine.
	MemoryTables []string
	UsersFile    string // optional; see mysqlwire.Config
	Logger       *slog.Logger
	// Stream turns on the store's commit stream (Store().Commits), for
	// replication into Retina; its consumer must keep reading.
	Stream bool
}

// Server is the running service.
type Server struct {
	store *skeena.Store
	cat   *sqlstore.Catalog
	wire  *mysqlwire.Server
	log   *slog.Logger
	done  chan struct{}
}

// Start recovers the store and starts listening.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("oltp: no data directory given (--data)")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	store, err := skeena.Open(ctx, skeena.Options{Dir: cfg.Dir, Tables: sqlstore.PhysicalTables(), Logger: cfg.Logger, Stream: cfg.Stream})
	if err != nil {
		return nil, fmt.Errorf("oltp: open the store in %s: %w", cfg.Dir, err)
	}
	cat, err := sqlstore.OpenCatalog(ctx, store)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("oltp: %s: %w", cfg.Dir, err)
	}
	mem := map[string]bool{}
	for _, t := range cfg.MemoryTables {
		if t = strings.ToLower(strings.TrimSpace(t)); t != "" {
			mem[t] = true
		}
	}
	eng, err := sqlexec.New(store, cat, sqlexec.Config{MemoryTables: mem, Logger: cfg.Logger})
	if err != nil {
		store.Close()
		return nil, err
	}
	wire, err := mysqlwire.Listen(eng, mysqlwire.Config{Addr: cfg.MySQLAddr, UsersFile: cfg.UsersFile, Logger: cfg.Logger})
	if err != nil {
		store.Close()
		return nil, err
	}
	s := &Server{store: store, cat: cat, wire: wire, log: cfg.Logger, done: make(chan struct{})}
	go func() { defer close(s.done); wire.Serve() }()
	return s, nil
}

// Store and Catalog are the running store and its SQL catalog.
func (s *Server) Store() *skeena.Store       { return s.store }
func (s *Server) Catalog() *sqlstore.Catalog { return s.cat }

// MySQLAddr is the bound MySQL endpoint.
func (s *Server) MySQLAddr() string { return s.wire.Addr().String() }

// Run serves until ctx ends, then shuts down cleanly.
func (s *Server) Run(ctx context.Context) error {
	<-ctx.Done()
	return s.Close()
}

// Close stops the listener, rolls back open transactions and closes the
// store.
func (s *Server) Close() error {
	s.wire.Close()
	<-s.done
	return s.store.Close()
}
