package sqlexec

import (
	"fmt"
	"maps"

	"vitess.io/vitess/go/mysql/sqlerror"
	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
	"vitess.io/vitess/go/vt/sqlparser"
	"vitess.io/vitess/go/vt/vtgate/evalengine"
)

// Subqueries in expressions
//
// A subquery becomes a bind variable of the expression around it: a scalar
// subquery or EXISTS a value, `x IN (SELECT …)` a list. Columns of the
// outer query that the subquery reads (correlation) become bind variables
// of the subquery. Before the expression is evaluated for a row, each of
// its subqueries runs with that row's values bound.

type subqueryMode uint8

const (
	scalarSubquery subqueryMode = iota
	existsSubquery
	listSubquery
)

type outerRef struct {
	arg string
	pos int // position in the outer combined row
}

type subquery struct {
	sel   *sqlparser.Select
	mode  subqueryMode
	arg   string
	outer []outerRef
	// grouped, when set, replaces running sel for every row (see
	// decorrelate).
	grouped *groupedSubquery
}

// groupedSubquery is a correlated aggregate subquery run once, grouped by
// the columns its correlation compares: SELECT agg(x) FROM t WHERE t.a =
// outer.b AND … becomes SELECT t.a, agg(x) FROM t WHERE … GROUP BY t.a, and
// each outer row looks its value up by b.
type groupedSubquery struct {
	sel       *sqlparser.Select
	outerPos  []int // outer positions, in GROUP BY order
	countLike bool  // COUNT: a missing group is 0, not NULL
	results   map[string]sqltypes.Value
}

// liftSubqueries replaces the subqueries of e with bind variables and
// returns them, their outer references resolved in sc.
func (s *Session) liftSubqueries(e sqlparser.Expr, sc *scope) (sqlparser.Expr, []*subquery, error) {
	var subs []*subquery
	var err error
	lift := func(sq *sqlparser.Subquery, mode subqueryMode) string {
		sel, ok := sq.Select.(*sqlparser.Select)
		if !ok {
			err = unsupported("UNION in a subquery")
			return ""
		}
		s.argSeq++
		sub := &subquery{mode: mode, arg: fmt.Sprintf("__retina_sq%d", s.argSeq)}
		if mode == scalarSubquery {
			if g, ok := s.decorrelate(sel, sc); ok {
				sub.grouped = g
				for _, p := range g.outerPos {
					sub.outer = append(sub.outer, outerRef{pos: p})
				}
				subs = append(subs, sub)
				return sub.arg
			}
		}
		sub.sel, err = s.correlate(sel, sc, sub)
		subs = append(subs, sub)
		return sub.arg
	}
	out := sqlparser.CopyOnRewrite(e, func(node, _ sqlparser.SQLNode) bool {
		_, isSub := node.(*sqlparser.Subquery)
		return !isSub // lifted whole in post
	}, func(cur *sqlparser.CopyOnWriteCursor) {
		switch n := cur.Node().(type) {
		case *sqlparser.ExistsExpr:
			cur.Replace(sqlparser.NewArgument(lift(n.Subquery, existsSubquery)))
		case *sqlparser.ComparisonExpr:
			if sq, ok := n.Right.(*sqlparser.Subquery); ok && (n.Operator == sqlparser.InOp || n.Operator == sqlparser.NotInOp) {
				cur.Replace(&sqlparser.ComparisonExpr{Operator: n.Operator, Left: n.Left, Right: sqlparser.NewListArg(lift(sq, listSubquery))})
			}
		case *sqlparser.Subquery:
			// EXISTS and IN lift their subquery themselves.
			switch p := cur.Parent().(type) {
			case *sqlparser.ExistsExpr:
				return
			case *sqlparser.ComparisonExpr:
				if p.Right == sqlparser.Expr(n) && (p.Operator == sqlparser.InOp || p.Operator == sqlparser.NotInOp) {
					return
				}
			}
			cur.Replace(sqlparser.NewArgument(lift(n, scalarSubquery)))
		}
	}, nil).(sqlparser.Expr)
	return out, subs, err
}

