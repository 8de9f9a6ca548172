// Package query runs SQL over Retina tables: embedded DuckDB does the
// relational work and every table is read through retina_scan, which does
// vectorized filter-on-read at the statement's snapshot.
//
// A statement takes one snapshot (HWM − 1) and ends it when its result is
// closed, whatever way it ends; every table it reads uses that snapshot, so
// a join of tables changed by the same source transactions always agrees.
// Between BEGIN and COMMIT (or ROLLBACK) a session keeps one snapshot for
// all its statements: repeatable read. Sessions are read-only and DuckDB
// runs with external access disabled and its configuration locked: no file
// reads or writes, no COPY, no ATTACH, no extension installs.
package query

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/duckdb/duckdb-go/v2"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/scan"
	"github.com/retinadb/retina/internal/txn"
)

// ErrReadOnly rejects statements that would change data or settings.
var ErrReadOnly = errors.New("query: the SQL endpoint is read-only: only SELECT, EXPLAIN, SHOW/DESCRIBE and transaction control are allowed")

// Catalog is what the engine needs from the catalog.
type Catalog interface {
	Snapshot() *catalog.Snapshot
}

// Config configures an engine.
type Config struct {
	Catalog Catalog
	Txn     txn.Service
	Scanner *scan.Scanner
	// Index serves point lookups by primary key (nil: every query scans).
	Index KeyIndex
	// Threads is DuckDB's worker count (default GOMAXPROCS).
	Threads int
	// MemoryLimit is DuckDB's memory_limit setting, e.g. "4GB" (default: DuckDB's).
	MemoryLimit string
	// IdleInTransactionTimeout is the default of the sessions'
	// idle_in_transaction_session_timeout (0: no limit).
	IdleInTransactionTimeout time.Duration
	// History is how far back retina.as_of can read (0: no time travel).
	// Keeping it holds GC back by as long: see history.go.
	History time.Duration
	// Waiter answers retina_wait_lsn (nil: the function reports there is
	// no PostgreSQL source).
	Waiter SourceWaiter
	// LakeDir is the local directory of a file:// lake: DuckDB reads the
	// regular files in it itself (native.go). Empty: every file is read
	// through retina_scan.
	LakeDir string
	// ScratchDir holds the engine's own files (the native path's empty
	// Parquet files); it is emptied at open and at close. Empty: a new
	// temporary directory.
	ScratchDir string
	Logger     *slog.Logger
}

// Engine owns the embedded DuckDB database.
type Engine struct {
	cfg       Config
	connector *duckdb.Connector
	db        *sql.DB
	admin     *sql.Conn // registers functions and keeps the views
	log       *slog.Logger

	viewsMu sync.Mutex
	viewsAt uint64          // catalog version the views match
	viewsOf string          // the table definitions they match
	views   map[string]bool // lower-case table names with a view

	scratch string // the empty files' directory (native path)
	emptyMu sync.Mutex
	empties map[emptyKey]string

	rowsRead, rowsOut atomic.Int64
	statements        atomic.Uint64
	lookups           atomic.Uint64
	lookupScans       atomic.Uint64
	nativeFiles       atomic.Uint64
	readers           readViews
	history           history
}

