package sqlexec

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
	"vitess.io/vitess/go/vt/sqlparser"
	"vitess.io/vitess/go/vt/vtgate/evalengine"

	"github.com/retinadb/retina/internal/oltp/skeena"
	"github.com/retinadb/retina/internal/oltp/sqlstore"
)

// fromClause resolves FROM into sources and adds inner-join conditions to
// the conjuncts. With run, derived tables are computed (in the statement's
// transaction); without, only their columns are named (for resolving a
// subquery's correlation).
func (s *Session) fromClause(from []sqlparser.TableExpr, bind map[string]*querypb.BindVariable, run bool) (*scope, []sqlparser.Expr, error) {
	sc := &scope{}
	var conds []sqlparser.Expr
	addSource := func(src *source) error {
		for _, o := range sc.sources {
			if o.name == src.name {
				return errorf(ErNonUnique, "not unique table/alias: '%s'", src.name)
			}
		}
		src.off = sc.width()
		sc.sources = append(sc.sources, src)
		return nil
	}
	var add func(te sqlparser.TableExpr, left bool) error
	add = func(te sqlparser.TableExpr, left bool) error {
		switch te := te.(type) {
		case *sqlparser.AliasedTableExpr:
			switch expr := te.Expr.(type) {
			case sqlparser.TableName:
				if strings.EqualFold(expr.Name.String(), "dual") && expr.Qualifier.IsEmpty() {
					return nil // SELECT without FROM
				}
				t, err := s.e.cat.Table(expr.Name.String())
				if err != nil {
					return err
				}
				name := strings.ToLower(expr.Name.String())
				if !te.As.IsEmpty() {
					name = strings.ToLower(te.As.String())
				}
				return addSource(&source{t: t, name: name, leftJoin: left})
			case *sqlparser.DerivedTable:
				sel, ok := expr.Select.(*sqlparser.Select)
				if !ok {
					return unsupported("UNION in FROM")
				}
				if te.As.IsEmpty() {
					return errorf(ErParse, "every derived table must have its own alias")
				}
				src := &source{name: strings.ToLower(te.As.String()), derived: sel, leftJoin: left}
				if err := s.deriveColumns(src, bind, run); err != nil {
					return err
				}
				return addSource(src)
			}
			return unsupported(fmt.Sprintf("FROM %s", sqlparser.String(te)))
		case *sqlparser.JoinTableExpr:
			isLeft := false
			switch te.Join {
			case sqlparser.NormalJoinType, sqlparser.StraightJoinType:
			case sqlparser.LeftJoinType:
				isLeft = true
			default:
				return unsupported("RIGHT and NATURAL joins; write them as LEFT or inner joins")
			}
			if err := add(te.LeftExpr, left); err != nil {
				return err
			}
			if isLeft {
				if _, ok := te.RightExpr.(*sqlparser.AliasedTableExpr); !ok {
					return unsupported("a LEFT JOIN whose right side is itself a join")
				}
			}
			if err := add(te.RightExpr, isLeft); err != nil {
				return err
			}
			if te.Condition != nil {
				if len(te.Condition.Using) > 0 {
					return unsupported("JOIN … USING; write the ON condition")
				}
				if te.Condition.On != nil {
					if isLeft {
						last := sc.sources[len(sc.sources)-1]
						last.on = sqlparser.SplitAndExpression(last.on, te.Condition.On)
					} else {
						conds = sqlparser.SplitAndExpression(conds, te.Condition.On)
					}
				}
			}
		case *sqlparser.ParenTableExpr:
			for _, x := range te.Exprs {
				if err := add(x, left); err != nil {
					return err
				}
			}
		default:
			return unsupported(fmt.Sprintf("FROM %s", sqlparser.String(te)))
		}
		return nil
	}
	for _, te := range from {
		if err := add(te, false); err != nil {
			return nil, nil, err
		}
	}
	return sc, conds, nil
}

// deriveColumns names a derived table's columns, and with run computes its
// rows.
func (s *Session) deriveColumns(src *source, bind map[string]*querypb.BindVariable, run bool) error {
	var names []string
	if run {
		res, err := s.selectStmt(s.execCtx, s.execTx, src.derived, bind)
		if err != nil {
			return err
		}
		src.rows = res.Rows
		for _, f := range res.Fields {
			names = append(names, f.Name)
		}
	} else {
		inner, _, err := s.fromClause(src.derived.From, nil, false)
		if err != nil {
			return err
		}
		cols, err := s.expandSelect(inner, src.derived.SelectExprs)
		if err != nil {
			return err
		}
		for _, c := range cols {
			names = append(names, c.name)
		}
	}
	t := &sqlstore.Table{Name: src.name}
	for _, n := range names {
		t.Columns = append(t.Columns, sqlstore.Column{Name: n})
	}
	src.t = t
	return nil
}

