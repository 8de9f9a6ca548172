package sqlexec

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
	"vitess.io/vitess/go/vt/sqlparser"
	"vitess.io/vitess/go/vt/vtenv"
	"vitess.io/vitess/go/vt/vtgate/evalengine"

	"github.com/retinadb/retina/internal/oltp/sqlstore"
)

// source is one table of a statement's FROM clause; its columns occupy
// [off, off+len(columns)) of the combined row.
type source struct {
	t    *sqlstore.Table
	name string // alias, or the table's name
	off  int
	// derived is a subquery in FROM; rows are its result, computed once
	// per statement (t then only names the columns).
	derived *sqlparser.Select
	rows    [][]sqltypes.Value
	// leftJoin: rows of the sources before are kept, NULL-extended, when
	// none of this source's rows meets the ON condition.
	leftJoin bool
	on       []sqlparser.Expr
}

// scope resolves column names to positions in a combined row: the columns
// of each source in turn, then named slots (grouping and aggregate
// results).
type scope struct {
	sources []*source
	slots   map[string]int
	// fallback resolves names the scope does not know (ANY_VALUE columns
	// of a grouped query); nil: unknown names are errors.
	fallback func(*sqlparser.ColName) (int, error)
}

func (sc *scope) width() int {
	if len(sc.sources) == 0 {
		return 0
	}
	last := sc.sources[len(sc.sources)-1]
	return last.off + len(last.t.Columns)
}

// lookup finds a column: its source index and position in the combined row.
func (sc *scope) lookup(col *sqlparser.ColName) (int, int, error) {
	name := col.Name.String()
	if i, ok := sc.slots[strings.ToLower(name)]; ok && col.Qualifier.IsEmpty() {
		return -1, i, nil
	}
	qual := strings.ToLower(col.Qualifier.Name.String())
	found, srcIdx, pos := 0, -1, -1
	for si, src := range sc.sources {
		if qual != "" && qual != src.name {
			continue
		}
		if c := src.t.ColumnIndex(name); c >= 0 {
			found++
			srcIdx, pos = si, src.off+c
		}
	}
	switch {
	case found == 1:
		return srcIdx, pos, nil
	case found > 1:
		return 0, 0, errorf(ErNonUnique, "column '%s' in field list is ambiguous; qualify it with its table", sqlparser.String(col))
	}
	if sc.fallback != nil {
		p, err := sc.fallback(col)
		return -1, p, err
	}
	return 0, 0, errorf(ErBadField, "unknown column '%s'", sqlparser.String(col))
}

// compiled is an expression ready to evaluate against a combined row.
type compiled struct {
	ev   evalengine.Expr
	subs []*subquery // run for each row before ev
	// srcs has bit i set when the expression reads source i.
	srcs uint64
	sess *Session
}

func (c *compiled) eval(env *evalengine.ExpressionEnv) (sqltypes.Value, error) {
	if err := c.runSubs(env); err != nil {
		return sqltypes.NULL, err
	}
	r, err := env.Evaluate(c.ev)
	if err != nil {
		return sqltypes.NULL, err
	}
	return r.Value(c.sess.e.collation), nil
}

// truth evaluates a condition: NULL and false are false.
func (c *compiled) truth(env *evalengine.ExpressionEnv) (bool, error) {
	if err := c.runSubs(env); err != nil {
		return false, err
	}
	r, err := env.Evaluate(c.ev)
	if err != nil {
		return false, err
	}
	return r.ToBoolean(), nil
}

func (c *compiled) runSubs(env *evalengine.ExpressionEnv) error {
	for _, sub := range c.subs {
		if err := c.sess.runSubquery(sub, env); err != nil {
			return err
		}
	}
	return nil
}