// Open starts DuckDB and registers retina_scan, the MVCC functions and one
// view per catalog table.
func Open(ctx context.Context, cfg Config) (*Engine, error) {
	if cfg.Catalog == nil || cfg.Txn == nil || cfg.Scanner == nil {
		return nil, fmt.Errorf("query: catalog, transaction service and scanner are required")
	}
	if cfg.Threads <= 0 {
		cfg.Threads = runtime.GOMAXPROCS(0)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	dsn := fmt.Sprintf("?threads=%d&autoinstall_known_extensions=false"+
		"&autoload_known_extensions=false&allow_community_extensions=false", cfg.Threads)
	if cfg.LakeDir == "" {
		dsn += "&enable_external_access=false&lock_configuration=true"
	}
	if cfg.MemoryLimit != "" {
		dsn += "&memory_limit=" + cfg.MemoryLimit
	}
	connector, err := duckdb.NewConnector(dsn, func(c driver.ExecerContext) error {
		// Every connection works in database retina, schema public, as a
		// PostgreSQL client expects (current_database(), current_schema()).
		for _, q := range []string{
			"ATTACH IF NOT EXISTS ':memory:' AS " + dbName,
			"CREATE SCHEMA IF NOT EXISTS " + dbName + "." + userSchema,
			"USE " + dbName + "." + userSchema,
		} {
			if _, err := c.ExecContext(context.Background(), q, nil); err != nil {
				return fmt.Errorf("query: %s: %w", q, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("query: start DuckDB: %w", err)
	}
	e := &Engine{cfg: cfg, connector: connector, history: history{keep: cfg.History}, db: sql.OpenDB(connector), log: cfg.Logger.With("component", "query"), views: map[string]bool{}}
	if e.admin, err = e.db.Conn(ctx); err != nil {
		e.db.Close()
		return nil, err
	}
	if cfg.LakeDir != "" {
		if err := e.allowLake(ctx); err != nil {
			e.Close()
			return nil, err
		}
	}
	if err := e.register(); err != nil {
		e.Close()
		return nil, err
	}
	if err := createCatalogs(ctx, e.admin); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.syncViews(ctx); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// scalar is a DuckDB scalar function of no arguments.
type scalar struct {
	result duckdb.TypeInfo
	fn     func(ctx context.Context) (any, error)
}

func (s scalar) Config() duckdb.ScalarFuncConfig {
	return duckdb.ScalarFuncConfig{ResultTypeInfo: s.result, Volatile: true}
}

func (s scalar) Executor() duckdb.ScalarFuncExecutor {
	return duckdb.ScalarFuncExecutor{RowContextExecutor: func(ctx context.Context, _ []driver.Value) (any, error) { return s.fn(ctx) }}
}

func (e *Engine) register() error {
	if err := duckdb.RegisterTableUDF(e.admin, "retina_scan", e.scanFunction(false)); err != nil {
		return fmt.Errorf("query: register retina_scan: %w", err)
	}
	if err := duckdb.RegisterTableUDF(e.admin, "retina_scan_rest", e.scanFunction(true)); err != nil {
		return fmt.Errorf("query: register retina_scan_rest: %w", err)
	}
	if err := duckdb.RegisterTableUDF(e.admin, "retina_deleted", e.deletedFunction()); err != nil {
		return fmt.Errorf("query: register retina_deleted: %w", err)
	}
	if err := duckdb.RegisterScalarUDF(e.admin, "retina_files", filesFunction{e}); err != nil {
		return fmt.Errorf("query: register retina_files: %w", err)
	}
	ubig, err := duckdb.NewTypeInfo(duckdb.TYPE_UBIGINT)
	if err != nil {
		return err
	}
	watermark := func(pick func(txn.Watermarks) uint64) scalar {
		return scalar{result: ubig, fn: func(ctx context.Context) (any, error) {
			w, err := e.cfg.Txn.Watermarks(ctx)
			return pick(w), err
		}}
	}
	fns := map[string]scalar{
		"retina_hwm": watermark(func(w txn.Watermarks) uint64 { return w.HWM }),
		"retina_lwm": watermark(func(w txn.Watermarks) uint64 { return w.LWM }),
		"retina_snapshot": {result: ubig, fn: func(ctx context.Context) (any, error) {
			v, ok := viewOf(ctx)
			if !ok {
				return nil, errNoSnapshot
			}
			return v.ts, nil
		}},
	}
	for name, f := range fns {
		if err := duckdb.RegisterScalarUDF(e.admin, name, f); err != nil {
			return fmt.Errorf("query: register %s: %w", name, err)
		}
	}
	for name, f := range sessionFunctions {
		if err := duckdb.RegisterScalarUDF(e.admin, name, f); err != nil {
			return fmt.Errorf("query: register %s: %w", name, err)
		}
	}
	if err := duckdb.RegisterTableUDF(e.admin, "retina_lookup", e.lookupFunction()); err != nil {
		return fmt.Errorf("query: register retina_lookup: %w", err)
	}
	if err := duckdb.RegisterTableUDF(e.admin, "retina_settings", settingsFunction()); err != nil {
		return fmt.Errorf("query: register retina_settings: %w", err)
	}
	return nil
}

// syncViews makes one view per catalog table, SELECT * FROM
// retina_scan(name), and describes the tables in the PostgreSQL catalogs.
func (e *Engine) syncViews(ctx context.Context) error {
	snap := e.cfg.Catalog.Snapshot()
	e.viewsMu.Lock()
	defer e.viewsMu.Unlock()
	if e.viewsAt == snap.Version() && e.viewsAt != 0 {
		return nil
	}
	// Most catalog changes are files coming and going (every flush): the
	// views and the PostgreSQL catalogs follow the tables' definitions only.
	var fp strings.Builder
	for _, t := range snap.Tables() {
		fmt.Fprintf(&fp, "%d:%s:%d:%d;", t.ID, t.Name, t.SchemaVersion, len(t.Schema.Indexes))
	}
	if fp.String() == e.viewsOf && e.viewsAt != 0 {
		e.viewsAt = snap.Version()
		return nil
	}
	// One transaction: a session reading the catalogs meanwhile sees them
	// before or after, never half refilled.
	if _, err := e.admin.ExecContext(ctx, "BEGIN TRANSACTION"); err != nil {
		return fmt.Errorf("query: refresh the views: %w", err)
	}
	if err := e.refreshViews(ctx, snap); err != nil {
		e.admin.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return err
	}
	if _, err := e.admin.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("query: refresh the views: %w", err)
	}
	e.viewsAt, e.viewsOf = snap.Version(), fp.String()
	return nil
}

// refreshViews rewrites the views and catalogs for snap's tables.
func (e *Engine) refreshViews(ctx context.Context, snap *catalog.Snapshot) error {
	want := map[string]bool{}
	schemas := map[string]bool{userSchema: true}
	for _, t := range snap.Tables() {
		name := strings.ToLower(t.Name)
		want[name] = true
		schema, table := catalog.SplitTableName(t.Name)
		if !schemas[schema] {
			if _, err := e.admin.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+dbName+"."+quoteIdent(schema)); err != nil {
				return fmt.Errorf("query: schema %s for table %s: %w", schema, t.Name, err)
			}
			schemas[schema] = true
		}
		body := "SELECT * FROM retina_scan(" + quoteLiteral(t.Name) + ")"
		if e.cfg.LakeDir != "" {
			var err error
			if body, err = nativeViewSQL(t); err != nil {
				return err
			}
		}
		q := fmt.Sprintf("CREATE OR REPLACE VIEW %s.%s.%s AS %s", dbName, quoteIdent(schema), quoteIdent(table), body)
		if _, err := e.admin.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("query: view for %s: %w", t.Name, err)
		}
	}
	for name := range e.views {
		if !want[name] {
			schema, table := catalog.SplitTableName(name)
			if _, err := e.admin.ExecContext(ctx, "DROP VIEW IF EXISTS "+dbName+"."+quoteIdent(schema)+"."+quoteIdent(table)); err != nil {
				return err
			}
		}
	}
	if err := fillCatalogs(ctx, e.admin, snap.Tables()); err != nil {
		return err
	}
	e.views = want
	return nil
}

func quoteIdent(s string) string   { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// Stats counts the engine's work.
type Stats struct {
	Statements        uint64
	RowsRead, RowsOut int64
	// PointLookups went through the index; PointLookupScans had to scan
	// (a checkpointed view, a row moved meanwhile).
	PointLookups, PointLookupScans uint64
	// NativeFiles were read by DuckDB's Parquet reader (native.go), each
	// counted once per statement and table.
	NativeFiles uint64
}

// Stats returns the counters.
func (e *Engine) Stats() Stats {
	return Stats{Statements: e.statements.Load(), RowsRead: e.rowsRead.Load(), RowsOut: e.rowsOut.Load(),
		PointLookups: e.lookups.Load(), PointLookupScans: e.lookupScans.Load(), NativeFiles: e.nativeFiles.Load()}
}

// Close shuts DuckDB down and ends the history's pins.
func (e *Engine) Close() error {
	e.closeHistory(context.Background())
	if e.admin != nil {
		e.admin.Close()
	}
	err := e.db.Close()
	if e.scratch != "" {
		os.RemoveAll(e.scratch)
	}
	return err
}

// allowLake lets DuckDB read the lake's directory and the engine's empty
// files, and nothing else: SQL clients cannot reach other files, change
// the settings, or load extensions.
func (e *Engine) allowLake(ctx context.Context) error {
	dir := e.cfg.ScratchDir
	var err error
	if dir == "" {
		dir, err = os.MkdirTemp("", "retina-query-")
	} else if err = os.RemoveAll(dir); err == nil {
		err = os.MkdirAll(dir, 0o700)
	}
	if err != nil {
		return fmt.Errorf("query: a directory for the native scan's empty files: %w", err)
	}
	e.scratch = dir
	allowed := quoteLiteral(strings.TrimSuffix(e.cfg.LakeDir, "/")+"/") + ", " + quoteLiteral(dir+"/")
	for _, q := range []string{
		// Lake objects never change once written: every statement can
		// reuse their footers.
		"SET GLOBAL parquet_metadata_cache = true",
		"SET GLOBAL allowed_directories = [" + allowed + "]",
		"SET GLOBAL enable_external_access = false",
		"SET GLOBAL lock_configuration = true",
	} {
		if _, err := e.admin.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("query: %s: %w", q, err)
		}
	}
	return nil
}

// Session is one client's connection: its own DuckDB connection and, in an
// explicit read transaction, its snapshot. Not safe for concurrent use.
type Session struct {
	e    *Engine
	conn *duckdb.Conn
	tx   *readView // the snapshot between BEGIN and COMMIT
	// reading is the snapshot the session reads at now (a statement's or
	// its transaction's), for observers in other goroutines.
	reading  atomic.Pointer[readView]
	settings *Settings
	cursors  map[string]*cursor      // DECLAREd and not yet closed
	failed   bool                    // a statement of the transaction failed: only its end is taken
	helpers  map[string]*duckdb.Stmt // the session's own queries (json_serialize_sql), kept prepared
}

// NewSession opens a session.
func (e *Engine) NewSession(ctx context.Context) (*Session, error) {
	dc, err := e.connector.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("query: new session: %w", err)
	}
	c, ok := dc.(*duckdb.Conn)
	if !ok {
		dc.Close()
		return nil, fmt.Errorf("query: new session: unexpected connection type %T", dc)
	}
	return &Session{e: e, conn: c, settings: newSettings(e.cfg.IdleInTransactionTimeout)}, nil
}

// Settings are the session's run-time parameters (SET, RESET, SHOW).
func (s *Session) Settings() *Settings { return s.settings }

// InTransaction reports an explicit read transaction in progress.
func (s *Session) InTransaction() bool { return s.tx != nil }

// Fail marks the transaction in progress failed, as an error in it does
// in PostgreSQL: until ROLLBACK (or COMMIT, which then rolls back) every
// statement is refused with SQLSTATE 25P02.
func (s *Session) Fail() {
	if s.tx != nil {
		s.failed = true
	}
}

// Failed reports a failed transaction in progress.
func (s *Session) Failed() bool { return s.tx != nil && s.failed }

// errAborted refuses statements in a failed transaction.
var errAborted = &Error{Code: "25P02", Err: errors.New("current transaction is aborted, commands ignored until end of transaction block")}

// Close ends the session and any snapshot it holds.
func (s *Session) Close() error {
	s.closeCursors()
	for _, st := range s.helpers {
		st.Close()
	}
	if s.tx != nil {
		s.reading.CompareAndSwap(s.tx, nil)
		s.e.endView(context.Background(), s.tx)
		s.tx = nil
	}
	return s.conn.Close()
}

// Column describes a result column.
type Column struct {
	Name string
	Type Type
}

// Result is a statement's outcome: rows to read, or just a command tag.
// Close must be called; it releases the statement's snapshot.
type Result struct {
	Columns []Column
	Tag     string // e.g. SELECT, BEGIN, COMMIT; "" for an empty statement
	rows    driver.Rows
	static  [][]any // rows computed here (SHOW), when rows is nil
	buf     []driver.Value
	cur     []any
	n       int
	err     error
	end     func()
	once    sync.Once
}

// Next advances to the next row.
func (r *Result) Next() bool {
	if r.err != nil {
		return false
	}
	if r.rows == nil {
		if r.n >= len(r.static) {
			return false
		}
		r.cur = r.static[r.n]
		r.n++
		return true
	}
	if r.buf == nil {
		r.buf = make([]driver.Value, len(r.Columns))
	}
	ok, err := fetch(r.rows, r.buf)
	if err != nil || !ok {
		r.err = err
		return false
	}
	for i, v := range r.buf {
		if r.Columns[i].Type.Kind == TypeJSON && v != nil {
			v = jsonText(v) // the driver hands JSON over decoded
		}
		r.cur[i] = v
	}
	r.n++
	return true
}

// Values is the current row; the slice is the caller's.
func (r *Result) Values() ([]any, error) {
	return slices.Clone(r.cur), nil
}

// Rows is how many rows Next returned.
func (r *Result) Rows() int { return r.n }

// Err is the error that ended the rows, if any.
func (r *Result) Err() error { return r.err }

// Close ends the result and the statement's snapshot. It is idempotent.
func (r *Result) Close() error {
	var err error
	r.once.Do(func() {
		if r.rows != nil {
			err = r.rows.Close()
		}
		if r.end != nil {
			r.end()
		}
	})
	return err
}

// Run prepares and executes one statement.
func (s *Session) Run(ctx context.Context, text string, args ...any) (*Result, error) {
	st, err := s.Prepare(ctx, text)
	if err != nil {
		return nil, err
	}
	res, err := s.Execute(ctx, st, args)
	if err != nil {
		st.Close()
		return nil, err
	}
	end := res.end
	res.end = func() {
		if end != nil {
			end()
		}
		st.Close()
	}
	return res, nil
}

// setting runs a SET, RESET or SHOW of a parameter.
func (s *Session) setting(st settingStmt) (*Result, error) {
	cols := s.settingColumns(st)
	switch {
	case st.verb == "SHOW" && strings.EqualFold(st.name, "all"):
		res := &Result{Tag: "SHOW", Columns: cols}
		for _, kv := range s.settings.All() {
			res.static = append(res.static, []any{kv[0], kv[1]})
		}
		return res, nil
	case st.verb == "SHOW":
		v, ok := s.settings.Get(st.name)
		if !ok {
			return nil, fmt.Errorf("%w: %w %q", ErrSetting, ErrUnknownSetting, st.name)
		}
		return &Result{Tag: "SHOW", Columns: cols, static: [][]any{{v}}}, nil
	case st.verb == "RESET" || st.def:
		if err := s.settings.Reset(st.name); err != nil {
			return nil, err
		}
		return &Result{Tag: st.verb}, nil
	}
	if err := s.settings.Set(st.name, st.value); err != nil {
		return nil, err
	}
	return &Result{Tag: "SET"}, nil
}

// beginView starts a view at the current snapshot, or at retina.as_of.
func (s *Session) beginView(ctx context.Context) (*readView, error) {
	if at, _ := s.settings.Get(asOfSetting); at != "" {
		return s.e.viewAsOf(ctx, at)
	}
	return s.e.beginView(ctx)
}

// snapshot is the session's transaction view, or a new one for this
// statement with the function that ends it.
func (s *Session) snapshot(ctx context.Context) (*readView, func(), error) {
	if s.tx != nil {
		return s.tx, func() {}, nil
	}
	v, err := s.beginView(ctx)
	if err != nil {
		return nil, nil, err
	}
	s.reading.Store(v)
	return v, func() {
		s.reading.CompareAndSwap(v, nil)
		if err := s.e.endView(ctx, v); err != nil {
			s.e.log.Error("ending a query snapshot failed", "err", err)
		}
	}, nil
}

// Snapshot is the snapshot the session reads at now, a running
// statement's or its open transaction's, and when it was taken; false
// when it reads none. Safe to call from any goroutine.
func (s *Session) Snapshot() (ts uint64, taken time.Time, ok bool) {
	v := s.reading.Load()
	if v == nil {
		return 0, time.Time{}, false
	}
	return v.ts, v.began, true
}

func readOnly(st *duckdb.Stmt) error {
	typ, err := st.StatementType()
	if err != nil {
		return err
	}
	switch typ {
	case duckdb.STATEMENT_TYPE_SELECT, duckdb.STATEMENT_TYPE_EXPLAIN, duckdb.STATEMENT_TYPE_PRAGMA:
		return nil
	}
	return ErrReadOnly
}

// firstWord is the statement's first keyword, upper-cased, comments skipped.
func firstWord(stmt string) string {
	s := strings.TrimSpace(stripLeadingComments(stmt))
	end := strings.IndexFunc(s, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') })
	if end < 0 {
		end = len(s)
	}
	return strings.ToUpper(s[:end])
}

func stripLeadingComments(s string) string {
	for {
		s = strings.TrimSpace(s)
		switch {
		case strings.HasPrefix(s, "--"):
			i := strings.IndexByte(s, '\n')
			if i < 0 {
				return ""
			}
			s = s[i+1:]
		case strings.HasPrefix(s, "/*"):
			i := strings.Index(s, "*/")
			if i < 0 {
				return ""
			}
			s = s[i+2:]
		default:
			return s
		}
	}
}
