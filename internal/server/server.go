package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/durable"
	"github.com/retinadb/retina/internal/pgwire"
	"github.com/retinadb/retina/internal/sink"
)

// Server is `retina serve`: a node, one sink per source, the SQL endpoint
// and the metrics endpoint.
type Server struct {
	cfg   Config
	Node  *Node
	log   *slog.Logger
	pg    *pgwire.Server
	httpL net.Listener
	feeds []*feed

	mu      sync.Mutex
	failure error // the first pipeline error: /healthz reports it
}

// feed is one source and its sink.
type feed struct {
	uri  string
	src  cdc.Source
	sink *sink.Sink
	cp   string // checkpoint file
	done chan error
}

// sinkState is what a clean stop records per source.
type sinkState struct {
	Source     string          `json:"source"`
	Checkpoint sink.Checkpoint `json:"checkpoint"`
}

// Options tune a server beyond its Config.
type Options struct {
	Logger *slog.Logger
	// Stdin is read by a file:- source (default os.Stdin).
	Stdin io.Reader
	// Node adjusts the node configuration (write-buffer shape, threads).
	Node func(*NodeConfig)
}

// Start opens the node, declares tables, opens the sources at their last
// applied positions, and binds the SQL and metrics addresses.
func Start(ctx context.Context, cfg Config, opts Options) (s *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	nc := NodeConfig{DataDir: cfg.DataDir, Lake: cfg.Lake, IndexBackend: cfg.IndexBackend, Replayers: cfg.Replayers, Logger: log}
	if opts.Node != nil {
		opts.Node(&nc)
	}
	node, err := OpenNode(ctx, nc)
	if err != nil {
		return nil, err
	}
	s = &Server{cfg: cfg, Node: node, log: log}
	defer func() {
		if err != nil {
			s.closeAll()
		}
	}()
	for _, t := range cfg.Tables {
		sc, _ := t.schema()
		if _, err := node.Catalog.CreateTable(ctx, t.Name, sc); err != nil && !errors.Is(err, catalog.ErrExists) {
			return nil, fmt.Errorf("server: declare table %s: %w", t.Name, err)
		}
	}
	for i, uri := range cfg.Sources {
		f, err := s.openFeed(i, uri, opts.Stdin)
		if err != nil {
			return nil, err
		}
		s.feeds = append(s.feeds, f)
	}
	if s.pg, err = pgwire.Listen(cfg.SQLAddr, node.Engine, log); err != nil {
		return nil, err
	}
	if s.httpL, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("server: metrics listen on %s: %w", cfg.HTTPAddr, err)
	}
	return s, nil
}

func (s *Server) openFeed(i int, uri string, stdin io.Reader) (*feed, error) {
	f := &feed{uri: uri, cp: filepath.Join(s.Node.Config.DataDir, "sink-"+strconv.Itoa(i)+".json"), done: make(chan error, 1)}
	var st sinkState
	if data, err := os.ReadFile(f.cp); err == nil {
		if err := json.Unmarshal(data, &st); err != nil {
			return nil, fmt.Errorf("server: %s: %w", f.cp, err)
		}
		if st.Source != uri {
			return nil, fmt.Errorf("server: source %d was %q when the data directory was last used, now %q: keep the source order", i, st.Source, uri)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var err error
	if uri == "file:-" && stdin != nil {
		f.src, err = cdc.OpenFileSource("-", cdc.FileOptions{Stdin: stdin, Resume: st.Checkpoint.Resume})
	} else {
		f.src, err = cdc.OpenURI(uri, s.cfg.SourceEOF == "follow", st.Checkpoint.Resume)
	}
	if err != nil {
		return nil, err
	}
	replayers := make([]sink.Replayer, len(s.Node.Replayers))
	for j, rp := range s.Node.Replayers {
		replayers[j] = rp
	}
	f.sink, err = sink.New(sink.Config{
		Source: f.src, Catalog: s.Node.Catalog, Txn: s.Node.Txn, Replayers: replayers, Buckets: s.cfg.Buckets,
		BadInput: sink.Policy(s.cfg.BadInput), DeadLetterPath: s.cfg.DeadLetter, Start: st.Checkpoint,
		Truncator: s.Node, Logger: s.log,
	})
	if err != nil {
		f.src.Close()
		return nil, err
	}
	return f, nil
}

// SQLAddr and HTTPAddr are the bound addresses.
func (s *Server) SQLAddr() string  { return s.pg.Addr() }
func (s *Server) HTTPAddr() string { return s.httpL.Addr().String() }

func (s *Server) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failure == nil {
		s.failure = err
	}
}

// Failure is the pipeline error that stopped intake, if any.
func (s *Server) Failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failure
}

