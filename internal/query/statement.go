package query

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/duckdb/duckdb-go/v2"
)

// stmtKind is what executing a statement does.
type stmtKind uint8

const (
	stmtQuery       stmtKind = iota // runs in DuckDB at a snapshot
	stmtEmpty                       // nothing but blanks and comments
	stmtBegin                       // BEGIN, START TRANSACTION
	stmtCommit                      // COMMIT, END
	stmtRollback                    // ROLLBACK, ABORT
	stmtSetting                     // SET, RESET, SHOW of a parameter
	stmtWait                        // SELECT retina_wait_lsn(…) or retina_wait_mysql(…)
	stmtDeclare                     // DECLARE name CURSOR FOR query
	stmtFetch                       // FETCH or MOVE
	stmtCloseCursor                 // CLOSE name
	stmtSavepoint                   // SAVEPOINT or RELEASE: nothing to keep in a read-only transaction
	stmtRollbackTo                  // ROLLBACK TO SAVEPOINT: the transaction goes on
)

// Statement is one prepared statement, described in engine-neutral terms:
// the types of its placeholders and of its result's columns. DuckDB
// prepares a query once, here; every execution reuses that plan. A
// statement belongs to its session and is closed with Close.
type Statement struct {
	Text    string
	Params  []Type   // $1, $2, …
	Columns []Column // nil: the statement returns no rows
	// Copy is set for COPY … TO STDOUT: the rows go out in its format.
	Copy *CopyOut

	sess    *Session
	plan    string // the SQL DuckDB plans: Text with catalog references rewritten
	kind    stmtKind
	setting settingStmt
	wait    waitCall
	// DECLARE, FETCH and CLOSE: the cursor, the declared query, the fetch;
	// SAVEPOINT and RELEASE: the tag, in cursor.
	cursor    string
	innerText string
	fetch     fetchCall
	duck      *duckdb.Stmt
	busy      bool // duck's result is still open
	closing   bool // Close came while busy: the result's end closes duck
}

// Empty reports a statement of nothing but blanks and comments.
func (st *Statement) Empty() bool { return st.kind == stmtEmpty }

// Close releases the statement's plan, once a result still open on it
// (a suspended portal's) is closed.
func (st *Statement) Close() error {
	if st.busy {
		st.closing = true
		return nil
	}
	if st.duck == nil {
		return nil
	}
	err := st.duck.Close()
	st.duck = nil
	return err
}

