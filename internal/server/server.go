package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/cdc/mysql"
	"github.com/retinadb/retina/internal/cdc/postgres"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/checkpoint"
	"github.com/retinadb/retina/internal/console"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/mirror"
	"github.com/retinadb/retina/internal/oltp/htap"
	"github.com/retinadb/retina/internal/oltp/oltpserver"
	"github.com/retinadb/retina/internal/pgwire"
	"github.com/retinadb/retina/internal/query"
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
	iceL    net.Listener // the Iceberg REST catalog's (nil: not served)
	iceHTTP *http.Server
	iceTLS  bool
	sources []*source
	sink    *sink.Sink         // nil without sources
	oltp    *oltpserver.Server // nil without an OLTP endpoint

	started time.Time

	console      *console.Console
	consoleUsers console.Authenticator // who may use the console (nil: anyone)
	httpTLS      bool
	// finished says every source ended (their ends were reached).
	finished atomic.Bool

	mu      sync.Mutex
	failure error // the error that stopped ingestion: /healthz reports it
}

// source is one configured change source.
type source struct {
	uri string
	src cdc.Source
	pg  *postgres.Source // when it is a PostgreSQL source: its progress for metrics
	my  *mysql.Source    // when it is a MySQL or MariaDB source
}

// Options tune a server beyond its Config.
type Options struct {
	Logger *slog.Logger
	// Stdin is read by a file:- source (default os.Stdin).
	Stdin io.Reader
	// Node adjusts the node configuration (write-buffer shape, threads).
	Node func(*NodeConfig)
	// Failpoints can stop the process at chosen points (crash tests).
	Failpoints *failpoint.Set
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
		Buckets: cfg.Buckets, BlockRows: cfg.BlockRows, FileBlocks: cfg.FileBlocks, Failpoints: opts.Failpoints, Logger: log,
		IdleInTransactionTimeout: cfg.IdleInTransactionTimeout, VisibilityCheckpointAfter: cfg.VisibilityCheckpointAfter,
		QueryHistory: cfg.QueryHistory,
		StorageGC:    StorageGCConfig{Interval: cfg.StorageGCInterval, StaleShare: cfg.StorageGCStaleShare},
		Iceberg:      IcebergConfig{Interval: cfg.IcebergInterval, FormatVersion: cfg.IcebergFormatVersion, Retention: cfg.IcebergRetention}}
	if cfg.StorageGCInterval == 0 {
		nc.StorageGC.Interval = -1 // off
	}
	nc.BlockCacheBytes = int64(cfg.BlockCacheMiB) << 20
	waiter := &lsnWaiter{}
	nc.Waiter = waiter
	if opts.Node != nil {
		opts.Node(&nc)
	}
	node, err := OpenNode(ctx, nc)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, Node: node, log: log, started: time.Now()}
	s.console = console.New(consoleProvider{s}, log)
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
	uris := slices.Clone(cfg.Sources)
	if cfg.MySQLAddr != "" {
		uris = append(uris, htap.Name)
	}
	if err := node.CheckSources(uris); err != nil {
		return nil, err
	}
	var starts []change.Checkpoint
	for i, uri := range cfg.Sources {
		start, err := node.Resume(i, sourceName(uri))
		if err != nil {
			return nil, err
		}
		src, err := s.openSource(ctx, uri, start, opts.Stdin)
		if err != nil {
			return nil, err
		}
		s.sources = append(s.sources, src)
		starts = append(starts, start)
	}
	if cfg.MySQLAddr != "" {
		start, err := node.Resume(len(s.sources), htap.Name)
		if err != nil {
			return nil, err
		}
		src, err := s.startOLTP(ctx)
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
			srcs[i], names[i] = src.src, sourceName(src.uri)
		}
		replayers := make([]sink.Replayer, len(node.Replayers))
		for j, rp := range node.Replayers {
			replayers[j] = rp
		}
		s.sink, err = sink.New(sink.Config{
			Sources: srcs, SourceNames: names, Catalog: node.Catalog, Txn: node.Txn, Replayers: replayers, Buckets: node.Config.Buckets,
			BadInput: sink.Policy(cfg.BadInput), DeadLetterPath: cfg.DeadLetter, Start: starts,
			Decoder: cdc.DecoderOptions{Decimals: decimals}, Collector: node, Logger: log,
			Persister: persister{node: node, uris: names}, CheckpointTicks: ticks(checkpointInterval(cfg, node)),
			PurgeTicks: ticks(cfg.IndexPurgeInterval),
			RedoUpTo:   readProgress(node.Config.DataDir, names), Progress: progressWriter(node.Config.DataDir, names),
			Visible: s.console.Visible,
		})
		if err != nil {
			return nil, err
		}
		for i, src := range s.sources {
			if src.pg != nil {
				s.sink.Watch(i, src.pg.Stream())
			}
		}
	}
	waiter.s.Store(s)
	if node.Iceberg != nil {
		node.Iceberg.HoldWhile(s.copying)
	}
	users, err := cfg.sqlUsers()
	if err != nil {
		return nil, err
	}
	tlsCfg, err := cfg.sqlTLS()
	if err != nil {
		return nil, err
	}
	if s.pg, err = pgwire.Listen(cfg.SQLAddr, node.Engine, pgwire.Options{Users: users, TLS: tlsCfg, RequireTLS: cfg.SQLTLSRequired, Logger: log}); err != nil {
		return nil, err
	}
	if s.httpL, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("server: metrics listen on %s: %w", cfg.HTTPAddr, err)
	}
	// Beyond loopback the console asks for a user of the SQL endpoint, and
	// the endpoint serves HTTPS with its certificate.
	if !loopback(s.httpL.Addr()) {
		if len(users) > 0 {
			s.consoleUsers = users
		} else {
			log.Warn("the console and metrics endpoint listens beyond loopback without users: anyone who reaches it sees every table's name and the running statements; configure sql_users", "addr", s.httpL.Addr().String())
		}
		if tlsCfg != nil {
			s.httpL = tls.NewListener(s.httpL, tlsCfg)
			s.httpTLS = true
		}
	}
	if err := s.listenIceberg(users, tlsCfg); err != nil {
		return nil, err
	}
	return s, nil
}

