// Package demo runs the HyBench-like workload against an embedded Retina
// server, through its real sink and SQL endpoint, and measures what the
// paper measures: throughput, freshness, query latency under change,
// consistency and visibility memory.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retinadb/retina/internal/hybench"
	"github.com/retinadb/retina/internal/server"
)

// pipeline is an embedded server fed from a pipe by the generator, and a
// SQL client pool on its endpoint.
type pipeline struct {
	srv     *server.Server
	gen     *hybench.Generator
	pw      *io.PipeWriter
	db      *pgxpool.Pool
	dataDir string
	tempDir bool
	log     *slog.Logger

	stopServer context.CancelFunc
	served     chan error

	written atomic.Int64 // row changes written to the source, snapshot included
}

type pipelineConfig struct {
	DataDir string // "" = a temporary directory, removed on close
	SQLAddr string // "" = a free loopback port
	SF      float64
	Seed    uint64
	Retain  bool // history tables keep their base size (hybench.Config.Retain)
	Logger  *slog.Logger
	// Node tunes the embedded node (tests shrink the write buffer).
	Node func(*server.NodeConfig)
	// Server adjusts the server's configuration.
	Server func(*server.Config)
}

func startPipeline(ctx context.Context, cfg pipelineConfig) (p *pipeline, err error) {
	p = &pipeline{log: cfg.Logger, served: make(chan error, 1)}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if cfg.DataDir == "" {
		if p.dataDir, err = os.MkdirTemp("", "retina-demo-"); err != nil {
			return nil, err
		}
		p.tempDir = true
	} else {
		entries, err := os.ReadDir(cfg.DataDir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		if len(entries) > 0 {
			return nil, fmt.Errorf("demo: data directory %s is not empty: the demo loads its own dataset, give it a new directory", cfg.DataDir)
		}
		p.dataDir = cfg.DataDir
	}
	defer func() {
		if err != nil && p.tempDir {
			os.RemoveAll(p.dataDir)
		}
	}()
	var run [6]byte
	rand.Read(run[:])
	p.gen = hybench.New(hybench.Config{SF: cfg.SF, Seed: cfg.Seed, Retain: cfg.Retain, Run: "hybench-" + hex.EncodeToString(run[:])}, time.Now())

	sc := server.DefaultConfig()
	sc.DataDir = p.dataDir
	sc.Sources = []string{"file:-"}
	sc.SourceEOF = "stop"
	sc.SQLAddr = cfg.SQLAddr
	if sc.SQLAddr == "" {
		sc.SQLAddr = "127.0.0.1:0"
	}
	sc.HTTPAddr = "127.0.0.1:0"
	for _, t := range hybench.Tables() {
		d := server.TableDecl{Name: t.Name, PrimaryKey: []string{t.Key}}
		for _, c := range t.Columns {
			d.Columns = append(d.Columns, server.ColumnDecl{Name: c.Name, Type: c.Type})
		}
		sc.Tables = append(sc.Tables, d)
	}
	if cfg.Server != nil {
		cfg.Server(&sc)
	}
	pr, pw := io.Pipe()
	p.pw = pw
	p.srv, err = server.Start(ctx, sc, server.Options{Logger: p.log, Stdin: pr, Node: cfg.Node})
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	p.stopServer = stop
	go func() { p.served <- p.srv.Run(runCtx) }()
	p.db, err = pgxpool.New(ctx, "postgres://retina@"+p.srv.SQLAddr()+"/retina?sslmode=disable&pool_max_conns=4")
	if err != nil {
		p.close()
		return nil, fmt.Errorf("demo: SQL client: %w", err)
	}
	return p, nil
}

// load writes the base dataset and waits until it is committed.
func (p *pipeline) load(ctx context.Context) error {
	if err := p.gen.WriteSnapshot(ctx, p.pw); err != nil {
		return err
	}
	p.written.Add(int64(p.gen.Sizes().Total()))
	return p.waitCommitted(ctx)
}

// waitCommitted returns once every row change written is committed.
func (p *pipeline) waitCommitted(ctx context.Context) error {
	want := uint64(p.written.Load())
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for p.srv.IngestStats().Committed < want {
		if err := p.srv.Failure(); err != nil {
			return fmt.Errorf("demo: ingestion failed: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// feed streams change transactions at rate row changes per second (0 = as
// fast as the pipeline takes them) until ctx ends. Each transaction's
// fresh_ts is the wall time it is handed to the source.
func (p *pipeline) feed(ctx context.Context, rate int) error {
	start := time.Now()
	var sent int64
	buf := make([]byte, 0, 64<<10)
	for ctx.Err() == nil {
		due := int64(-1)
		if rate > 0 {
			due = int64(time.Since(start).Seconds() * float64(rate))
			if sent >= due {
				time.Sleep(500 * time.Microsecond)
				continue
			}
		}
		buf = buf[:0]
		rows := int64(0)
		for len(buf) < 32<<10 && (due < 0 || sent+rows < due) {
			var st hybench.TxnStats
			buf, st = p.gen.NextTxn(buf, time.Now())
			rows += int64(st.Rows)
		}
		if _, err := p.pw.Write(buf); err != nil {
			return fmt.Errorf("demo: source pipe: %w", err)
		}
		sent += rows
		p.written.Add(rows)
	}
	return nil
}

// freshness is the HyBench measure: the probe's start time minus the
// newest fresh_ts its snapshot sees.
func (p *pipeline) freshness(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	var us int64
	if err := p.db.QueryRow(ctx, hybench.FreshnessSQL).Scan(&us); err != nil {
		return 0, fmt.Errorf("freshness probe: %w", err)
	}
	return max(0, start.Sub(time.UnixMicro(us))), nil
}

// checkInvariants runs the consistency checks; a failure is a message.
func (p *pipeline) checkInvariants(ctx context.Context) ([]string, error) {
	var failures []string
	var total int64
	if err := p.db.QueryRow(ctx, hybench.BalanceSQL).Scan(&total); err != nil {
		return nil, fmt.Errorf("balance check: %w", err)
	}
	if want := p.gen.TotalBalance(); total != want {
		failures = append(failures, fmt.Sprintf("total balance %d cents, want %d", total, want))
	}
	var loans int64
	if err := p.db.QueryRow(ctx, hybench.LoanSQL).Scan(&loans); err != nil {
		return nil, fmt.Errorf("loan check: %w", err)
	}
	if loans != 0 {
		failures = append(failures, fmt.Sprintf("accepted applications minus loans = %d, want 0", loans))
	}
	return failures, nil
}

// liveRows counts the rows visible in all tables, in one snapshot.
func (p *pipeline) liveRows(ctx context.Context) (int64, error) {
	q := "SELECT 0"
	for _, t := range hybench.Tables() {
		q += " + (SELECT count(*) FROM " + t.Name + ")"
	}
	var n int64
	if err := p.db.QueryRow(ctx, q).Scan(&n); err != nil {
		return 0, fmt.Errorf("count rows: %w", err)
	}
	return n, nil
}

// timeQuery runs q to completion and returns its latency.
func (p *pipeline) timeQuery(ctx context.Context, q hybench.Query) (time.Duration, error) {
	start := time.Now()
	rows, err := p.db.Query(ctx, q.SQL)
	if err != nil {
		return 0, fmt.Errorf("query %s: %w", q.Name, err)
	}
	for rows.Next() {
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("query %s: %w", q.Name, err)
	}
	return time.Since(start), nil
}

// finish ends the source, lets the server apply everything written and
// stop cleanly (the graceful shutdown a user's SIGTERM triggers).
func (p *pipeline) finish(ctx context.Context) error {
	p.pw.Close()
	err := p.waitCommitted(ctx)
	return errors.Join(err, p.close())
}

// close stops the server and removes a temporary data directory.
func (p *pipeline) close() error {
	if p.db != nil {
		p.db.Close()
	}
	p.pw.CloseWithError(errors.New("demo stopped"))
	var err error
	if p.stopServer != nil {
		p.stopServer()
		err = <-p.served
		p.stopServer = nil
	}
	if p.tempDir {
		err = errors.Join(err, os.RemoveAll(p.dataDir))
	}
	return err
}
