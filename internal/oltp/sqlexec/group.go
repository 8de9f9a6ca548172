package sqlexec

import (
	"fmt"
	"strings"

	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
	"vitess.io/vitess/go/vt/sqlparser"
	"vitess.io/vitess/go/vt/vtgate/evalengine"
)

// Grouping
//
// A grouped query is rewritten so that everything above the grouping reads
// one row per group: its GROUP BY expressions (slots g0, g1, …), its
// aggregates (a0, a1, …) and, for columns that are neither (MySQL without
// ONLY_FULL_GROUP_BY), the value of the group's first row (any0, …). AVG is
// SUM / COUNT. The select list, HAVING and ORDER BY are rewritten to read
// those slots and then evaluated like any other expression.

const slotPrefix = "__retina_"

type aggregate struct {
	fn       sqlparser.AggrFunc
	arg      *compiled // nil: COUNT(*)
	distinct bool
}

// accumulator is one aggregate's state within one group.
type accumulator struct {
	agg   *aggregate
	count int64
	sum   evalengine.Sum
	mm    evalengine.MinMax
	seen  map[string]bool
}

func (s *Session) group(sc *scope, rows [][]sqltypes.Value, cols []outputCol, st *sqlparser.Select, bind map[string]*querypb.BindVariable) ([][]sqltypes.Value, *scope, []outputCol, *sqlparser.Select, error) {
	var groupBy []sqlparser.Expr
	if st.GroupBy != nil {
		groupBy = st.GroupBy.Exprs
	}
	// GROUP BY may name an output alias or position.
	for i, g := range groupBy {
		if lit, ok := g.(*sqlparser.Literal); ok && lit.Type == sqlparser.IntVal {
			var n int
			fmt.Sscan(lit.Val, &n)
			if n < 1 || n > len(cols) {
				return nil, nil, nil, nil, errorf(ErBadField, "unknown column '%d' in 'group statement'", n)
			}
			groupBy[i] = cols[n-1].expr
		} else if col, ok := g.(*sqlparser.ColName); ok && col.Qualifier.IsEmpty() {
			if _, _, err := sc.lookup(col); err != nil {
				for _, c := range cols {
					if strings.EqualFold(c.name, col.Name.String()) {
						groupBy[i] = c.expr
					}
				}
			}
		}
	}
	gexprs := make([]*compiled, len(groupBy))
	for i, g := range groupBy {
		ce, err := s.compile(g, sc)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		gexprs[i] = ce
	}
	var aggs []*aggregate
	aggSlot := map[string]int{}
	var anys []int // base positions read as ANY_VALUE
	anySlot := map[int]int{}
	out := &scope{slots: map[string]int{}}
	for i := range groupBy {
		out.slots[fmt.Sprintf("%sg%d", slotPrefix, i)] = i
	}
	var rwErr error
	rewrite := func(e sqlparser.Expr) sqlparser.Expr {
		if e == nil {
			return nil
		}
		return sqlparser.CopyOnRewrite(e, func(node, _ sqlparser.SQLNode) bool {
			// Do not descend into aggregates, grouped expressions or
			// subqueries (their columns are their own).
			if _, ok := node.(*sqlparser.Subquery); ok {
				return false
			}
			if ex, ok := node.(sqlparser.Expr); ok {
				if _, isAgg := ex.(sqlparser.AggrFunc); isAgg {
					return false
				}
				for _, g := range groupBy {
					if sqlparser.Equals.Expr(ex, g) {
						return false
					}
				}
			}
			return true
		}, func(cur *sqlparser.CopyOnWriteCursor) {
			ex, ok := cur.Node().(sqlparser.Expr)
			if !ok {
				return
			}
			for i, g := range groupBy {
				if sqlparser.Equals.Expr(ex, g) {
					cur.Replace(sqlparser.NewColName(fmt.Sprintf("%sg%d", slotPrefix, i)))
					return
				}
			}
			if avg, ok := ex.(*sqlparser.Avg); ok {
				sum := &sqlparser.Sum{Arg: avg.Arg, Distinct: avg.Distinct}
				cnt := &sqlparser.Count{Args: []sqlparser.Expr{avg.Arg}, Distinct: avg.Distinct}
				cur.Replace(&sqlparser.BinaryExpr{Operator: sqlparser.DivOp,
					Left: s.aggSlot(sc, sum, &aggs, aggSlot, &rwErr), Right: s.aggSlot(sc, cnt, &aggs, aggSlot, &rwErr)})
				return
			}
			if af, ok := ex.(sqlparser.AggrFunc); ok {
				cur.Replace(s.aggSlot(sc, af, &aggs, aggSlot, &rwErr))
				return
			}
			if col, ok := ex.(*sqlparser.ColName); ok {
				if strings.HasPrefix(col.Name.String(), slotPrefix) {
					return
				}
				_, p, err := sc.lookup(col)
				if err != nil {
					rwErr = err
					return
				}
				k, ok := anySlot[p]
				if !ok {
					k = len(anys)
					anySlot[p] = k
					anys = append(anys, p)
				}
				cur.Replace(sqlparser.NewColName(fmt.Sprintf("%sany%d", slotPrefix, k)))
			}
		}, nil).(sqlparser.Expr)
	}
	newCols := make([]outputCol, len(cols))
	for i, c := range cols {
		newCols[i] = outputCol{expr: rewrite(c.expr), name: c.name, field: c.field}
		if _, ok := c.expr.(*sqlparser.CountStar); ok {
			newCols[i].field = &querypb.Field{Name: c.name, Type: querypb.Type_INT64}
		}
		if _, ok := c.expr.(*sqlparser.Count); ok {
			newCols[i].field = &querypb.Field{Name: c.name, Type: querypb.Type_INT64}
		}
	}
	var having sqlparser.Expr
	if st.Having != nil {
		having = rewrite(st.Having.Expr)
	}
	order := make(sqlparser.OrderBy, len(st.OrderBy))
	for i, o := range st.OrderBy {
		e := o.Expr
		if !isOutputAlias(sc, cols, e) {
			e = rewrite(e)
		}
		order[i] = &sqlparser.Order{Expr: e, Direction: o.Direction}
	}
	if rwErr != nil {
		return nil, nil, nil, nil, rwErr
	}
	ng, na := len(groupBy), len(aggs)
	for k := range anys {
		out.slots[fmt.Sprintf("%sany%d", slotPrefix, k)] = ng + na + k
	}
	for i := range aggs {
		out.slots[fmt.Sprintf("%sa%d", slotPrefix, i)] = ng + i
	}

	type groupState struct {
		key  []sqltypes.Value
		accs []*accumulator
		any  []sqltypes.Value
	}
	var order2 []*groupState
	groups := map[string]*groupState{}
	env := s.env(bind)
	for _, r := range rows {
		env.Row = r
		key := make([]sqltypes.Value, ng)
		for i, g := range gexprs {
			v, err := g.eval(env)
			if err != nil {
				return nil, nil, nil, nil, err
			}
			key[i] = v
		}
		k := rowKey(key)
		gs, ok := groups[k]
		if !ok {
			gs = &groupState{key: key, accs: make([]*accumulator, na), any: make([]sqltypes.Value, len(anys))}
			for i, a := range aggs {
				gs.accs[i] = &accumulator{agg: a}
			}
			for i, p := range anys {
				gs.any[i] = r[p]
			}
			groups[k] = gs
			order2 = append(order2, gs)
		}
		for _, acc := range gs.accs {
			if err := acc.add(env); err != nil {
				return nil, nil, nil, nil, err
			}
		}
	}
	if len(order2) == 0 && ng == 0 {
		gs := &groupState{accs: make([]*accumulator, na), any: make([]sqltypes.Value, len(anys))}
		for i, a := range aggs {
			gs.accs[i] = &accumulator{agg: a}
		}
		for i := range gs.any {
			gs.any[i] = sqltypes.NULL
		}
		order2 = append(order2, gs)
	}
	var grouped [][]sqltypes.Value
	var havingExpr *compiled
	if having != nil {
		var err error
		if havingExpr, err = s.compile(having, out); err != nil {
			return nil, nil, nil, nil, err
		}
	}
	for _, gs := range order2 {
		row := make([]sqltypes.Value, 0, ng+na+len(anys))
		row = append(row, gs.key...)
		for _, acc := range gs.accs {
			row = append(row, acc.result())
		}
		row = append(row, gs.any...)
		if havingExpr != nil {
			env.Row = row
			ok, err := havingExpr.truth(env)
			if err != nil {
				return nil, nil, nil, nil, err
			}
			if !ok {
				continue
			}
		}
		grouped = append(grouped, row)
	}
	st2 := *st
	st2.OrderBy = order
	return grouped, out, newCols, &st2, nil
}