// correlate rewrites the columns of sel that do not resolve in its own FROM
// but do in the outer scope into bind variables.
func (s *Session) correlate(sel *sqlparser.Select, outer *scope, sub *subquery) (*sqlparser.Select, error) {
	inner, _, err := s.fromClause(sel.From, nil, false)
	if err != nil {
		return nil, err
	}
	out := sqlparser.CopyOnRewrite(sel, nil, func(cur *sqlparser.CopyOnWriteCursor) {
		col, ok := cur.Node().(*sqlparser.ColName)
		if !ok {
			return
		}
		if _, _, err := inner.lookup(col); err == nil {
			return
		}
		si, p, err := outer.lookup(col)
		if err != nil || si < 0 {
			return // an alias of the subquery's own output, or an error its run reports
		}
		s.argSeq++
		ref := outerRef{arg: fmt.Sprintf("__retina_outer%d", s.argSeq), pos: p}
		sub.outer = append(sub.outer, ref)
		cur.Replace(sqlparser.NewArgument(ref.arg))
	}, nil).(*sqlparser.Select)
	return out, nil
}

// run evaluates the subquery for the current row of env and binds its
// result.
func (s *Session) runSubquery(sub *subquery, env *evalengine.ExpressionEnv) error {
	if g := sub.grouped; g != nil {
		return s.lookupGrouped(sub, g, env)
	}
	bind := maps.Clone(env.BindVars)
	for _, o := range sub.outer {
		bind[o.arg] = sqltypes.ValueBindVariable(env.Row[o.pos])
	}
	res, err := s.selectStmt(s.execCtx, s.execTx, sub.sel, bind)
	if err != nil {
		return err
	}
	switch sub.mode {
	case existsSubquery:
		v := int64(0)
		if len(res.Rows) > 0 {
			v = 1
		}
		env.BindVars[sub.arg] = sqltypes.Int64BindVariable(v)
	case listSubquery:
		if len(res.Fields) != 1 {
			return sqlerror.NewSQLError(sqlerror.ERNotSupportedYet, "21000", "operand should contain 1 column")
		}
		bv := &querypb.BindVariable{Type: querypb.Type_TUPLE}
		for _, r := range res.Rows {
			bv.Values = append(bv.Values, sqltypes.ValueToProto(r[0]))
		}
		if len(bv.Values) == 0 {
			// IN of an empty list: a NULL that matches nothing.
			bv.Values = append(bv.Values, sqltypes.ValueToProto(sqltypes.NULL))
		}
		env.BindVars[sub.arg] = bv
	default:
		if len(res.Fields) != 1 {
			return sqlerror.NewSQLError(sqlerror.ERNotSupportedYet, "21000", "operand should contain 1 column")
		}
		switch len(res.Rows) {
		case 0:
			env.BindVars[sub.arg] = sqltypes.ValueBindVariable(sqltypes.NULL)
		case 1:
			env.BindVars[sub.arg] = sqltypes.ValueBindVariable(res.Rows[0][0])
		default:
			return sqlerror.NewSQLError(sqlerror.ErrorCode(1242), "21000", "subquery returns more than 1 row")
		}
	}
	return nil
}