// Run serves until ctx ends, then stops cleanly: intake stops, in-flight
// transactions finish, buffers become regular files, deletes and source
// positions are saved, and every component closes. A source that fails
// stops intake (queries keep being served) and is reported by /healthz.
func (s *Server) Run(ctx context.Context) error {
	intake, stopIntake := context.WithCancel(ctx)
	defer stopIntake()
	for _, f := range s.feeds {
		go func() {
			err := f.sink.Run(intake)
			if err != nil && !errors.Is(err, context.Canceled) {
				s.log.Error("ingestion stopped", "source", f.uri, "err", err)
				s.fail(fmt.Errorf("source %s: %w", f.uri, err))
			} else if err == nil {
				s.log.Info("source finished", "source", f.uri)
			}
			f.done <- err
		}()
	}
	serveCtx, stopServe := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServe()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.pg.Serve(serveCtx); err != nil {
			s.log.Error("SQL endpoint stopped", "err", err)
		}
	})
	hs := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second}
	wg.Go(func() {
		if err := hs.Serve(s.httpL); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("metrics endpoint stopped", "err", err)
		}
	})
	s.log.Info("retina serving", "sql", s.SQLAddr(), "http", s.HTTPAddr(), "data", s.Node.Config.DataDir, "sources", len(s.feeds))
	<-ctx.Done()
	s.log.Info("shutting down: stopping intake")
	stopIntake()
	for _, f := range s.feeds {
		<-f.done // in-flight transactions are applied and committed
	}
	stopServe()
	hs.Close()
	wg.Wait()
	return s.shutdown()
}

// shutdown persists what a restart needs and closes everything.
func (s *Server) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var errs []error
	for _, f := range s.feeds {
		data, err := json.Marshal(sinkState{Source: f.uri, Checkpoint: f.sink.Checkpoint()})
		if err == nil {
			err = durable.WriteFile(f.cp, data)
		}
		errs = append(errs, err, f.src.Close())
	}
	errs = append(errs, s.Node.Shutdown(ctx))
	if err := errors.Join(errs...); err != nil {
		s.log.Error("shutdown incomplete", "err", err)
		return err
	}
	s.log.Info("shutdown complete: state saved", "data", s.Node.Config.DataDir)
	return nil
}

func (s *Server) closeAll() {
	for _, f := range s.feeds {
		f.src.Close()
	}
	if s.pg != nil {
		s.pg.Close()
	}
	if s.httpL != nil {
		s.httpL.Close()
	}
	s.Node.Close(context.Background())
}

// IngestStats sums the sinks' counters (LastSourceMS is the newest).
func (s *Server) IngestStats() sink.Stats {
	var total sink.Stats
	for _, f := range s.feeds {
		st := f.sink.Stats()
		total.Messages += st.Messages
		total.Transactions += st.Transactions
		total.Duplicates += st.Duplicates
		total.Ops += st.Ops
		total.Skipped += st.Skipped
		total.DeadLettered += st.DeadLettered
		total.Committed += st.Committed
		total.LastCommitTS = max(total.LastCommitTS, st.LastCommitTS)
		total.LastSourceMS = max(total.LastSourceMS, st.LastSourceMS)
	}
	return total
}