// joinResult is one combined row and the stored rows it came from.
type joinResult struct {
	vals []sqltypes.Value
	rows []sqlstore.Row
}

// join runs the nested-loop join of sc's sources under the conjuncts and
// returns the combined rows that pass every conjunct.
func (s *Session) join(ctx context.Context, tx *skeena.Tx, sc *scope, conj []sqlparser.Expr, bind map[string]*querypb.BindVariable, lock bool, limit int) ([]joinResult, error) {
	compiledConj := make([]*compiled, len(conj))
	for i, c := range conj {
		ce, err := s.compile(c, sc)
		if err != nil {
			return nil, err
		}
		compiledConj[i] = ce
	}
	n := len(sc.sources)
	if n > 64 {
		return nil, unsupported("a join of more than 64 tables")
	}
	on := make([][]*compiled, n)
	hasLeft := false
	for si, src := range sc.sources {
		hasLeft = hasLeft || src.leftJoin
		for _, c := range src.on {
			ce, err := s.compile(c, sc)
			if err != nil {
				return nil, err
			}
			on[si] = append(on[si], ce)
		}
	}
	// Join order: greedily, the source with the best access path given the
	// sources already placed (ties keep FROM order); FROM order as written
	// when there is a LEFT JOIN. Each WHERE conjunct is checked at the
	// first step where every source it reads is placed.
	order := make([]int, 0, n)
	plans := make([]access, n)
	levels := make([][]*compiled, max(n, 1))
	var placed uint64
	assigned := make([]bool, len(compiledConj))
	for step := 0; step < n; step++ {
		best, bestScore := -1, -1
		var bestPlan access
		for si, src := range sc.sources {
			if placed&(1<<si) != 0 || (hasLeft && si != step) {
				continue
			}
			var mine []sqlparser.Expr
			for j, c := range compiledConj {
				if c.srcs&(1<<si) != 0 && c.srcs&^(placed|1<<si) == 0 {
					mine = append(mine, conj[j])
				}
			}
			for j, c := range on[si] {
				if c.srcs&^(placed|1<<si) == 0 {
					mine = append(mine, src.on[j])
				}
			}
			a := access{}
			if src.derived == nil {
				a = s.planAccess(sc, si, placed, mine)
			}
			if score := a.score(); score > bestScore {
				best, bestScore, bestPlan = si, score, a
			}
		}
		order = append(order, best)
		plans[best] = bestPlan
		placed |= 1 << best
		for j, c := range compiledConj {
			if !assigned[j] && c.srcs&^placed == 0 {
				levels[step] = append(levels[step], c)
				assigned[j] = true
			}
		}
	}
	for j, c := range compiledConj { // constant conjuncts (no sources)
		if !assigned[j] {
			levels[0] = append(levels[0], c)
		}
	}
	env := s.env(bind)
	row := make([]sqltypes.Value, sc.width())
	env.Row = row
	stored := make([]sqlstore.Row, n)
	rows := sqlstore.Rows{Tx: tx, Cat: s.e.cat}
	var out []joinResult
	all := func(cs []*compiled) (bool, error) {
		for _, c := range cs {
			ok, err := c.truth(env)
			if err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	}
	if n == 0 {
		ok, err := all(levels[0])
		if err != nil || !ok {
			return nil, err
		}
		return []joinResult{{vals: row}}, nil
	}
	var walk func(level int) error
	// emit continues the join with the current row of this level in place.
	emit := func(level int) error {
		ok, err := all(levels[level])
		if err != nil || !ok {
			return err
		}
		if level+1 < n {
			return walk(level + 1)
		}
		out = append(out, joinResult{vals: slices.Clone(row), rows: slices.Clone(stored)})
		return nil
	}
	walk = func(level int) error {
		si := order[level]
		src := sc.sources[si]
		seg := row[src.off : src.off+len(src.t.Columns)]
		matched := false
		if src.derived != nil {
			for _, r := range src.rows {
				copy(seg, r)
				ok, err := all(on[si])
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				matched = true
				stored[si] = sqlstore.Row{}
				if err := emit(level); err != nil {
					return err
				}
			}
		} else {
			push := 0
			if n == 1 && plans[0].exact && len(levels[0]) == len(conj) {
				push = limit
			}
			got, err := fetch(ctx, rows, src.t, &plans[si], env, push)
			if err != nil {
				return err
			}
			for _, r := range got {
				storedRow(seg, src.t, r.Vals)
				ok, err := all(on[si])
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				matched = true
				if lock {
					if err := rows.Lock(ctx, src.t, r); err != nil {
						return err
					}
				}
				stored[si] = r
				if err := emit(level); err != nil {
					return err
				}
			}
		}
		if src.leftJoin && !matched {
			for i := range seg {
				seg[i] = sqltypes.NULL
			}
			stored[si] = sqlstore.Row{}
			return emit(level)
		}
		return nil
	}
	if err := walk(0); err != nil {
		return nil, err
	}
	return out, nil
}

// outputCol is one column of a SELECT's result.
type outputCol struct {
	expr  sqlparser.Expr
	name  string
	field *querypb.Field // known type, or nil: from the first row
}

func (s *Session) expandSelect(sc *scope, exprs *sqlparser.SelectExprs) ([]outputCol, error) {
	var out []outputCol
	for _, se := range exprs.Exprs {
		switch se := se.(type) {
		case *sqlparser.StarExpr:
			qual := strings.ToLower(se.TableName.Name.String())
			matched := false
			for _, src := range sc.sources {
				if qual != "" && qual != src.name {
					continue
				}
				matched = true
				for i := range src.t.Columns {
					c := &src.t.Columns[i]
					oc := outputCol{expr: sqlparser.NewColNameWithQualifier(c.Name, sqlparser.NewTableName(src.name)), name: c.Name}
					if src.derived == nil {
						oc.field = &querypb.Field{Name: c.Name, Type: sqlstore.QueryType(c), Table: src.t.Name}
					}
					out = append(out, oc)
				}
			}
			if !matched {
				return nil, errorf(ErBadField, "unknown table '%s' in *", qual)
			}
		case *sqlparser.AliasedExpr:
			oc := outputCol{expr: se.Expr, name: sqlparser.String(se.Expr)}
			if col, ok := se.Expr.(*sqlparser.ColName); ok {
				oc.name = col.Name.String()
				if si, p, err := sc.lookup(col); err == nil && si >= 0 && sc.sources[si].derived == nil {
					src := sc.sources[si]
					c := &src.t.Columns[p-src.off]
					oc.field = &querypb.Field{Name: c.Name, Type: sqlstore.QueryType(c), Table: src.t.Name}
				}
			}
			if !se.As.IsEmpty() {
				oc.name = se.As.String()
			}
			if oc.field != nil {
				oc.field.Name = oc.name
			}
			out = append(out, oc)
		default:
			return nil, unsupported(sqlparser.String(se))
		}
	}
	return out, nil
}

func hasAggregate(exprs ...sqlparser.SQLNode) bool {
	found := false
	for _, e := range exprs {
		if e == nil {
			continue
		}
		_ = sqlparser.Walk(func(node sqlparser.SQLNode) (bool, error) {
			switch node.(type) {
			case sqlparser.AggrFunc:
				found = true
				return false, nil
			case *sqlparser.Subquery:
				return false, nil // its aggregates are its own
			}
			return true, nil
		}, e)
	}
	return found
}

func (s *Session) selectStmt(ctx context.Context, tx *skeena.Tx, st *sqlparser.Select, bind map[string]*querypb.BindVariable) (*sqltypes.Result, error) {
	if st.With != nil {
		return nil, unsupported("WITH")
	}
	if st.Into != nil {
		return nil, unsupported("SELECT … INTO")
	}
	sc, conds, err := s.fromClause(st.From, bind, true)
	if err != nil {
		return nil, err
	}
	var conj []sqlparser.Expr
	if st.Where != nil {
		conj = sqlparser.SplitAndExpression(conj, st.Where.Expr)
	}
	conj = append(conj, conds...)
	cols, err := s.expandSelect(sc, st.SelectExprs)
	if err != nil {
		return nil, err
	}
	grouped := (st.GroupBy != nil && len(st.GroupBy.Exprs) > 0) || st.Having != nil
	for _, c := range cols {
		grouped = grouped || hasAggregate(c.expr)
	}
	for _, o := range st.OrderBy {
		grouped = grouped || hasAggregate(o.Expr)
	}
	limit, offset, err := s.limits(st.Limit, bind)
	if err != nil {
		return nil, err
	}
	push := 0
	if !grouped && !st.Distinct && limit >= 0 && s.orderMatchesKey(sc, conj, st.OrderBy) {
		push = limit + offset
	}
	lock := st.Lock == sqlparser.ForUpdateLock || st.Lock == sqlparser.ForUpdateLockNoWait || st.Lock == sqlparser.ForUpdateLockSkipLocked || st.Lock == sqlparser.ShareModeLock || st.Lock == sqlparser.ForShareLock
	joined, err := s.join(ctx, tx, sc, conj, bind, lock, push)
	if err != nil {
		return nil, err
	}
	rows := make([][]sqltypes.Value, len(joined))
	for i, j := range joined {
		rows[i] = j.vals
	}
	outScope := sc
	if grouped {
		if rows, outScope, cols, st, err = s.group(sc, rows, cols, st, bind); err != nil {
			return nil, err
		}
	}
	return s.finish(outScope, rows, cols, st.OrderBy, st.Distinct, limit, offset, bind)
}

// orderMatchesKey reports whether a single-source query's ORDER BY is the
// order its access path reads rows in (so a LIMIT can stop the scan).
func (s *Session) orderMatchesKey(sc *scope, conj []sqlparser.Expr, order sqlparser.OrderBy) bool {
	if len(sc.sources) != 1 {
		return false
	}
	a := s.planAccess(sc, 0, 0, conj)
	if !a.exact {
		return false
	}
	for i, o := range order {
		if o.Direction == sqlparser.DescOrder {
			return false
		}
		c, ok := colOf(sc, 0, o.Expr)
		k := a.keyLen + i
		if !ok || k >= len(a.keyCols) || a.keyCols[k] != c {
			return false
		}
	}
	return true
}

// limits evaluates LIMIT and OFFSET (-1: no limit).
func (s *Session) limits(l *sqlparser.Limit, bind map[string]*querypb.BindVariable) (int, int, error) {
	if l == nil {
		return -1, 0, nil
	}
	num := func(e sqlparser.Expr) (int, error) {
		if e == nil {
			return 0, nil
		}
		v, err := s.constant(e, bind)
		if err != nil {
			return 0, err
		}
		n, err := strconv.Atoi(v.ToString())
		if err != nil || n < 0 {
			return 0, errorf(ErWrongValue, "LIMIT and OFFSET take non-negative integers, not %s", v.ToString())
		}
		return n, nil
	}
	limit, err := num(l.Rowcount)
	if err != nil {
		return 0, 0, err
	}
	if l.Rowcount == nil {
		limit = -1
	}
	offset, err := num(l.Offset)
	return limit, offset, err
}

// finish orders, projects, de-duplicates and limits.
func (s *Session) finish(sc *scope, rows [][]sqltypes.Value, cols []outputCol, order sqlparser.OrderBy, distinct bool, limit, offset int, bind map[string]*querypb.BindVariable) (*sqltypes.Result, error) {
	proj := make([]*compiled, len(cols))
	for i, c := range cols {
		ce, err := s.compile(c.expr, sc)
		if err != nil {
			return nil, err
		}
		proj[i] = ce
	}
	// Sort keys: an output alias or position, else an expression.
	type key struct {
		out  int // ≥ 0: output column
		e    *compiled
		desc bool
	}
	keys := make([]key, len(order))
	for i, o := range order {
		k := key{out: -1, desc: o.Direction == sqlparser.DescOrder}
		if lit, ok := o.Expr.(*sqlparser.Literal); ok && lit.Type == sqlparser.IntVal {
			n, _ := strconv.Atoi(lit.Val)
			if n < 1 || n > len(cols) {
				return nil, errorf(ErBadField, "unknown column '%d' in 'order clause'", n)
			}
			k.out = n - 1
		} else if col, ok := o.Expr.(*sqlparser.ColName); ok && col.Qualifier.IsEmpty() {
			for ci, c := range cols {
				if strings.EqualFold(c.name, col.Name.String()) {
					if _, _, err := sc.lookup(col); err != nil || c.field == nil {
						k.out = ci
					}
					break
				}
			}
		}
		if k.out < 0 {
			ce, err := s.compile(o.Expr, sc)
			if err != nil {
				return nil, err
			}
			k.e = ce
		}
		keys[i] = k
	}
	env := s.env(bind)
	type outRow struct {
		vals, sortBy []sqltypes.Value
	}
	out := make([]outRow, 0, len(rows))
	for _, r := range rows {
		env.Row = r
		o := outRow{vals: make([]sqltypes.Value, len(proj))}
		for i, p := range proj {
			v, err := p.eval(env)
			if err != nil {
				return nil, err
			}
			o.vals[i] = v
		}
		for _, k := range keys {
			if k.out >= 0 {
				o.sortBy = append(o.sortBy, o.vals[k.out])
				continue
			}
			v, err := k.e.eval(env)
			if err != nil {
				return nil, err
			}
			o.sortBy = append(o.sortBy, v)
		}
		out = append(out, o)
	}
	if len(keys) > 0 {
		collEnv := s.e.env.CollationEnv()
		var sortErr error
		slices.SortStableFunc(out, func(a, b outRow) int {
			for i, k := range keys {
				c, err := evalengine.NullsafeCompare(a.sortBy[i], b.sortBy[i], collEnv, s.e.collation, nil)
				if err != nil {
					sortErr = err
				}
				if c != 0 {
					if k.desc {
						return -c
					}
					return c
				}
			}
			return 0
		})
		if sortErr != nil {
			return nil, sortErr
		}
	}
	res := &sqltypes.Result{Fields: make([]*querypb.Field, len(cols))}
	seen := map[string]bool{}
	skipped := 0
	for _, o := range out {
		if distinct {
			k := rowKey(o.vals)
			if seen[k] {
				continue
			}
			seen[k] = true
		}
		if skipped < offset {
			skipped++
			continue
		}
		if limit >= 0 && len(res.Rows) >= limit {
			break
		}
		res.Rows = append(res.Rows, o.vals)
	}
	for i, c := range cols {
		if c.field != nil {
			res.Fields[i] = c.field
			continue
		}
		typ := querypb.Type_VARCHAR
		for _, r := range res.Rows {
			if !r[i].IsNull() {
				typ = r[i].Type()
				break
			}
		}
		if len(res.Rows) > 0 && typ == querypb.Type_VARCHAR && res.Rows[0][i].IsNull() {
			typ = querypb.Type_NULL_TYPE
		}
		res.Fields[i] = &querypb.Field{Name: c.name, Type: typ}
	}
	normalizeTypes(res)
	return res, nil
}

// normalizeTypes gives every value of a column its field's type: the binary
// protocol encodes a value by its own type and clients decode it by the
// field's, so the two must agree. Integers of another width are re-typed;
// a column whose values differ otherwise is sent as text.
func normalizeTypes(res *sqltypes.Result) {
	for i, f := range res.Fields {
		mixed := false
		for _, r := range res.Rows {
			v := r[i]
			if v.IsNull() || v.Type() == f.Type {
				continue
			}
			if !(v.IsIntegral() && sqltypes.IsIntegral(f.Type)) {
				mixed = true
				break
			}
		}
		if mixed {
			f.Type = querypb.Type_VARCHAR
		}
		for _, r := range res.Rows {
			if v := r[i]; !v.IsNull() && v.Type() != f.Type {
				r[i] = sqltypes.MakeTrusted(f.Type, v.Raw())
			}
		}
	}
}

// rowKey is a byte string equal for rows whose values are equal (binary
// collation), for DISTINCT and grouping.
func rowKey(vals []sqltypes.Value) string {
	var b strings.Builder
	for _, v := range vals {
		if v.IsNull() {
			b.WriteString("N;")
			continue
		}
		raw := v.Raw()
		if v.IsIntegral() || v.IsDecimal() || v.IsFloat() {
			// Numbers equal in value share a key whatever their type.
			if f, err := strconv.ParseFloat(v.ToString(), 64); err == nil && !v.IsDecimal() {
				raw = strconv.AppendFloat(nil, f, 'g', -1, 64)
			} else if v.IsDecimal() {
				raw = []byte(normalizeDecimal(v.ToString()))
			}
			b.WriteString("n")
		} else {
			b.WriteString("s")
		}
		b.WriteString(strconv.Itoa(len(raw)))
		b.WriteByte(':')
		b.Write(raw)
	}
	return b.String()
}

func normalizeDecimal(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	if s == "-0" {
		s = "0"
	}
	return s
}

func lowerName(s string) string { return strings.ToLower(s) }
