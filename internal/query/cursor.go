package query

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// SQL cursors (DECLARE, FETCH, CLOSE), which drivers use for results too
// large to take at once: psycopg2's named cursors, for one. A cursor is a
// query run at the transaction's snapshot whose rows are handed out in
// portions; it ends with CLOSE or with its transaction (WITH HOLD is not
// offered: the snapshot ends with the transaction).

var (
	declareStmt = regexp.MustCompile(`(?is)^\s*declare\s+("(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)\s+((?:binary\s+|insensitive\s+|asensitive\s+|no\s+scroll\s+|scroll\s+)*)cursor\s+(?:(with|without)\s+hold\s+)?for\s+(.+?)\s*;?\s*$`)
	fetchStmt   = regexp.MustCompile(`(?is)^\s*(fetch|move)\s+(?:(next|forward\s+all|forward\s+\d+|forward|all|\d+)\s+)?(?:from\s+|in\s+)?("(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)\s*;?\s*$`)
	closeStmt   = regexp.MustCompile(`(?is)^\s*close\s+("(?:[^"]|"")+"|[a-z_][a-z0-9_$]*|all)\s*;?\s*$`)
)

// cursorName folds an identifier as PostgreSQL does.
func cursorName(s string) string {
	if strings.HasPrefix(s, `"`) {
		return strings.ReplaceAll(s[1:len(s)-1], `""`, `"`)
	}
	return strings.ToLower(s)
}

// cursor is an open SQL cursor: its query's plan and result.
type cursor struct {
	stmt *Statement
	res  *Result
}

func (c *cursor) close() {
	c.res.Close()
	c.stmt.Close()
}

// fetchCall is a parsed FETCH or MOVE.
type fetchCall struct {
	name  string
	count int // rows at most
	move  bool
}

func parseFetch(text string) (fetchCall, bool, error) {
	m := fetchStmt.FindStringSubmatch(text)
	if m == nil {
		return fetchCall{}, false, nil
	}
	f := fetchCall{name: cursorName(m[3]), count: 1, move: strings.EqualFold(m[1], "move")}
	dir := strings.ToLower(strings.Join(strings.Fields(m[2]), " "))
	switch {
	case dir == "" || dir == "next" || dir == "forward":
	case dir == "all" || dir == "forward all":
		f.count = math.MaxInt
	default:
		n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(dir, "forward")))
		if err != nil || n < 0 {
			return f, true, &Error{Code: "42601", Err: fmt.Errorf("FETCH: bad row count %q", m[2])}
		}
		f.count = n
	}
	return f, true, nil
}

// declare runs a DECLARE CURSOR.
func (s *Session) declare(ctx context.Context, st *Statement, args []any) (*Result, error) {
	if s.tx == nil {
		return nil, &Error{Code: "25P01", Err: fmt.Errorf("DECLARE CURSOR can only be used in transaction blocks")}
	}
	if _, dup := s.cursors[st.cursor]; dup {
		return nil, &Error{Code: "42P03", Err: fmt.Errorf("cursor %q already exists", st.cursor)}
	}
	inner, err := s.Prepare(ctx, st.innerText)
	if err != nil {
		return nil, err
	}
	if inner.kind != stmtQuery || inner.Copy != nil {
		inner.Close()
		return nil, &Error{Code: "42601", Err: fmt.Errorf("DECLARE CURSOR: a cursor is declared for a query")}
	}
	res, err := s.Execute(ctx, inner, args)
	if err != nil {
		inner.Close()
		return nil, err
	}
	if s.cursors == nil {
		s.cursors = map[string]*cursor{}
	}
	s.cursors[st.cursor] = &cursor{stmt: inner, res: res}
	return &Result{Tag: "DECLARE CURSOR"}, nil
}

// fetch hands out the next rows of a cursor.
func (s *Session) fetch(f fetchCall) (*Result, error) {
	c, ok := s.cursors[f.name]
	if !ok {
		return nil, &Error{Code: "34000", Err: fmt.Errorf("cursor %q does not exist", f.name)}
	}
	out := &Result{Tag: "FETCH", Columns: c.res.Columns}
	if f.move {
		out.Tag, out.Columns = "MOVE", nil
	}
	n := 0
	for n < f.count && c.res.Next() {
		if !f.move {
			vals, _ := c.res.Values()
			out.static = append(out.static, vals)
		}
		n++
	}
	if err := c.res.Err(); err != nil {
		return nil, err
	}
	if f.move {
		out.Tag = fmt.Sprintf("MOVE %d", n)
	}
	return out, nil
}

// closeCursor runs CLOSE name or CLOSE ALL.
func (s *Session) closeCursor(name string) (*Result, error) {
	if name == "all" {
		s.closeCursors()
		return &Result{Tag: "CLOSE CURSOR"}, nil
	}
	c, ok := s.cursors[name]
	if !ok {
		return nil, &Error{Code: "34000", Err: fmt.Errorf("cursor %q does not exist", name)}
	}
	c.close()
	delete(s.cursors, name)
	return &Result{Tag: "CLOSE CURSOR"}, nil
}

// closeCursors ends every cursor, as the end of a transaction does.
func (s *Session) closeCursors() {
	for name, c := range s.cursors {
		c.close()
		delete(s.cursors, name)
	}
}
