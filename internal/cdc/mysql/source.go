package mysql

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/retinadb/retina/internal/cdc"
)

// Config is what the source needs besides its URI.
type Config = cdc.DatabaseConfig

// Stats describe the source's progress; read them with Source.Stats.
type Stats struct {
	// Snapshot progress: tables copied of all, rows copied, and the rows
	// the server estimates the tables hold (for an ETA).
	SnapshotTables, SnapshotTablesDone int64
	SnapshotRows, SnapshotRowsEstimate int64
	SnapshotDone                       bool
	// Transactions delivered, and the commit time and binlog position of
	// the newest.
	Transactions int64
	LastCommit   time.Time
	Position     string
	// Reconnects counts replication sessions started after a failure.
	Reconnects int64
}

// Source reads one MySQL or MariaDB database through the binary log. It is
// a cdc.Source whose messages carry decoded records.
type Source struct {
	opts   Options
	cfg    Config
	log    *slog.Logger
	flavor string
	gtid   bool // positions are GTIDs
	// collations maps the server's collation ids to character sets.
	collations map[uint64]string

	out    chan []cdc.Message // batches: a channel operation per message costs more than its decoding
	batch  []cdc.Message      // being filled by the run goroutine
	next1  []cdc.Message      // what Next has yet to return of the last batch
	done   chan struct{}
	err    error // why the source stopped; read after done closes
	cancel context.CancelFunc

	// Streaming state, owned by the run goroutine.
	start     resumeState
	copied    bool     // the copy was delivered in this process
	next      position // streaming resumes here after a reconnect
	delivered bool     // anything was delivered in this process

	stats struct {
		copy             cdc.CopyProgress
		reconnects, txns atomic.Int64
		lastCommit       atomic.Int64
		position         atomic.Value // string
	}
	copyStream  atomic.Value  // string: the stream of the copy streaming follows
	copyStarted chan struct{} // closed once copyStream is set
	startOnce   sync.Once
}

// fatal stops the source for good; any other session error is retried.
func fatal(err error) error { return cdc.Fatal(err) }

