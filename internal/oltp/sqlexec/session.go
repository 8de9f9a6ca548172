// Package sqlexec runs MySQL-dialect SQL statements against the Skeena store
// through package sqlstore: statements are parsed by vitess's parser and
// expressions evaluated by vitess's evaluation engine (MySQL semantics);
// this package plans and runs the rest (access paths over primary and
// secondary keys, nested-loop joins, grouping, ordering, limits, DML with
// index maintenance) and owns the session's transaction state.
//
// String comparison uses the binary collation (utf8mb4_bin), the order of
// the stored keys, so an index range and a filter always agree.
package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"vitess.io/vitess/go/mysql/collations"
	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
	"vitess.io/vitess/go/vt/sqlparser"
	"vitess.io/vitess/go/vt/vtenv"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/skeena"
	"github.com/retinadb/retina/internal/oltp/sqlstore"
)

// ServerVersion is the MySQL version the server reports.
const ServerVersion = "8.0.40-retina"

// Config configures an Engine.
type Config struct {
	// MemoryTables places these tables (lower-case names) in the memory
	// engine when their DDL names no engine; others go to the storage
	// engine.
	MemoryTables map[string]bool
	Logger       *slog.Logger
}

// Engine runs statements for sessions over one store.
type Engine struct {
	store     *skeena.Store
	cat       *sqlstore.Catalog
	env       *vtenv.Environment
	parser    *sqlparser.Parser
	collation collations.ID
	memTables map[string]bool
	log       *slog.Logger
}

