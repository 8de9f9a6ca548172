package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
	"vitess.io/vitess/go/vt/sqlparser"

	"github.com/retinadb/retina/internal/oltp/skeena"
	"github.com/retinadb/retina/internal/oltp/sqlstore"
)

func (s *Session) targetTable(te sqlparser.TableExpr) (*sqlstore.Table, error) {
	at, ok := te.(*sqlparser.AliasedTableExpr)
	if !ok {
		return nil, unsupported("a statement over several tables")
	}
	tn, ok := at.Expr.(sqlparser.TableName)
	if !ok {
		return nil, unsupported("a subquery as the target")
	}
	return s.e.cat.Table(tn.Name.String())
}

// defaultValue is column c's value when an INSERT does not give one.
func (s *Session) defaultValue(t *sqlstore.Table, c *sqlstore.Column) (sqltypes.Value, error) {
	if !c.HasDefault {
		if c.Nullable {
			return sqltypes.NULL, nil
		}
		return sqltypes.NULL, errorf(ErNoDefault, "table %s: field '%s' doesn't have a default value", t.Name, c.Name)
	}
	e, err := s.e.parser.ParseExpr(c.Default)
	if err != nil {
		return sqltypes.NULL, fmt.Errorf("table %s, column %s: default %q: %w", t.Name, c.Name, c.Default, err)
	}
	return s.constant(e, nil)
}

func (s *Session) insert(ctx context.Context, tx *skeena.Tx, st *sqlparser.Insert, bind map[string]*querypb.BindVariable) (*sqltypes.Result, error) {
	if st.Action == sqlparser.ReplaceAct {
		return nil, unsupported("REPLACE")
	}
	if len(st.OnDup) > 0 {
		return nil, unsupported("INSERT … ON DUPLICATE KEY UPDATE")
	}
	t, err := s.targetTable(st.Table)
	if err != nil {
		return nil, err
	}
	values, ok := st.Rows.(sqlparser.Values)
	if !ok {
		return nil, unsupported("INSERT … SELECT")
	}
	// Positions of the given columns; -1 for columns not given.
	given := make([]int, len(t.Columns))
	for i := range given {
		given[i] = -1
	}
	if len(st.Columns) == 0 {
		for i := range given {
			given[i] = i
		}
	} else {
		for k, col := range st.Columns {
			i := t.ColumnIndex(col.String())
			if i < 0 {
				return nil, errorf(ErBadField, "unknown column '%s' in table %s", col.String(), t.Name)
			}
			if given[i] >= 0 {
				return nil, errorf(ErNonUnique, "column '%s' is given twice", col.String())
			}
			given[i] = k
		}
	}
	want := len(st.Columns)
	if want == 0 {
		want = len(t.Columns)
	}
	env := s.env(bind)
	rows := sqlstore.Rows{Tx: tx, Cat: s.e.cat}
	var n uint64
	for ri, tuple := range values {
		if len(tuple) != want {
			return nil, errorf(ErValueCount, "table %s: column count doesn't match value count at row %d", t.Name, ri+1)
		}
		vals := make([]any, len(t.Columns))
		for i := range t.Columns {
			c := &t.Columns[i]
			var v sqltypes.Value
			if k := given[i]; k >= 0 {
				if _, isDefault := tuple[k].(*sqlparser.Default); isDefault {
					if v, err = s.defaultValue(t, c); err != nil {
						return nil, err
					}
				} else if pv, ok := plainValue(tuple[k], bind); ok {
					v = pv
				} else {
					ce, err := s.compile(tuple[k], &scope{})
					if err != nil {
						return nil, err
					}
					if v, err = ce.eval(env); err != nil {
						return nil, err
					}
				}
			} else if v, err = s.defaultValue(t, c); err != nil {
				return nil, err
			}
			if vals[i], err = sqlstore.ToStored(t, c, v); err != nil {
				return nil, fmt.Errorf("row %d: %w", ri+1, err)
			}
		}
		if err := rows.Insert(ctx, t, vals); err != nil {
			var dup *sqlstore.DuplicateKeyError
			if bool(st.Ignore) && errors.As(err, &dup) {
				continue
			}
			return nil, err
		}
		n++
	}
	return &sqltypes.Result{RowsAffected: n}, nil
}

// plainValue is the value of a VALUES item that is a placeholder, NULL,
// an integer or a string literal, taken without the evaluation engine:
// compiling each item was most of an OLTP insert's cost. ok is false for
// anything else, which the engine evaluates.
func plainValue(e sqlparser.Expr, bind map[string]*querypb.BindVariable) (v sqltypes.Value, ok bool) {
	switch e := e.(type) {
	case *sqlparser.NullVal:
		return sqltypes.NULL, true
	case *sqlparser.Argument:
		bv, found := bind[e.Name]
		if !found {
			return sqltypes.NULL, false
		}
		v, err := sqltypes.BindVariableToValue(bv)
		return v, err == nil
	case *sqlparser.Literal:
		switch e.Type {
		case sqlparser.IntVal:
			if n, err := strconv.ParseInt(e.Val, 10, 64); err == nil {
				return sqltypes.NewInt64(n), true
			}
		case sqlparser.StrVal:
			return sqltypes.NewVarChar(e.Val), true
		}
	}
	return sqltypes.NULL, false
}