// checkpointInterval is how often replay checkpoints are taken: the
// configured interval, or the Iceberg cadence when it is shorter, since a
// publication covers a checkpoint's state.
func checkpointInterval(cfg Config, node *Node) time.Duration {
	if node.Iceberg != nil {
		return min(cfg.CheckpointInterval, node.Iceberg.Interval())
	}
	return cfg.CheckpointInterval
}

// lsnWaiter answers retina_wait_lsn: it waits on every PostgreSQL source
// until the commits before the LSN are applied.
type lsnWaiter struct{ s atomic.Pointer[Server] }

func (w *lsnWaiter) WaitLSN(ctx context.Context, lsn uint64) error {
	s := w.s.Load()
	waited := false
	for i, src := range s.sourcesIfStarted() {
		if src.pg == nil {
			continue
		}
		waited = true
		if err := s.sink.WaitApplied(ctx, i, src.pg.Stream(), int64(lsn)); err != nil {
			return fmt.Errorf("source %s: %w", sourceName(src.uri), err)
		}
		// The stream's start mark comes after the last row of an initial
		// copy, which may still be applying.
		if stream, done := src.pg.CopyStream(); stream != "" {
			if err := s.sink.WaitApplied(ctx, i, stream, done); err != nil {
				return fmt.Errorf("source %s: initial copy: %w", sourceName(src.uri), err)
			}
		}
	}
	if !waited {
		return query.ErrNoWaiter
	}
	return nil
}

// WaitMySQL answers retina_wait_mysql: it waits on every MySQL source until
// the transactions up to the binlog position are applied.
func (w *lsnWaiter) WaitMySQL(ctx context.Context, pos string) error {
	s := w.s.Load()
	waited := false
	for i, src := range s.sourcesIfStarted() {
		if src.my == nil {
			continue
		}
		waited = true
		targets, err := src.my.WaitTargets(ctx, pos)
		if err != nil {
			return err
		}
		for _, t := range targets {
			if err := s.sink.WaitApplied(ctx, i, t.Stream, t.Offset); err != nil {
				return fmt.Errorf("source %s: %w", sourceName(src.uri), err)
			}
		}
	}
	if !waited {
		return query.ErrNoMySQLWaiter
	}
	return nil
}

// copying tells whether a source's initial copy is running.
func (s *Server) copying() bool {
	for _, src := range s.sources {
		switch {
		case src.pg != nil && !src.pg.Stats().SnapshotDone, src.my != nil && !src.my.Stats().SnapshotDone:
			return true
		}
		if hs, ok := src.src.(*htap.Source); ok && !hs.Stats().CopyDone {
			return true
		}
	}
	return false
}