// New makes an engine over an open store and its catalog.
func New(store *skeena.Store, cat *sqlstore.Catalog, cfg Config) (*Engine, error) {
	env, err := vtenv.New(vtenv.Options{MySQLServerVersion: ServerVersion})
	if err != nil {
		return nil, fmt.Errorf("sql engine: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	coll := env.CollationEnv().LookupByName("utf8mb4_bin")
	return &Engine{store: store, cat: cat, env: env, parser: env.Parser(), collation: coll, memTables: cfg.MemoryTables, log: cfg.Logger}, nil
}

// Env is the vitess environment (parser, collations, version).
func (e *Engine) Env() *vtenv.Environment { return e.env }

func (e *Engine) placement(table string) string {
	if e.memTables[strings.ToLower(table)] {
		return sqlstore.EngineMemory
	}
	return sqlstore.EngineStorage
}

// Session is one client connection's state: its open transaction, its
// autocommit mode and its variables. Not safe for concurrent use.
type Session struct {
	e          *Engine
	tx         *skeena.Tx
	explicit   bool // BEGIN was given (or autocommit is off)
	autocommit bool
	db         string
	iso        engine.Isolation
	nextIso    *engine.Isolation // SET TRANSACTION: the next transaction only
	userVars   map[string]sqltypes.Value
	cache      map[string]sqlparser.Statement

	// The statement running: subqueries and derived tables run in it.
	execCtx context.Context
	execTx  *skeena.Tx
	argSeq  int // names of bind variables made for subqueries
}

// NewSession starts a session in autocommit mode.
func (e *Engine) NewSession() *Session {
	return &Session{e: e, autocommit: true, iso: engine.SnapshotIsolation, userVars: map[string]sqltypes.Value{}, cache: map[string]sqlparser.Statement{}}
}

// Close rolls back an open transaction.
func (s *Session) Close() {
	if s.tx != nil {
		s.tx.Rollback()
		s.tx = nil
	}
}

// InTransaction reports whether a transaction is open.
func (s *Session) InTransaction() bool { return s.tx != nil }

// Autocommit reports the session's autocommit mode.
func (s *Session) Autocommit() bool { return s.autocommit }

// SetDatabase sets the current database (names are one namespace).
func (s *Session) SetDatabase(db string) { s.db = db }

// Parse parses one statement, caching by text (prepared statements run
// the same text again and again).
func (s *Session) Parse(query string) (sqlparser.Statement, int, error) {
	if st, ok := s.cache[query]; ok {
		return st, countArgs(st), nil
	}
	st, err := s.e.parser.Parse(query)
	if err != nil {
		return nil, 0, &Error{Code: ErParse, Msg: err.Error()}
	}
	if len(s.cache) > 1024 {
		clear(s.cache)
	}
	s.cache[query] = st
	return st, countArgs(st), nil
}

func countArgs(st sqlparser.Statement) int {
	n := 0
	_ = sqlparser.Walk(func(node sqlparser.SQLNode) (bool, error) {
		if _, ok := node.(*sqlparser.Argument); ok {
			n++
		}
		return true, nil
	}, st)
	return n
}

// Execute parses and runs one statement with bind variables (named v1,
// v2, … for '?' placeholders).
func (s *Session) Execute(ctx context.Context, query string, bind map[string]*querypb.BindVariable) (*sqltypes.Result, error) {
	st, _, err := s.Parse(query)
	if err != nil {
		return nil, toError(err)
	}
	return s.Run(ctx, st, bind)
}

// Run runs a parsed statement.
func (s *Session) Run(ctx context.Context, st sqlparser.Statement, bind map[string]*querypb.BindVariable) (res *sqltypes.Result, err error) {
	defer func() {
		// A bug in this package must cost the statement, not the server:
		// the transaction is rolled back and the client told.
		if p := recover(); p != nil {
			s.rollback()
			s.e.log.Error("sql: internal error", "statement", truncate(sqlparser.String(st), 200), "panic", p, "stack", string(debug.Stack()))
			res, err = nil, toError(errorf(ErUnknown, "internal error running %q: %v; the transaction was rolled back", truncate(sqlparser.String(st), 60), p))
		}
	}()
	res, err = s.run(ctx, st, bind)
	if err != nil {
		return nil, toError(err)
	}
	return res, nil
}

// maxAutoRetries bounds how often an autocommit statement is run again
// after a write conflict before the conflict goes to the client.
const maxAutoRetries = 10

func (s *Session) run(ctx context.Context, st sqlparser.Statement, bind map[string]*querypb.BindVariable) (*sqltypes.Result, error) {
	switch st := st.(type) {
	case *sqlparser.Begin:
		if err := s.commit(ctx); err != nil {
			return nil, err
		}
		s.begin()
		s.explicit = true
		return &sqltypes.Result{}, nil
	case *sqlparser.Commit:
		return &sqltypes.Result{}, s.commit(ctx)
	case *sqlparser.Rollback:
		s.rollback()
		return &sqltypes.Result{}, nil
	case *sqlparser.Set:
		return &sqltypes.Result{}, s.set(ctx, st, bind)
	case *sqlparser.Use:
		s.db = st.DBName.String()
		return &sqltypes.Result{}, nil
	case *sqlparser.CreateDatabase, *sqlparser.DropDatabase, *sqlparser.AlterDatabase:
		// One namespace: database names are accepted and ignored.
		return &sqltypes.Result{}, nil
	case *sqlparser.CreateTable:
		if err := s.commit(ctx); err != nil { // DDL commits implicitly, as in MySQL
			return nil, err
		}
		return &sqltypes.Result{}, s.createTable(ctx, st)
	case *sqlparser.DropTable:
		if err := s.commit(ctx); err != nil {
			return nil, err
		}
		for _, tn := range st.FromTables {
			if err := s.e.cat.Drop(ctx, tn.Name.String(), st.IfExists); err != nil {
				return nil, err
			}
		}
		return &sqltypes.Result{}, nil
	case *sqlparser.TruncateTable:
		return nil, errorf(ErUnsupported, "TRUNCATE TABLE is not supported: use DELETE FROM, which empties the table in one transaction")
	case *sqlparser.Analyze, *sqlparser.OtherAdmin:
		return &sqltypes.Result{}, nil
	case *sqlparser.Show:
		return s.show(ctx, st)
	case *sqlparser.Select:
		return s.inTx(ctx, func(tx *skeena.Tx) (*sqltypes.Result, error) {
			return s.selectStmt(ctx, tx, st, bind)
		})
	case *sqlparser.Union:
		return nil, unsupported("UNION")
	case *sqlparser.Insert:
		return s.inTx(ctx, func(tx *skeena.Tx) (*sqltypes.Result, error) {
			return s.insert(ctx, tx, st, bind)
		})
	case *sqlparser.Update:
		return s.inTx(ctx, func(tx *skeena.Tx) (*sqltypes.Result, error) {
			return s.update(ctx, tx, st, bind)
		})
	case *sqlparser.Delete:
		return s.inTx(ctx, func(tx *skeena.Tx) (*sqltypes.Result, error) {
			return s.delete(ctx, tx, st, bind)
		})
	}
	return nil, unsupported(fmt.Sprintf("the statement %q", truncate(sqlparser.String(st), 60)))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (s *Session) begin() {
	iso := s.iso
	if s.nextIso != nil {
		iso, s.nextIso = *s.nextIso, nil
	}
	s.tx = s.e.store.BeginTx(skeena.TxOptions{Isolation: iso})
}

func (s *Session) commit(ctx context.Context) error {
	s.explicit = false
	if s.tx == nil {
		return nil
	}
	tx := s.tx
	s.tx = nil
	return tx.Commit(ctx)
}

func (s *Session) rollback() {
	s.explicit = false
	if s.tx != nil {
		s.tx.Rollback()
		s.tx = nil
	}
}

// inTx runs fn in the open transaction, or in a transaction of its own that
// commits at once (autocommit). An autocommit statement that hits a write
// conflict runs again on a fresh snapshot; inside a transaction a failed
// statement rolls the whole transaction back, so nothing half-applied
// stays (a conflict must be retried by the client anyway).
func (s *Session) inTx(ctx context.Context, fn func(*skeena.Tx) (*sqltypes.Result, error)) (*sqltypes.Result, error) {
	if s.tx != nil || !s.autocommit {
		if s.tx == nil {
			s.begin()
			s.explicit = true
		}
		s.execCtx, s.execTx = ctx, s.tx
		res, err := fn(s.tx)
		s.execCtx, s.execTx = nil, nil
		if err != nil {
			s.rollback()
		}
		return res, err
	}
	for attempt := 0; ; attempt++ {
		s.begin()
		s.execCtx, s.execTx = ctx, s.tx
		res, err := fn(s.tx)
		s.execCtx, s.execTx = nil, nil
		if err == nil {
			err = s.commit(ctx)
		} else {
			s.rollback()
		}
		if err == nil || !engine.Retryable(err) || attempt >= maxAutoRetries || ctx.Err() != nil {
			return res, err
		}
		var ue *skeena.UnacknowledgedError
		if errors.As(err, &ue) {
			return res, err
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Microsecond)
	}
}