// aggSlot registers an aggregate (once per distinct text) and returns the
// column that reads its result.
func (s *Session) aggSlot(sc *scope, af sqlparser.AggrFunc, aggs *[]*aggregate, slots map[string]int, errp *error) sqlparser.Expr {
	text := sqlparser.String(af)
	if i, ok := slots[text]; ok {
		return sqlparser.NewColName(fmt.Sprintf("%sa%d", slotPrefix, i))
	}
	a := &aggregate{fn: af}
	switch f := af.(type) {
	case *sqlparser.CountStar:
	case *sqlparser.Count:
		if len(f.Args) != 1 {
			*errp = unsupported("COUNT with more than one argument")
			return af
		}
		a.distinct = f.Distinct
	case *sqlparser.Sum:
		a.distinct = f.Distinct
	case *sqlparser.Min, *sqlparser.Max:
	default:
		*errp = unsupported(fmt.Sprintf("the aggregate %s", strings.ToUpper(af.AggrName())))
		return af
	}
	if arg := af.GetArg(); arg != nil {
		ce, err := s.compile(arg, sc)
		if err != nil {
			*errp = err
			return af
		}
		a.arg = ce
	}
	i := len(*aggs)
	*aggs = append(*aggs, a)
	slots[text] = i
	return sqlparser.NewColName(fmt.Sprintf("%sa%d", slotPrefix, i))
}