// decorrelate recognizes a scalar subquery whose only result is one
// aggregate and whose only use of the outer query is equalities between
// its own columns and outer columns in WHERE.
func (s *Session) decorrelate(sel *sqlparser.Select, outer *scope) (*groupedSubquery, bool) {
	if sel.GroupBy != nil || sel.Having != nil || len(sel.OrderBy) > 0 || sel.Limit != nil || sel.Distinct || sel.With != nil || sel.Lock != sqlparser.NoLock {
		return nil, false
	}
	if len(sel.SelectExprs.Exprs) != 1 {
		return nil, false
	}
	ae, ok := sel.SelectExprs.Exprs[0].(*sqlparser.AliasedExpr)
	if !ok {
		return nil, false
	}
	countLike := false
	switch ae.Expr.(type) {
	case *sqlparser.Count, *sqlparser.CountStar:
		countLike = true
	case *sqlparser.Sum, *sqlparser.Min, *sqlparser.Max, *sqlparser.Avg:
	default:
		return nil, false
	}
	inner, _, err := s.fromClause(sel.From, nil, false)
	if err != nil {
		return nil, false
	}
	// isOuter: a column the subquery's FROM does not have but the outer
	// scope does.
	isOuter := func(e sqlparser.Expr) (int, bool) {
		col, ok := e.(*sqlparser.ColName)
		if !ok {
			return 0, false
		}
		if _, _, err := inner.lookup(col); err == nil {
			return 0, false
		}
		si, p, err := outer.lookup(col)
		return p, err == nil && si >= 0
	}
	mentionsOuter := func(e sqlparser.SQLNode) bool {
		found := false
		_ = sqlparser.Walk(func(n sqlparser.SQLNode) (bool, error) {
			if col, ok := n.(*sqlparser.ColName); ok {
				if _, ok := isOuter(col); ok {
					found = true
					return false, nil
				}
			}
			return true, nil
		}, e)
		return found
	}
	if mentionsOuter(ae.Expr) || mentionsOuter(sqlparser.TableExprs(sel.From)) {
		return nil, false
	}
	g := &groupedSubquery{countLike: countLike}
	var keep []sqlparser.Expr
	var groupBy []sqlparser.Expr
	if sel.Where != nil {
		for _, c := range sqlparser.SplitAndExpression(nil, sel.Where.Expr) {
			if !mentionsOuter(c) {
				keep = append(keep, c)
				continue
			}
			cmp, ok := c.(*sqlparser.ComparisonExpr)
			if !ok || cmp.Operator != sqlparser.EqualOp {
				return nil, false
			}
			innerSide, outerSide := cmp.Left, cmp.Right
			p, ok := isOuter(outerSide)
			if !ok {
				innerSide, outerSide = cmp.Right, cmp.Left
				if p, ok = isOuter(outerSide); !ok {
					return nil, false
				}
			}
			if mentionsOuter(innerSide) {
				return nil, false
			}
			groupBy = append(groupBy, innerSide)
			g.outerPos = append(g.outerPos, p)
		}
	}
	if len(groupBy) == 0 {
		return nil, false
	}
	out := &sqlparser.Select{From: sel.From, SelectExprs: &sqlparser.SelectExprs{}, GroupBy: &sqlparser.GroupBy{Exprs: groupBy}}
	for _, gb := range groupBy {
		out.SelectExprs.Exprs = append(out.SelectExprs.Exprs, &sqlparser.AliasedExpr{Expr: gb})
	}
	out.SelectExprs.Exprs = append(out.SelectExprs.Exprs, &sqlparser.AliasedExpr{Expr: ae.Expr})
	if len(keep) > 0 {
		out.Where = &sqlparser.Where{Type: sqlparser.WhereClause, Expr: sqlparser.AndExpressions(keep...)}
	}
	g.sel = out
	return g, true
}

// lookupGrouped runs a grouped subquery once and reads the current row's
// value from its result.
func (s *Session) lookupGrouped(sub *subquery, g *groupedSubquery, env *evalengine.ExpressionEnv) error {
	if g.results == nil {
		res, err := s.selectStmt(s.execCtx, s.execTx, g.sel, env.BindVars)
		if err != nil {
			return err
		}
		g.results = make(map[string]sqltypes.Value, len(res.Rows))
		k := len(g.outerPos)
		for _, r := range res.Rows {
			g.results[rowKey(r[:k])] = r[k]
		}
	}
	key := make([]sqltypes.Value, len(g.outerPos))
	missing := false
	for i, p := range g.outerPos {
		key[i] = env.Row[p]
		missing = missing || key[i].IsNull() // = NULL matches no row
	}
	v, ok := g.results[rowKey(key)]
	if missing || !ok {
		v = sqltypes.NULL
		if g.countLike {
			v = sqltypes.NewInt64(0)
		}
	}
	env.BindVars[sub.arg] = sqltypes.ValueBindVariable(v)
	return nil
}