// Prepare parses and plans one statement. Transaction control, SET, RESET
// and SHOW of parameters and retina_wait_lsn are handled by the session;
// anything else is planned by DuckDB and refused unless it only reads.
func (s *Session) Prepare(ctx context.Context, text string) (*Statement, error) {
	st := &Statement{Text: text, sess: s}
	word := firstWord(text)
	if s.Failed() && word != "ROLLBACK" && word != "ABORT" && word != "COMMIT" && word != "END" && word != "RELEASE" {
		return nil, errAborted
	}
	switch word {
	case "":
		if strings.Trim(stripLeadingComments(text), "; \t\r\n") == "" {
			st.kind = stmtEmpty
			return st, nil
		}
	case "BEGIN", "START":
		st.kind = stmtBegin
		return st, nil
	case "COMMIT", "END":
		st.kind = stmtCommit
		return st, nil
	case "ROLLBACK", "ABORT":
		if words := strings.Fields(strings.ToUpper(stripLeadingComments(text))); len(words) > 1 && words[1] == "TO" {
			st.kind = stmtRollbackTo
			return st, nil
		}
		st.kind = stmtRollback
		return st, nil
	case "SAVEPOINT", "RELEASE":
		st.kind = stmtSavepoint
		st.cursor = word // the tag
		return st, nil
	case "SET", "RESET", "SHOW":
		set, ok, err := parseSetting(text, func(name string) bool { _, ok := s.settings.lookup(name); return ok })
		if err != nil {
			return nil, err
		}
		if ok {
			st.kind, st.setting = stmtSetting, set
			st.Columns = s.settingColumns(set)
			return st, nil
		}
	case "COPY":
		q, out, ok, err := parseCopy(text)
		if err != nil {
			return nil, err
		}
		if ok {
			inner, err := s.Prepare(ctx, q)
			if err != nil {
				return nil, err
			}
			if inner.kind != stmtQuery {
				inner.Close()
				return nil, errCopy("only a query can be copied out")
			}
			inner.Text, inner.Copy = text, &out
			return inner, nil
		}
	case "DECLARE":
		if m := declareStmt.FindStringSubmatch(text); m != nil {
			if strings.EqualFold(m[3], "with") {
				return nil, &Error{Code: "0A000", Err: fmt.Errorf("DECLARE … WITH HOLD: a cursor ends with its transaction here, as its snapshot does")}
			}
			inner, err := s.Prepare(ctx, m[4])
			if err != nil {
				return nil, err
			}
			inner.Close()
			if inner.kind != stmtQuery || inner.Copy != nil {
				return nil, &Error{Code: "42601", Err: fmt.Errorf("DECLARE CURSOR: a cursor is declared for a query")}
			}
			st.kind, st.cursor, st.innerText, st.Params = stmtDeclare, cursorName(m[1]), m[4], inner.Params
			return st, nil
		}
	case "FETCH", "MOVE":
		f, ok, err := parseFetch(text)
		if err != nil {
			return nil, err
		}
		if ok {
			c, open := s.cursors[f.name]
			if !open {
				return nil, &Error{Code: "34000", Err: fmt.Errorf("cursor %q does not exist", f.name)}
			}
			st.kind, st.fetch = stmtFetch, f
			if !f.move {
				st.Columns = c.res.Columns
			}
			return st, nil
		}
	case "CLOSE":
		if m := closeStmt.FindStringSubmatch(text); m != nil {
			st.kind, st.cursor = stmtCloseCursor, cursorName(m[1])
			return st, nil
		}
	case "SELECT":
		if w, ok := parseWait(text); ok {
			st.kind, st.wait, st.Columns = stmtWait, w, waitColumns
			if w.isMySQL {
				st.Columns = waitMySQLColumns
			}
			return st, nil
		}
	}
	if err := s.e.syncViews(ctx); err != nil {
		return nil, err
	}
	ctx = withSettings(ctx, s.settings)
	if !mayNeedRewrite(text) && !mayBePointLookup(text) && s.searchPath() == nil {
		// The common case plans the text as written, and parses it only if
		// a column needs PostgreSQL's name.
		duck, err := s.prepareDuck(ctx, text)
		if err != nil {
			return nil, err
		}
		st.plan, st.duck = text, duck
		if err := st.describe(); err != nil {
			duck.Close()
			return nil, err
		}
		if plainNames(st.Columns) {
			return st, nil
		}
		p, err := s.parse(ctx, text, false)
		if err != nil {
			duck.Close()
			return nil, err
		}
		st.rename(p, text)
		return st, nil
	}
	p, err := s.parse(ctx, text, true)
	if err != nil {
		return nil, err
	}
	if p.describe != p.text {
		// A point lookup's plan cannot type its result before execution:
		// the plan without it describes the statement.
		d, err := s.prepareDuck(ctx, p.describe)
		if err != nil {
			return nil, err
		}
		st.duck = d
		err = st.describe()
		d.Close()
		if err != nil {
			return nil, err
		}
	}
	st.plan = p.text
	duck, err := s.prepareDuck(ctx, st.plan)
	if err != nil {
		return nil, err
	}
	st.duck = duck
	if p.describe == p.text {
		if err := st.describe(); err != nil {
			duck.Close()
			return nil, err
		}
	}
	st.rename(p, text)
	return st, nil
}

// rename gives the columns PostgreSQL's names, where it names them
// otherwise than DuckDB.
func (st *Statement) rename(p parsed, text string) {
	if p.stmt == nil {
		return
	}
	for i, name := range pgColumnNames(p.stmt, text, len(st.Columns)) {
		if name != "" {
			st.Columns[i].Name = name
		}
	}
}