// Open checks the server's binary log settings and starts reading in the
// background: the initial copy when the checkpoint holds no complete one,
// then the binlog.
func Open(ctx context.Context, opts Options, cfg Config) (*Source, error) {
	if cfg.Catalog == nil {
		return nil, errors.New("mysql source: a catalog is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Source{opts: opts, cfg: cfg, log: log.With("source", opts.Display),
		out: make(chan []cdc.Message, 64), done: make(chan struct{}), copyStarted: make(chan struct{})}
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

// connect opens a client connection to the source's database.
func (s *Source) connect(ctx context.Context) (*client.Conn, error) {
	var opts []client.Option
	if s.opts.TLS != nil {
		opts = append(opts, func(c *client.Conn) error { c.SetTLSConfig(s.opts.TLS); return nil })
	}
	c, err := client.ConnectWithContext(ctx, s.opts.Addr, s.opts.User, s.opts.Password, s.opts.Database, 10*time.Second, opts...)
	if err != nil {
		return nil, fmt.Errorf("mysql source %s: connect: %w", s.opts.Display, err)
	}
	return c, nil
}

// query runs a statement and returns its rows as strings (NULL as nil).
func query(c *client.Conn) querier {
	return func(_ context.Context, sql string, args ...any) ([][]*string, error) {
		r, err := c.Execute(sql, args...)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		if r.Resultset == nil {
			return nil, nil
		}
		out := make([][]*string, len(r.Values))
		for i, row := range r.Values {
			out[i] = make([]*string, len(row))
			for j := range row {
				switch row[j].Type {
				case gomysql.FieldValueTypeNull:
				case gomysql.FieldValueTypeString:
					v := string(row[j].AsString())
					out[i][j] = &v
				default:
					v := row[j].String()
					out[i][j] = &v
				}
			}
		}
		return out, nil
	}
}

// setup checks the binary log settings, learns the flavour and the
// collations, and reads the checkpoint's resume point.
func (s *Source) setup(ctx context.Context) error {
	c, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	q := query(c)
	rows, err := q(ctx, "SELECT VERSION(), @@log_bin, @@binlog_format, @@binlog_row_image")
	if err != nil {
		return fmt.Errorf("mysql source %s: read the server's settings: %w", s.opts.Display, err)
	}
	get := func(i int) string {
		if len(rows) == 0 || rows[0][i] == nil {
			return ""
		}
		return *rows[0][i]
	}
	version := get(0)
	s.flavor = gomysql.MySQLFlavor
	if strings.Contains(strings.ToLower(version), "mariadb") {
		s.flavor = gomysql.MariaDBFlavor
	}
	var wrong []string
	if get(1) != "1" && !strings.EqualFold(get(1), "ON") {
		wrong = append(wrong, "log_bin is off: start the server with --log-bin")
	}
	if !strings.EqualFold(get(2), "ROW") {
		wrong = append(wrong, "binlog_format is "+get(2)+": set binlog_format = ROW")
	}
	if !strings.EqualFold(get(3), "FULL") {
		wrong = append(wrong, "binlog_row_image is "+get(3)+": set binlog_row_image = FULL")
	}
	meta, err := q(ctx, "SELECT @@binlog_row_metadata")
	switch {
	case err != nil:
		wrong = append(wrong, "the server has no binlog_row_metadata (MySQL 8.0.1 or MariaDB 10.5 is the oldest Retina reads)")
	case len(meta) == 0 || meta[0][0] == nil || !strings.EqualFold(*meta[0][0], "FULL"):
		v := ""
		if len(meta) > 0 && meta[0][0] != nil {
			v = *meta[0][0]
		}
		wrong = append(wrong, "binlog_row_metadata is "+v+": set binlog_row_metadata = FULL")
	}
	if len(wrong) > 0 {
		return fmt.Errorf("mysql source %s (%s): the binary log cannot feed Retina: %s (SET GLOBAL … and in the server's configuration file, then restart replication)",
			s.opts.Display, version, strings.Join(wrong, "; "))
	}
	s.gtid = s.flavor == gomysql.MariaDBFlavor
	if s.flavor == gomysql.MySQLFlavor {
		if m, err := q(ctx, "SELECT @@gtid_mode"); err == nil && len(m) > 0 && m[0][0] != nil && strings.EqualFold(*m[0][0], "ON") {
			s.gtid = true
		}
	}
	switch s.opts.Positions {
	case "file":
		s.gtid = false
	case "gtid":
		if !s.gtid {
			return fmt.Errorf("mysql source %s: positions=gtid, but the server has gtid_mode off: set gtid_mode = ON (and enforce_gtid_consistency), or use positions=file", s.opts.Display)
		}
	}
	colls, err := q(ctx, "SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS WHERE ID IS NOT NULL")
	if err != nil {
		return fmt.Errorf("mysql source %s: read the collations: %w", s.opts.Display, err)
	}
	s.collations = map[uint64]string{}
	for _, r := range colls {
		if r[0] == nil || r[1] == nil {
			continue
		}
		var id uint64
		fmt.Sscan(*r[0], &id)
		s.collations[id] = *r[1]
	}
	for _, t := range s.opts.Tables {
		found, err := q(ctx, "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", s.opts.Database, t)
		if err != nil {
			return fmt.Errorf("mysql source %s: look up table %s: %w", s.opts.Display, t, err)
		}
		if len(found) == 0 {
			return fmt.Errorf("mysql source %s: table %s.%s does not exist (or the user cannot see it: GRANT SELECT ON %s.* TO the source's user)", s.opts.Display, s.opts.Database, t, s.opts.Database)
		}
	}
	if s.start, err = readResume(s.opts, s.flavor, s.cfg.Resume); err != nil {
		return fmt.Errorf("mysql source %s: %w", s.opts.Display, err)
	}
	s.next = s.start.start
	if s.start.copied {
		s.setCopyStream(s.start.copyStream)
		s.stats.copy.Done.Store(true)
	}
	if s.start.copied && s.gtid != (s.next.gtid != nil) {
		return fmt.Errorf("mysql source %s: the checkpoint holds %s positions and the server now gives %s: set positions= back, or copy every table again with a new copy=TAG",
			s.opts.Display, map[bool]string{true: "GTID", false: "file"}[s.next.gtid != nil], map[bool]string{true: "GTID", false: "file"}[s.gtid])
	}
	return nil
}

// setCopyStream names the copy streaming follows.
func (s *Source) setCopyStream(name string) {
	s.copyStream.Store(name)
	s.startOnce.Do(func() { close(s.copyStarted) })
}

// selected tells whether a table of the source's database is read.
func (s *Source) selected(name string) bool {
	if len(s.opts.Tables) == 0 {
		return true
	}
	for _, t := range s.opts.Tables {
		if strings.EqualFold(t, name) {
			return true
		}
	}
	return false
}

// Next returns the next message: a decoded record, or a position handled
// without one. Calls are serialised by the caller.
func (s *Source) Next(ctx context.Context) (cdc.Message, error) {
	if len(s.next1) == 0 {
		select {
		case b := <-s.out:
			s.next1 = b
		case <-ctx.Done():
			return cdc.Message{}, ctx.Err()
		case <-s.done:
			select {
			case b := <-s.out:
				s.next1 = b
			default:
				if s.err == nil {
					return cdc.Message{}, io.EOF
				}
				return cdc.Message{}, s.err
			}
		}
	}
	m := s.next1[0]
	s.next1 = s.next1[1:]
	return m, nil
}

// Commit needs nothing: the server keeps no replica state; Retina's own
// checkpoint holds the position.
func (s *Source) Commit(context.Context, map[string]int64) error { return nil }

// Contiguous: the binlog holds each transaction whole, in commit order
// (cdc.Contiguous).
func (s *Source) Contiguous() bool { return true }

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
		SnapshotDone: s.stats.copy.Done.Load(), Transactions: s.stats.txns.Load(), Reconnects: s.stats.reconnects.Load()}
	if us := s.stats.lastCommit.Load(); us != 0 {
		st.LastCommit = time.UnixMicro(us)
	}
	st.Position, _ = s.stats.position.Load().(string)
	return st
}