func (acc *accumulator) add(env *evalengine.ExpressionEnv) error {
	a := acc.agg
	if a.arg == nil { // COUNT(*)
		acc.count++
		return nil
	}
	v, err := a.arg.eval(env)
	if err != nil {
		return err
	}
	if v.IsNull() {
		return nil
	}
	if a.distinct {
		k := rowKey([]sqltypes.Value{v})
		if acc.seen == nil {
			acc.seen = map[string]bool{}
		}
		if acc.seen[k] {
			return nil
		}
		acc.seen[k] = true
	}
	acc.count++
	switch a.fn.(type) {
	case *sqlparser.Sum:
		if acc.sum == nil {
			acc.sum = evalengine.NewAggregationSum(v.Type())
		}
		return acc.sum.Add(v)
	case *sqlparser.Min:
		if acc.mm == nil {
			acc.mm = evalengine.NewAggregationMinMax(v.Type(), a.arg.sess.e.env.CollationEnv(), a.arg.sess.e.collation, nil)
		}
		return acc.mm.Min(v)
	case *sqlparser.Max:
		if acc.mm == nil {
			acc.mm = evalengine.NewAggregationMinMax(v.Type(), a.arg.sess.e.env.CollationEnv(), a.arg.sess.e.collation, nil)
		}
		return acc.mm.Max(v)
	}
	return nil
}

func (acc *accumulator) result() sqltypes.Value {
	switch acc.agg.fn.(type) {
	case *sqlparser.CountStar, *sqlparser.Count:
		return sqltypes.NewInt64(acc.count)
	case *sqlparser.Sum:
		if acc.sum == nil {
			return sqltypes.NULL
		}
		return acc.sum.Result()
	case *sqlparser.Min, *sqlparser.Max:
		if acc.mm == nil {
			return sqltypes.NULL
		}
		return acc.mm.Result()
	}
	return sqltypes.NULL
}

// isOutputAlias reports whether e names an output column by an alias that
// is not also a column of the sources (finish resolves it then).
func isOutputAlias(sc *scope, cols []outputCol, e sqlparser.Expr) bool {
	col, ok := e.(*sqlparser.ColName)
	if !ok || !col.Qualifier.IsEmpty() {
		return false
	}
	if _, _, err := sc.lookup(col); err == nil {
		return false
	}
	for _, c := range cols {
		if strings.EqualFold(c.name, col.Name.String()) {
			return true
		}
	}
	return false
}