// errMultiple refuses a text of several statements where one is prepared.
var errMultiple = &Error{Code: "42601", Err: errors.New("cannot insert multiple commands into a prepared statement")}

// prepareDuck plans one statement in DuckDB and refuses it unless it only
// reads. The driver's Prepare takes exactly one statement, as DuckDB's
// own parser splits the text (PrepareContext would run all but the last
// of several, before any check).
func (s *Session) prepareDuck(ctx context.Context, text string) (*duckdb.Stmt, error) {
	ds, err := s.conn.Prepare(text)
	if err != nil {
		if strings.Contains(err.Error(), "multi-statement") {
			return nil, errMultiple
		}
		return nil, engineError(err)
	}
	if bindsWithSession(text) {
		// A table function that reads the session's settings binds with
		// the statement's context, which only PrepareContext passes; the
		// text is one statement, as Prepare found.
		ds.Close()
		if ds, err = s.conn.PrepareContext(ctx, text); err != nil {
			return nil, engineError(err)
		}
	}
	duck, ok := ds.(*duckdb.Stmt)
	if !ok {
		ds.Close()
		return nil, fmt.Errorf("query: unexpected statement type %T", ds)
	}
	if err := readOnly(duck); err != nil {
		duck.Close()
		return nil, err
	}
	return duck, nil
}

// bindsWithSession reports a statement that reads pg_settings.
func bindsWithSession(text string) bool {
	lower := strings.ToLower(text)
	return strings.Contains(lower, "pg_settings") || strings.Contains(lower, "retina_settings")
}

// describe reads the plan's placeholder and column types.
func (st *Statement) describe() error {
	d := st.duck
	for i := range d.NumInput() {
		t, err := d.ParamType(i + 1)
		if err != nil {
			return engineError(err)
		}
		st.Params = append(st.Params, typeOfDuck(t, nil))
	}
	n, err := d.ColumnCount()
	if err != nil {
		return engineError(err)
	}
	st.Columns = make([]Column, 0, n)
	for i := range n {
		name, err := d.ColumnName(i)
		if err != nil {
			return engineError(err)
		}
		t, err := d.ColumnType(i)
		if err != nil {
			return engineError(err)
		}
		info, err := d.ColumnTypeInfo(i)
		if err != nil {
			info = nil // the kind alone still describes the column
		}
		st.Columns = append(st.Columns, Column{Name: name, Type: typeOfDuck(t, info)})
	}
	return nil
}