// batchSize bounds the messages handed to Next at once.
const batchSize = 256

// emit hands one message to Next: in a batch, sent when full or when the
// message ends a transaction or marks a position (so nothing complete
// waits for more).
func (s *Source) emit(ctx context.Context, m cdc.Message) error {
	if s.batch == nil {
		s.batch = make([]cdc.Message, 0, batchSize)
	}
	s.batch = append(s.batch, m)
	if len(s.batch) < batchSize && m.Record != nil && m.Record.Kind == cdc.Change {
		return nil
	}
	select {
	case s.out <- s.batch:
		s.batch = nil
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
	s.err = cdc.RunSessions(ctx, s.log, "mysql source", func(ctx context.Context) error {
		err := s.session(ctx)
		// Changes of a transaction the session did not finish are read
		// again by the next one.
		s.batch = nil
		return err
	}, func() { s.stats.reconnects.Add(1) })
}

// session is one replication session: the copy if due, then streaming
// until an error.
func (s *Source) session(ctx context.Context) error {
	if !s.copied && !s.start.copied {
		if err := s.snapshot(ctx); err != nil {
			return err
		}
	}
	return s.stream(ctx)
}

// closeOnDone closes c when ctx ends (the client has no contexts) and
// returns the function that stops watching.
func closeOnDone(ctx context.Context, c *client.Conn) func() {
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			c.Close()
		case <-stop:
		}
	}()
	return func() { close(stop) }
}