// sourcesIfStarted is the sources once ingestion is set up, else none.
func (s *Server) sourcesIfStarted() []*source {
	if s == nil || s.sink == nil {
		return nil
	}
	return s.sources
}

// sourceName is how a source is named in checkpoints, logs and metrics:
// its URI without a password.
func sourceName(uri string) string {
	if postgres.IsURI(uri) {
		return postgres.Redact(uri)
	}
	if mysql.IsURI(uri) {
		return mysql.Name(uri)
	}
	return uri
}

// openSource opens a source at its last applied position.
func (s *Server) openSource(ctx context.Context, uri string, start change.Checkpoint, stdin io.Reader) (*source, error) {
	src := &source{uri: uri}
	var err error
	if postgres.IsURI(uri) {
		opts, perr := postgres.ParseURI(uri)
		if perr != nil {
			return nil, perr
		}
		src.pg, err = postgres.Open(ctx, opts, postgres.Config{Catalog: s.Node.Catalog, Logger: s.log, Resume: start.Resume})
		if err != nil {
			return nil, err
		}
		src.src = src.pg
		return src, nil
	}
	if mysql.IsURI(uri) {
		opts, perr := mysql.ParseURI(uri)
		if perr != nil {
			return nil, perr
		}
		src.my, err = mysql.Open(ctx, opts, mysql.Config{Catalog: s.Node.Catalog, Logger: s.log, Resume: start.Resume})
		if err != nil {
			return nil, err
		}
		src.src = src.my
		return src, nil
	}
	if uri == "file:-" && stdin != nil {
		src.src, err = cdc.OpenFileSource("-", cdc.FileOptions{Stdin: stdin, Resume: start.Resume})
	} else {
		src.src, err = cdc.OpenURI(uri, s.cfg.SourceEOF == "follow", start.Resume)
	}
	if err != nil {
		return nil, err
	}
	return src, nil
}

// startOLTP runs the OLTP store and its MySQL endpoint in this process and
// returns its commit stream as a source.
func (s *Server) startOLTP(ctx context.Context) (*source, error) {
	dir := s.cfg.OLTPData
	if dir == "" {
		dir = filepath.Join(s.cfg.DataDir, "oltp")
	}
	o, err := oltpserver.Start(ctx, oltpserver.Config{Dir: dir, MySQLAddr: s.cfg.MySQLAddr, MemoryTables: s.cfg.OLTPMemoryTables,
		UsersFile: s.cfg.MySQLUsers, Logger: s.log, Stream: true})
	if err != nil {
		return nil, err
	}
	src, err := htap.Open(o.Store(), o.Catalog(), s.Node.Catalog, s.log)
	if err != nil {
		o.Close()
		return nil, err
	}
	s.oltp = o
	return &source{uri: htap.Name, src: src}, nil
}

// detachOLTP stops the in-process store's source once ingestion stopped:
// nothing reads its commit stream any more, which must then hold nothing.
// The store keeps serving; the next start copies it into Retina again.
func (s *Server) detachOLTP() {
	for _, src := range s.sources {
		if src.uri == htap.Name {
			src.src.Close()
		}
	}
}

// MySQLAddr is the bound MySQL endpoint ("" without one).
func (s *Server) MySQLAddr() string {
	if s.oltp == nil {
		return ""
	}
	return s.oltp.MySQLAddr()
}

// sinkTick is how often the sink ticks (reads LWM, decides GC and
// checkpoints).
const sinkTick = time.Second

// ticks turns an interval into sink ticks.
func ticks(interval time.Duration) int {
	return max(int(interval/sinkTick), 1)
}

// persister takes the sink's replay checkpoints on the node, naming the
// sources by URI.
type persister struct {
	node *Node
	uris []string
}

func (p persister) Pending() bool { return p.node.GCPending() }

func (p persister) Seal(_ context.Context, ts uint64) (sink.SealedState, error) {
	st, err := p.node.Seal(ts)
	if err != nil {
		return nil, err
	}
	return sealedSources{st, p.uris}, nil
}

type sealedSources struct {
	st   *Sealed
	uris []string
}

func (s sealedSources) Write(ctx context.Context, resume []change.Checkpoint) error {
	return s.st.Write(ctx, withURIs(s.uris, resume))
}

