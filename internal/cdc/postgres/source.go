package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retinadb/retina/internal/cdc"
)

// Config is what the source needs besides its URI.
type Config = cdc.DatabaseConfig

// Stats describe the source's progress; read them with Source.Stats.
type Stats struct {
	// Snapshot progress: tables copied of all, rows copied, and the rows
	// PostgreSQL estimates the tables hold (for an ETA).
	SnapshotTables, SnapshotTablesDone int64
	SnapshotRows, SnapshotRowsEstimate int64
	SnapshotDone                       bool
	// ServerWALEnd is the newest WAL position the server reported;
	// Received the newest commit delivered; Confirmed the flush LSN the
	// slot was told (what a durable replay checkpoint covers).
	ServerWALEnd, Received, Confirmed uint64
	// LastCommit is the commit time of the newest transaction delivered.
	LastCommit time.Time
	// SlotRetainedBytes is the WAL the slot keeps on the server (current
	// position minus restart_lsn), as last polled; SlotChecked when.
	SlotRetainedBytes int64
	SlotChecked       time.Time
	// Reconnects counts replication sessions started after a failure.
	Reconnects int64
}

// Source reads one PostgreSQL database through a logical replication slot.
// It is a cdc.Source whose messages carry decoded records.
type Source struct {
	opts Options
	cfg  Config
	log  *slog.Logger
	main string

	out    chan cdc.Message
	done   chan struct{}
	err    error // why the source stopped; read after done closes
	cancel context.CancelFunc

	// Streaming state, owned by the run goroutine.
	start     resumeState
	copied    bool          // the copy was delivered in this process
	next      pglogrepl.LSN // streaming resumes here after a reconnect
	delivered bool          // anything was delivered in this process

	confirmed  atomic.Uint64 // set by Commit, sent by the run goroutine
	copyStream atomic.Value  // string: the stream of this process's copy
	stats      struct {
		copy                                  cdc.CopyProgress
		reconnects                            atomic.Int64
		walEnd, received                      atomic.Uint64
		lastCommit, slotRetained, slotChecked atomic.Int64
	}
}

// fatal stops the source for good; any other session error is retried.
func fatal(err error) error { return cdc.Fatal(err) }

// Open checks the server (wal_level, the publication, creating it when
// missing) and starts reading in the background: the initial copy when the
// checkpoint holds no complete one, then the change stream.
func Open(ctx context.Context, opts Options, cfg Config) (*Source, error) {
	if cfg.Catalog == nil {
		return nil, errors.New("postgres source: a catalog is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Source{opts: opts, cfg: cfg, log: log.With("source", opts.Display), main: mainStream(opts.Slot),
		out: make(chan cdc.Message, 4096), done: make(chan struct{})}
	s.start = readResume(opts.Slot, cfg.Resume)
	s.next = s.start.streamFrom
	if s.start.copied {
		s.confirmed.Store(uint64(s.start.streamFrom))
		s.stats.copy.Done.Store(true) // an earlier run's copy, complete
	}
	setupCtx, cancelSetup := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSetup()
	if err := s.setup(setupCtx); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.run(runCtx)
	return s, nil
}

// sessionSettings are what the text decoding relies on: timestamps in UTC
// and ISO form, exact floats, hex bytea.
func sessionSettings(params map[string]string) {
	for k, v := range map[string]string{"TimeZone": "UTC", "DateStyle": "ISO, MDY", "IntervalStyle": "postgres",
		"extra_float_digits": "3", "bytea_output": "hex", "application_name": "retina"} {
		params[k] = v
	}
}

// connect opens a connection with the settings the text decoding relies on.
func (s *Source) connect(ctx context.Context, replication bool) (*pgconn.PgConn, error) {
	cc, err := pgconn.ParseConfig(s.opts.Conn)
	if err != nil {
		return nil, fatal(fmt.Errorf("postgres source %s: %w", s.opts.Display, err))
	}
	sessionSettings(cc.RuntimeParams)
	if replication {
		cc.RuntimeParams["replication"] = "database"
	}
	c, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("postgres source %s: connect: %w", s.opts.Display, err)
	}
	return c, nil
}

// setup checks wal_level and creates the publication when missing.
func (s *Source) setup(ctx context.Context) error {
	conn, err := s.sql(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return fmt.Errorf("postgres source %s: SHOW wal_level: %w", s.opts.Display, err)
	}
	if level != "logical" {
		return fmt.Errorf("postgres source %s: wal_level is %s: set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL", s.opts.Display, level)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", s.opts.Publication).Scan(&exists); err != nil {
		return fmt.Errorf("postgres source %s: look up publication %s: %w", s.opts.Display, s.opts.Publication, err)
	}
	if exists {
		return nil
	}
	ddl := "CREATE PUBLICATION " + pgx.Identifier{s.opts.Publication}.Sanitize()
	if len(s.opts.Tables) == 0 {
		ddl += " FOR ALL TABLES"
	} else {
		names := make([]string, len(s.opts.Tables))
		for i, t := range s.opts.Tables {
			ns, name, _ := strings.Cut(t, ".")
			names[i] = pgx.Identifier{ns, name}.Sanitize()
		}
		ddl += " FOR TABLE " + strings.Join(names, ", ")
	}
	if _, err := conn.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("postgres source %s: %s: %w (the user needs CREATE on the database, and superuser for FOR ALL TABLES; or create the publication yourself)", s.opts.Display, ddl, err)
	}
	s.log.Info("created publication", "publication", s.opts.Publication, "tables", s.opts.Tables)
	return nil
}