// compile translates e for evaluation in sc. Variables (@@sys, @user) are
// replaced by their values first; the cached statement is not modified.
func (s *Session) compile(e sqlparser.Expr, sc *scope) (*compiled, error) {
	var verr error
	var srcs uint64
	e = sqlparser.CopyOnRewrite(e, nil, func(cur *sqlparser.CopyOnWriteCursor) {
		v, ok := cur.Node().(*sqlparser.Variable)
		if !ok {
			return
		}
		var val sqltypes.Value
		if v.Scope == sqlparser.VariableScope {
			val = s.userVars[strings.ToLower(v.Name.String())]
		} else {
			var err error
			if val, err = s.systemVar(v.Name.String()); err != nil {
				verr = err
				return
			}
		}
		cur.Replace(literal(val))
	}, nil).(sqlparser.Expr)
	if verr != nil {
		return nil, verr
	}
	e, subs, err := s.liftSubqueries(e, sc)
	if err != nil {
		return nil, err
	}
	for _, sub := range subs {
		for _, o := range sub.outer {
			if si, _, err := sc.lookupPos(o.pos); err == nil {
				srcs |= 1 << si
			}
		}
	}
	var rerr error
	_ = sqlparser.Walk(func(node sqlparser.SQLNode) (bool, error) {
		switch n := node.(type) {
		case *sqlparser.ColName:
			si, _, err := sc.lookup(n)
			if err != nil {
				rerr = err
				return false, err
			}
			if si >= 0 {
				srcs |= 1 << si
			}
		}
		return true, nil
	}, e)
	if rerr != nil {
		return nil, rerr
	}
	ev, err := evalengine.Translate(e, &evalengine.Config{
		ResolveColumn: func(col *sqlparser.ColName) (int, error) {
			_, p, err := sc.lookup(col)
			return p, err
		},
		Collation:   s.e.collation,
		Environment: s.e.env,
	})
	if err != nil {
		return nil, errorf(ErUnsupported, "expression %s: %v", truncate(sqlparser.String(e), 80), err)
	}
	return &compiled{ev: ev, srcs: srcs, subs: subs, sess: s}, nil
}

// literal turns a value into an AST literal.
func literal(v sqltypes.Value) sqlparser.Expr {
	switch {
	case v.IsNull():
		return &sqlparser.NullVal{}
	case v.IsIntegral():
		return sqlparser.NewIntLiteral(v.ToString())
	case v.IsDecimal():
		return sqlparser.NewDecimalLiteral(v.ToString())
	case v.IsFloat():
		return sqlparser.NewFloatLiteral(v.ToString())
	}
	return sqlparser.NewStrLiteral(v.ToString())
}

// vcursor is what the evaluation engine asks of its caller.
type vcursor struct {
	env *vtenv.Environment
	db  string
}

func (v vcursor) TimeZone() *time.Location        { return time.UTC }
func (v vcursor) GetKeyspace() string             { return v.db }
func (v vcursor) SQLMode() string                 { return "STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION" }
func (v vcursor) Environment() *vtenv.Environment { return v.env }
func (v vcursor) SetLastInsertID(uint64)          {}

// env is an evaluation environment with its own copy of the bind
// variables (subqueries add theirs).
func (s *Session) env(bind map[string]*querypb.BindVariable) *evalengine.ExpressionEnv {
	vars := maps.Clone(bind)
	if vars == nil {
		vars = map[string]*querypb.BindVariable{}
	}
	return evalengine.NewExpressionEnv(context.Background(), vars, vcursor{env: s.e.env, db: s.dbName()})
}

// lookupPos finds the source holding a combined-row position.
func (sc *scope) lookupPos(p int) (int, *source, error) {
	for i, src := range sc.sources {
		if p >= src.off && p < src.off+len(src.t.Columns) {
			return i, src, nil
		}
	}
	return 0, nil, fmt.Errorf("position %d is not a source column", p)
}

// storedRow converts a stored row to SQL values into dst.
func storedRow(dst []sqltypes.Value, t *sqlstore.Table, vals []any) {
	for i := range t.Columns {
		dst[i] = sqlstore.FromStored(&t.Columns[i], vals[i])
	}
}

// keyValue converts v to column c's stored value for a key bound, when the
// comparison's result does not depend on MySQL's type coercion (same type
// class). ok false: the bound cannot be used; scan more widely.
func keyValue(t *sqlstore.Table, c *sqlstore.Column, v sqltypes.Value) (any, bool) {
	if v.IsNull() {
		return nil, true
	}
	ct := sqlstore.QueryType(c)
	switch {
	case sqltypes.IsNumber(ct):
		if !sqltypes.IsNumber(v.Type()) {
			return nil, false
		}
	case sqltypes.IsText(ct) || sqltypes.IsBinary(ct):
		if !(v.IsText() || v.IsBinary()) {
			return nil, false
		}
	case ct == querypb.Type_DATE || ct == querypb.Type_DATETIME:
		if !(v.IsText() || v.Type() == querypb.Type_DATE || v.Type() == querypb.Type_DATETIME) {
			return nil, false
		}
	default:
		return nil, false
	}
	x, err := sqlstore.ToStored(t, c, v)
	if err != nil {
		return nil, false
	}
	return x, true
}
