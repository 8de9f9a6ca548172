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
	"github.com/retinadb/retina/internal/mirror"
	"github.com/retinadb/retina/internal/pgwire"
	"github.com/retinadb/retina/internal/sink"
)

// Server is `retina serve`: a node, the sources and the sink that replays
// them, the SQL endpoint and the metrics endpoint.
type Server struct {
	cfg     Config
	Node    *Node
	log     *slog.Logger
	pg      *pgwire.Server
	httpL   net.Listener
	sources []*source
	sink    *sink.Sink // nil without sources

	mu      sync.Mutex
	failure error // the error that stopped ingestion: /healthz reports it
}

// source is one configured change source.
type source struct {
	uri string
	src cdc.Source
	cp  string // its resume-point file
}

// sinkState is what a clean stop records per source.
type sinkState struct {
	Source     string            `json:"source"`
	Checkpoint mirror.Checkpoint `json:"checkpoint"`
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
// applied positions, and binds the SQL and metrics addresses. Every error
// names what it is about; nothing is left open.
func Start(ctx context.Context, cfg Config, opts Options) (_ *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	nc := NodeConfig{DataDir: cfg.DataDir, Lake: cfg.Lake, IndexBackend: cfg.IndexBackend, Replayers: cfg.Replayers,
		Buckets: cfg.Buckets, Logger: log}
	if opts.Node != nil {
		opts.Node(&nc)
	}
	node, err := OpenNode(ctx, nc)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, Node: node, log: log}
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
	var starts []mirror.Checkpoint
	for i, uri := range cfg.Sources {
		src, start, err := s.openSource(i, uri, opts.Stdin)
		if err != nil {
			return nil, err
		}
		s.sources = append(s.sources, src)
		starts = append(starts, start)
	}
	if len(s.sources) > 0 {
		decimals, _ := cdc.ParseDecimalMode(cfg.DecimalHandling)
		srcs := make([]cdc.Source, len(s.sources))
		names := make([]string, len(s.sources))
		for i, src := range s.sources {
			srcs[i], names[i] = src.src, src.uri
		}
		replayers := make([]sink.Replayer, len(node.Replayers))
		for j, rp := range node.Replayers {
			replayers[j] = rp
		}
		s.sink, err = sink.New(sink.Config{
			Sources: srcs, SourceNames: names, Catalog: node.Catalog, Txn: node.Txn, Replayers: replayers, Buckets: node.Config.Buckets,
			BadInput: sink.Policy(cfg.BadInput), DeadLetterPath: cfg.DeadLetter, Start: starts,
			Decoder: cdc.DecoderOptions{Decimals: decimals}, Collector: node, Logger: log,
		})
		if err != nil {
			return nil, err
		}
	}
	if s.pg, err = pgwire.Listen(cfg.SQLAddr, node.Engine, log); err != nil {
		return nil, err
	}
	if s.httpL, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("server: metrics listen on %s: %w", cfg.HTTPAddr, err)
	}
	return s, nil
}

// openSource opens source i at its last applied position.
func (s *Server) openSource(i int, uri string, stdin io.Reader) (*source, mirror.Checkpoint, error) {
	src := &source{uri: uri, cp: filepath.Join(s.Node.Config.DataDir, "sink-"+strconv.Itoa(i)+".json")}
	var st sinkState
	if data, err := os.ReadFile(src.cp); err == nil {
		if err := json.Unmarshal(data, &st); err != nil {
			return nil, st.Checkpoint, fmt.Errorf("server: %s is corrupt (%v): it holds where source %d (%s) resumes; restore it from a backup, or start over with an empty data directory", src.cp, err, i, uri)
		}
		if st.Source != uri {
			return nil, st.Checkpoint, fmt.Errorf("server: source %d was %q when the data directory was last used, now %q: give the sources in the same order", i, st.Source, uri)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, st.Checkpoint, fmt.Errorf("server: %w", err)
	}
	var err error
	if uri == "file:-" && stdin != nil {
		src.src, err = cdc.OpenFileSource("-", cdc.FileOptions{Stdin: stdin, Resume: st.Checkpoint.Resume})
	} else {
		src.src, err = cdc.OpenURI(uri, s.cfg.SourceEOF == "follow", st.Checkpoint.Resume)
	}
	if err != nil {
		return nil, st.Checkpoint, err
	}
	return src, st.Checkpoint, nil
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
// transactions finish, buffers become regular files, deletes are saved,
// then source positions, and every component closes. Ingestion that stops
// on an error keeps the queries served and is reported by /healthz.
func (s *Server) Run(ctx context.Context) error {
	intake, stopIntake := context.WithCancel(ctx)
	defer stopIntake()
	ingested := make(chan error, 1)
	if s.sink != nil {
		go func() {
			err := s.sink.Run(intake)
			switch {
			case err == nil:
				s.log.Info("every source finished")
			case errors.Is(err, context.Canceled):
			default:
				s.log.Error("ingestion stopped", "err", err)
				s.fail(err)
			}
			ingested <- err
		}()
	} else {
		ingested <- nil
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
	s.log.Info("retina serving", "sql", s.SQLAddr(), "http", s.HTTPAddr(), "data", s.Node.Config.DataDir, "sources", len(s.sources))
	<-ctx.Done()
	s.log.Info("shutting down: stopping intake")
	stopIntake()
	ingestErr := <-ingested // in-flight transactions are committed or rolled back
	stopServe()
	hs.Close()
	wg.Wait()
	return s.shutdown(ingestErr)
}

// shutdown persists what a restart needs, in dependency order, and closes
// everything: first the replay state, then the source positions that
// count on it.
func (s *Server) shutdown(ingestErr error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var errs []error
	if errors.Is(ingestErr, mirror.ErrUnclean) {
		// Writes of a transaction that was neither committed nor rolled back
		// may be in the replay state: saving it would make them visible.
		s.log.Error("replay state not saved: it is not clean; the data directory is left as after a crash", "err", ingestErr)
		errs = append(errs, fmt.Errorf("server: state not saved: %w", ingestErr))
	} else if err := s.Node.Persist(ctx); err != nil {
		errs = append(errs, fmt.Errorf("server: save the replay state: %w", err))
	} else if s.sink != nil {
		cps := s.sink.Checkpoints()
		for i, src := range s.sources {
			data, err := json.Marshal(sinkState{Source: src.uri, Checkpoint: cps[i]})
			if err == nil {
				err = durable.WriteFile(src.cp, data)
			}
			errs = append(errs, err)
		}
	}
	for _, src := range s.sources {
		errs = append(errs, src.src.Close())
	}
	errs = append(errs, s.Node.Close(ctx))
	if err := errors.Join(errs...); err != nil {
		s.log.Error("shutdown incomplete", "err", err)
		return err
	}
	s.log.Info("shutdown complete: state saved", "data", s.Node.Config.DataDir)
	return nil
}

func (s *Server) closeAll() {
	for _, src := range s.sources {
		src.src.Close()
	}
	if s.pg != nil {
		s.pg.Close()
	}
	if s.httpL != nil {
		s.httpL.Close()
	}
	s.Node.Close(context.Background())
}

// IngestStats are the sink's counters (zero without sources).
func (s *Server) IngestStats() sink.Stats {
	if s.sink == nil {
		return sink.Stats{}
	}
	return s.sink.Stats()
}