// sql opens a plain SQL connection with the source's session settings.
func (s *Source) sql(ctx context.Context) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(s.opts.Conn)
	if err != nil {
		return nil, fatal(fmt.Errorf("postgres source %s: %w", s.opts.Display, err))
	}
	sessionSettings(cc.RuntimeParams)
	c, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("postgres source %s: connect: %w", s.opts.Display, err)
	}
	return c, nil
}

// Next returns the next message: a decoded record, or a position handled
// without one.
func (s *Source) Next(ctx context.Context) (cdc.Message, error) {
	select {
	case m := <-s.out:
		return m, nil
	case <-ctx.Done():
		return cdc.Message{}, ctx.Err()
	case <-s.done:
		select {
		case m := <-s.out:
			return m, nil
		default:
		}
		return cdc.Message{}, s.err
	}
}

// Commit lets the slot confirm everything a durable replay checkpoint
// covers: the stream's resume LSN.
func (s *Source) Commit(_ context.Context, resume map[string]int64) error {
	if off, ok := resume[s.main]; ok && off > 0 && readResume(s.opts.Slot, resume).copied {
		for {
			cur := s.confirmed.Load()
			if uint64(off) <= cur || s.confirmed.CompareAndSwap(cur, uint64(off)) {
				break
			}
		}
	}
	return nil
}

// Contiguous: pgoutput sends each transaction whole at its commit, in
// commit order (cdc.Contiguous).
func (s *Source) Contiguous() bool { return true }

// Stream names the stream whose offsets are LSNs: a commit is applied
// once the stream resumes at or after its end.
func (s *Source) Stream() string { return s.main }

// CopyStream names the stream of the initial copy this process made ("" if
// none), and the offset it resumes at once the copy is applied in full.
// It is set before the copy's first row, so once Stream has reached the
// copy's end mark it names that copy.
func (s *Source) CopyStream() (string, int64) {
	name, _ := s.copyStream.Load().(string)
	return name, math.MaxInt64
}

// Close stops reading.
func (s *Source) Close() error {
	s.cancel()
	<-s.done
	return nil
}

// Stats returns the source's progress.
func (s *Source) Stats() Stats {
	st := Stats{SnapshotTables: s.stats.copy.Tables.Load(), SnapshotTablesDone: s.stats.copy.TablesDone.Load(),
		SnapshotRows: s.stats.copy.Rows.Load(), SnapshotRowsEstimate: s.stats.copy.RowsEstimate.Load(),
		SnapshotDone: s.stats.copy.Done.Load(), ServerWALEnd: s.stats.walEnd.Load(), Received: s.stats.received.Load(),
		Confirmed: s.confirmed.Load(), Reconnects: s.stats.reconnects.Load()}
	if us := s.stats.lastCommit.Load(); us != 0 {
		st.LastCommit = time.UnixMicro(us)
	}
	if us := s.stats.slotChecked.Load(); us != 0 {
		st.SlotRetainedBytes, st.SlotChecked = s.stats.slotRetained.Load(), time.UnixMicro(us)
	}
	return st
}

// emit hands one message to Next.
func (s *Source) emit(ctx context.Context, m cdc.Message) error {
	select {
	case s.out <- m:
		s.delivered = true
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run copies when needed, then streams, reconnecting with backoff after a
// failure that is not the data's.
func (s *Source) run(ctx context.Context) {
	defer close(s.done)
	s.err = cdc.RunSessions(ctx, s.log, "postgres source", s.session, func() { s.stats.reconnects.Add(1) })
}

// session is one replication connection: the copy if due, then streaming
// until an error.
func (s *Source) session(ctx context.Context) error {
	conn, err := s.sql(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rc, err := s.connect(ctx, true)
	if err != nil {
		return err
	}
	defer rc.Close(context.Background())
	var slotExists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", s.opts.Slot).Scan(&slotExists); err != nil {
		return fmt.Errorf("postgres source %s: look up slot %s: %w", s.opts.Display, s.opts.Slot, err)
	}
	if !s.copied && !s.start.copied || !slotExists {
		if slotExists {
			s.log.Warn("the initial copy did not complete before: dropping the slot and copying again", "slot", s.opts.Slot)
			if err := pglogrepl.DropReplicationSlot(ctx, rc, s.opts.Slot, pglogrepl.DropReplicationSlotOptions{Wait: true}); err != nil {
				return fmt.Errorf("postgres source %s: drop slot %s: %w", s.opts.Display, s.opts.Slot, err)
			}
		} else if s.copied || s.start.copied {
			s.log.Warn("replication slot is gone (dropped outside Retina?): copying every table again", "slot", s.opts.Slot)
		}
		if err := s.snapshot(ctx, conn, rc); err != nil {
			return err
		}
	}
	return s.stream(ctx, conn, rc)
}