// Execute runs a prepared statement with its placeholders' values.
func (s *Session) Execute(ctx context.Context, st *Statement, args []any) (*Result, error) {
	if st.sess != s {
		return nil, fmt.Errorf("query: statement %q belongs to another session", st.Text)
	}
	s.e.statements.Add(1)
	if s.Failed() && st.kind != stmtCommit && st.kind != stmtRollback && st.kind != stmtRollbackTo {
		return nil, errAborted
	}
	switch st.kind {
	case stmtSavepoint:
		if s.tx == nil {
			return nil, &Error{Code: "25P01", Err: fmt.Errorf("%s can only be used in transaction blocks", st.cursor)}
		}
		return &Result{Tag: st.cursor}, nil
	case stmtRollbackTo:
		// A read-only transaction has nothing to undo: a failed one goes
		// on, as after PostgreSQL's ROLLBACK TO (psql's ON_ERROR_ROLLBACK,
		// pgjdbc's autosave).
		if s.tx == nil {
			return nil, &Error{Code: "25P01", Err: fmt.Errorf("ROLLBACK TO SAVEPOINT can only be used in transaction blocks")}
		}
		s.failed = false
		return &Result{Tag: "ROLLBACK"}, nil
	case stmtEmpty:
		return &Result{Tag: ""}, nil
	case stmtBegin:
		if s.tx == nil {
			v, err := s.beginView(ctx)
			if err != nil {
				return nil, err
			}
			s.tx = v
			s.reading.Store(v)
		}
		return &Result{Tag: "BEGIN"}, nil
	case stmtDeclare:
		return s.declare(ctx, st, args)
	case stmtFetch:
		return s.fetch(st.fetch)
	case stmtCloseCursor:
		return s.closeCursor(st.cursor)
	case stmtCommit, stmtRollback:
		s.closeCursors() // a cursor lives no longer than its transaction
		failed := s.Failed()
		if s.tx != nil {
			s.reading.CompareAndSwap(s.tx, nil)
			err := s.e.endView(ctx, s.tx)
			s.tx, s.failed = nil, false
			if err != nil {
				return nil, err
			}
		}
		if st.kind == stmtRollback || failed {
			return &Result{Tag: "ROLLBACK"}, nil
		}
		return &Result{Tag: "COMMIT"}, nil
	case stmtSetting:
		return s.setting(st.setting)
	case stmtWait:
		return s.wait(ctx, st.wait)
	}
	if st.duck == nil {
		return nil, fmt.Errorf("query: statement %q is closed", st.Text)
	}
	if err := s.e.syncViews(ctx); err != nil {
		return nil, err
	}
	named, err := namedArgs(s.conn, args)
	if err != nil {
		return nil, err
	}
	view, end, err := s.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	// A statement whose last result is still open (a suspended portal)
	// runs this time on a plan of its own.
	duck, own := st.duck, false
	if st.busy {
		if duck, err = s.prepareDuck(withSettings(ctx, s.settings), st.plan); err != nil {
			end()
			return nil, err
		}
		own = true
	}
	rows, err := duck.QueryContext(withSettings(withView(ctx, view), s.settings), named)
	if err != nil {
		if own {
			duck.Close()
		}
		end()
		return nil, engineError(err)
	}
	if n := len(rows.Columns()); n != len(st.Columns) {
		rows.Close()
		if own {
			duck.Close()
		}
		end()
		return nil, fmt.Errorf("query: %q returned %d columns where its plan has %d; prepare it again", st.Text, n, len(st.Columns))
	}
	// DuckDB has the whole result now: the snapshot can end here, so a
	// suspended portal does not hold LWM (a transaction's view ends with
	// the transaction).
	end()
	res := &Result{Columns: st.Columns, Tag: "SELECT", rows: rows, cur: make([]any, len(st.Columns))}
	if own {
		res.end = func() { duck.Close() }
	} else {
		st.busy = true
		res.end = func() {
			st.busy = false
			if st.closing {
				st.Close()
			}
		}
	}
	return res, nil
}

// namedArgs turns placeholder values into the driver's, as database/sql
// would: the driver's own check first, the default conversion otherwise.
func namedArgs(c driver.NamedValueChecker, args []any) ([]driver.NamedValue, error) {
	out := make([]driver.NamedValue, len(args))
	for i, a := range args {
		if iv, ok := a.(Interval); ok {
			a = duckdb.Interval{Months: iv.Months, Days: iv.Days, Micros: iv.Micros}
		}
		out[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
		err := c.CheckNamedValue(&out[i])
		if errors.Is(err, driver.ErrSkip) {
			out[i].Value, err = driver.DefaultParameterConverter.ConvertValue(a)
		}
		if err != nil {
			return nil, fmt.Errorf("query: parameter $%d: %w", i+1, err)
		}
	}
	return out, nil
}

// fetch reads the next row of a DuckDB result into dst.
func fetch(rows driver.Rows, dst []driver.Value) (bool, error) {
	err := rows.Next(dst)
	if err == io.EOF {
		return false, nil
	}
	if err != nil {
		return false, engineError(err)
	}
	for i, v := range dst {
		dst[i] = neutral(v)
	}
	return true, nil
}

// settingColumns describe a SHOW's result (nil for SET and RESET).
func (s *Session) settingColumns(st settingStmt) []Column {
	if st.verb != "SHOW" {
		return nil
	}
	if strings.EqualFold(st.name, "all") {
		return []Column{{Name: "name", Type: Type{Kind: TypeText}}, {Name: "setting", Type: Type{Kind: TypeText}}}
	}
	name := strings.ToLower(st.name)
	if p, found := s.settings.lookup(st.name); found {
		name = p.name
	}
	return []Column{{Name: name, Type: Type{Kind: TypeText}}}
}