func withURIs(uris []string, resume []change.Checkpoint) []checkpoint.Source {
	out := make([]checkpoint.Source, len(uris))
	for i, uri := range uris {
		out[i] = checkpoint.Source{URI: uri}
		if i < len(resume) {
			out[i].Resume = resume[i]
		}
	}
	return out
}

// SQLAddr and HTTPAddr are the bound addresses.
func (s *Server) SQLAddr() string  { return s.pg.Addr() }
func (s *Server) HTTPAddr() string { return s.httpL.Addr().String() }

// ConsoleURL is the web console's address.
func (s *Server) ConsoleURL() string {
	if s.httpTLS {
		return "https://" + s.HTTPAddr() + "/"
	}
	return "http://" + s.HTTPAddr() + "/"
}

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
				s.finished.Store(true)
				s.log.Info("every source finished")
			case errors.Is(err, context.Canceled):
			default:
				s.log.Error("ingestion stopped", "err", err)
				s.fail(err)
				s.detachOLTP()
			}
			ingested <- err
		}()
	} else {
		ingested <- nil
	}
	var gcWG sync.WaitGroup
	if s.sink != nil {
		gcWG.Go(func() { s.Node.RunStorageGC(intake) })
	}
	gcWG.Go(func() { s.Node.RunVisibilityCheckpoints(intake) })
	consoleCtx, stopConsole := context.WithCancel(context.WithoutCancel(ctx))
	defer stopConsole()
	var consoleWG sync.WaitGroup
	consoleWG.Go(func() { s.console.Run(consoleCtx) })
	if s.Node.Iceberg != nil {
		gcWG.Go(func() { s.Node.Iceberg.Run(intake) })
	}
	gcWG.Go(func() { s.Node.RunHistory(intake) })
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
	if s.iceL != nil {
		wg.Go(func() {
			if err := s.iceHTTP.Serve(s.iceL); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("Iceberg REST catalog stopped", "err", err)
			}
		})
	}
	s.log.Info("retina serving", "sql", s.SQLAddr(), "http", s.HTTPAddr(), "data", s.Node.Config.DataDir, "sources", len(s.sources))
	<-ctx.Done()
	s.log.Info("shutting down: stopping intake")
	stopIntake()
	ingestErr := <-ingested // in-flight transactions are committed or rolled back
	gcWG.Wait()
	stopServe()
	stopConsole()
	consoleWG.Wait()
	hs.Close()
	if s.iceHTTP != nil {
		s.iceHTTP.Close()
	}
	wg.Wait()
	return s.shutdown(ingestErr)
}

// shutdown takes the clean stop's checkpoint (replay state and source
// positions together, the positions never ahead of the state) and closes
// everything.
func (s *Server) shutdown(ingestErr error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var errs []error
	if errors.Is(ingestErr, mirror.ErrUnclean) {
		// Writes of a transaction that was neither committed nor rolled back
		// may be in the replay state: the last checkpoint stays current and
		// the next start recovers from it.
		s.log.Error("no final checkpoint: the replay state is not clean; the next start recovers from the last checkpoint", "err", ingestErr)
		errs = append(errs, fmt.Errorf("server: state not saved: %w", ingestErr))
	} else {
		var resume []change.Checkpoint
		uris := make([]string, len(s.sources))
		for i, src := range s.sources {
			uris[i] = sourceName(src.uri)
		}
		if s.sink != nil {
			resume = s.sink.Checkpoints()
		} else if m := s.Node.restored; m != nil {
			uris = nil // no sources given: keep the ones the checkpoint has
			for _, src := range m.Sources {
				uris, resume = append(uris, src.URI), append(resume, src.Resume)
			}
		}
		if err := s.Node.Persist(ctx, withURIs(uris, resume)); err != nil {
			errs = append(errs, fmt.Errorf("server: final checkpoint: %w (the next start recovers from the last checkpoint)", err))
		}
	}
	for _, src := range s.sources {
		errs = append(errs, src.src.Close())
	}
	if s.oltp != nil {
		errs = append(errs, s.oltp.Close())
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
	if s.oltp != nil {
		s.oltp.Close()
	}
	if s.pg != nil {
		s.pg.Close()
	}
	if s.httpL != nil {
		s.httpL.Close()
	}
	if s.iceL != nil {
		s.iceL.Close()
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