// matching reads the rows of a single-table UPDATE or DELETE.
func (s *Session) matching(ctx context.Context, tx *skeena.Tx, t *sqlstore.Table, alias string, where *sqlparser.Where, order sqlparser.OrderBy, limit *sqlparser.Limit, bind map[string]*querypb.BindVariable) (*scope, []joinResult, error) {
	if len(order) > 0 {
		return nil, nil, unsupported("ORDER BY in UPDATE or DELETE")
	}
	sc := &scope{sources: []*source{{t: t, name: alias}}}
	var conj []sqlparser.Expr
	if where != nil {
		conj = sqlparser.SplitAndExpression(nil, where.Expr)
	}
	n, _, err := s.limits(limit, bind)
	if err != nil {
		return nil, nil, err
	}
	push := 0
	if n >= 0 {
		push = n
	}
	got, err := s.join(ctx, tx, sc, conj, bind, false, push)
	if err != nil {
		return nil, nil, err
	}
	if n >= 0 && len(got) > n {
		got = got[:n]
	}
	return sc, got, nil
}

func aliasOf(te sqlparser.TableExpr, t *sqlstore.Table) string {
	if at, ok := te.(*sqlparser.AliasedTableExpr); ok && !at.As.IsEmpty() {
		return at.As.String()
	}
	return t.Name
}

func (s *Session) update(ctx context.Context, tx *skeena.Tx, st *sqlparser.Update, bind map[string]*querypb.BindVariable) (*sqltypes.Result, error) {
	if len(st.TableExprs) != 1 || st.With != nil {
		return nil, unsupported("UPDATE over several tables")
	}
	t, err := s.targetTable(st.TableExprs[0])
	if err != nil {
		return nil, err
	}
	sc, matches, err := s.matching(ctx, tx, t, lowerName(aliasOf(st.TableExprs[0], t)), st.Where, st.OrderBy, st.Limit, bind)
	if err != nil {
		return nil, err
	}
	type set struct {
		col int
		e   *compiled
	}
	sets := make([]set, len(st.Exprs))
	for i, ue := range st.Exprs {
		_, p, err := sc.lookup(ue.Name)
		if err != nil {
			return nil, err
		}
		ce, err := s.compile(ue.Expr, sc)
		if err != nil {
			return nil, err
		}
		sets[i] = set{col: p, e: ce}
	}
	env := s.env(bind)
	rows := sqlstore.Rows{Tx: tx, Cat: s.e.cat}
	var matched, changed uint64
	for _, m := range matches {
		matched++
		env.Row = m.vals
		newVals := append([]any(nil), m.rows[0].Vals...)
		differs := false
		// Assignments apply left to right; later ones see earlier ones.
		for _, a := range sets {
			v, err := a.e.eval(env)
			if err != nil {
				return nil, err
			}
			x, err := sqlstore.ToStored(t, &t.Columns[a.col], v)
			if err != nil {
				return nil, err
			}
			newVals[a.col] = x
			m.vals[a.col] = sqlstore.FromStored(&t.Columns[a.col], x)
		}
		for i := range newVals {
			if !sameValue(newVals[i], m.rows[0].Vals[i]) {
				differs = true
				break
			}
		}
		if !differs {
			continue
		}
		if err := rows.Update(ctx, t, m.rows[0], newVals); err != nil {
			return nil, err
		}
		changed++
	}
	return &sqltypes.Result{RowsAffected: changed, Info: fmt.Sprintf("Rows matched: %d  Changed: %d  Warnings: 0", matched, changed)}, nil
}

func sameValue(a, b any) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if ab, ok := a.([]byte); ok {
		bb, ok := b.([]byte)
		return ok && string(ab) == string(bb)
	}
	return a == b
}

func (s *Session) delete(ctx context.Context, tx *skeena.Tx, st *sqlparser.Delete, bind map[string]*querypb.BindVariable) (*sqltypes.Result, error) {
	if len(st.TableExprs) != 1 || len(st.Targets) > 0 || st.With != nil {
		return nil, unsupported("DELETE over several tables")
	}
	t, err := s.targetTable(st.TableExprs[0])
	if err != nil {
		return nil, err
	}
	_, matches, err := s.matching(ctx, tx, t, lowerName(aliasOf(st.TableExprs[0], t)), st.Where, st.OrderBy, st.Limit, bind)
	if err != nil {
		return nil, err
	}
	rows := sqlstore.Rows{Tx: tx, Cat: s.e.cat}
	for _, m := range matches {
		if err := rows.Delete(ctx, t, m.rows[0]); err != nil {
			return nil, err
		}
	}
	return &sqltypes.Result{RowsAffected: uint64(len(matches))}, nil
}
