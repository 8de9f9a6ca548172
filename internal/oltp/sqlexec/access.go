package sqlexec

import (
	"context"

	"vitess.io/vitess/go/vt/sqlparser"
	"vitess.io/vitess/go/vt/vtgate/evalengine"

	"github.com/retinadb/retina/internal/oltp/sqlstore"
)

// Access paths
//
// For each source, in FROM order, the planner picks the index (primary or
// secondary) whose leading columns the WHERE and ON conjuncts bind best:
// by equality, IN lists or tuple IN to values computed from constants,
// bind variables and earlier sources; then, optionally, a range on the next
// column. Every conjunct is still evaluated on every fetched row, so an
// access path only has to cover the matching rows, never to be exact; when
// a bound cannot be used as is (a value of another type class than the
// column), the source is scanned whole.

// binder gives values to some key positions: one alternative per row of
// alts, each with one expression per position.
type binder struct {
	pos  []int
	alts [][]*compiled
}

// access is the plan for fetching one source.
type access struct {
	ix      uint32 // 0: primary key
	keyCols []int  // the index's columns, in key order
	keyLen  int    // leading key columns bound by binders
	binders []binder
	lo, hi  []*compiled // range bounds on keyCols[keyLen] (inclusive supersets)
	// exact: the binders are single equalities and every conjunct of the
	// source is one of them, so a limit can be pushed into the scan.
	exact bool
}

type conjunct struct {
	e *compiled
	// ast is the conjunct as written, for matching key columns.
	ast sqlparser.Expr
}

// colOf reports whether e is a column of source si and which.
func colOf(sc *scope, si int, e sqlparser.Expr) (int, bool) {
	col, ok := e.(*sqlparser.ColName)
	if !ok {
		return 0, false
	}
	s, p, err := sc.lookup(col)
	if err != nil || s != si {
		return 0, false
	}
	return p - sc.sources[si].off, true
}

// before compiles e if it reads only sources already placed in the join
// order (known when source si is fetched).
func (s *Session) before(sc *scope, placed uint64, e sqlparser.Expr) (*compiled, bool) {
	c, err := s.compile(e, sc)
	if err != nil || c.srcs&^placed != 0 {
		return nil, false
	}
	return c, true
}

// planAccess chooses how to fetch source si given the conjuncts.
func (s *Session) planAccess(sc *scope, si int, placed uint64, conj []sqlparser.Expr) access {
	t := sc.sources[si].t
	type cand struct {
		ix   uint32
		cols []int
	}
	var cands []cand
	if !t.HiddenPK() {
		cands = append(cands, cand{0, t.PK})
	}
	for _, ix := range t.Indexes {
		cands = append(cands, cand{ix.ID, ix.Columns})
	}
	best := access{}
	bestScore := -1
	for _, cd := range cands {
		a := s.planIndex(sc, si, placed, cd.ix, cd.cols, conj)
		if score := a.score(); score > bestScore {
			best, bestScore = a, score
		}
	}
	if bestScore <= 0 {
		return access{exact: len(conj) == 0, keyCols: t.PK}
	}
	return best
}

// score ranks access paths: more bound key columns first, then a range,
// then a whole key (at most one row per alternative).
func (a *access) score() int {
	score := a.keyLen * 4
	if a.lo != nil || a.hi != nil {
		score += 2
	}
	if a.keyLen == len(a.keyCols) && a.keyLen > 0 {
		score++
	}
	return score
}

func (s *Session) planIndex(sc *scope, si int, placed uint64, ix uint32, cols []int, conj []sqlparser.Expr) access {
	a := access{ix: ix, keyCols: cols}
	used := make([]bool, len(conj))
	exact := true
	bound := map[int]bool{}
	for k, col := range cols {
		found := false
		for ci, c := range conj {
			if used[ci] {
				continue
			}
			cmp, ok := c.(*sqlparser.ComparisonExpr)
			if !ok {
				continue
			}
			switch cmp.Operator {
			case sqlparser.EqualOp:
				for _, pair := range [2][2]sqlparser.Expr{{cmp.Left, cmp.Right}, {cmp.Right, cmp.Left}} {
					if c2, ok := colOf(sc, si, pair[0]); ok && c2 == col {
						if v, ok := s.before(sc, placed, pair[1]); ok {
							a.binders = append(a.binders, binder{pos: []int{k}, alts: [][]*compiled{{v}}})
							used[ci], found = true, true
							break
						}
					}
				}
			case sqlparser.InOp:
				tuple, ok := cmp.Right.(sqlparser.ValTuple)
				if !ok {
					continue
				}
				if c2, ok := colOf(sc, si, cmp.Left); ok && c2 == col {
					var alts [][]*compiled
					for _, v := range tuple {
						cv, ok := s.before(sc, placed, v)
						if !ok {
							alts = nil
							break
						}
						alts = append(alts, []*compiled{cv})
					}
					if alts != nil {
						a.binders = append(a.binders, binder{pos: []int{k}, alts: alts})
						used[ci], found, exact = true, true, false
					}
				} else if lt, ok := cmp.Left.(sqlparser.ValTuple); ok {
					if b, ok := s.tupleBinder(sc, si, placed, cols, lt, tuple); ok && containsPos(b.pos, k) && !anyBound(bound, b.pos) {
						a.binders = append(a.binders, b)
						used[ci], found, exact = true, true, false
						for _, p := range b.pos {
							bound[p] = true
						}
					}
				}
			}
			if found {
				break
			}
		}
		if !found && !bound[k] {
			break
		}
		bound[k] = true
		a.keyLen = k + 1
	}
	// A tuple binder must lie within the bound prefix.
	for _, b := range a.binders {
		for _, p := range b.pos {
			if p >= a.keyLen {
				return access{ix: ix, keyCols: cols}
			}
		}
	}
	if a.keyLen < len(cols) {
		col := cols[a.keyLen]
		for ci, c := range conj {
			if used[ci] {
				continue
			}
			switch c := c.(type) {
			case *sqlparser.ComparisonExpr:
				op := c.Operator
				l, r := c.Left, c.Right
				if _, ok := colOf(sc, si, r); ok {
					l, r = r, l
					switch op {
					case sqlparser.LessThanOp:
						op = sqlparser.GreaterThanOp
					case sqlparser.LessEqualOp:
						op = sqlparser.GreaterEqualOp
					case sqlparser.GreaterThanOp:
						op = sqlparser.LessThanOp
					case sqlparser.GreaterEqualOp:
						op = sqlparser.LessEqualOp
					}
				}
				c2, ok := colOf(sc, si, l)
				if !ok || c2 != col {
					continue
				}
				v, ok := s.before(sc, placed, r)
				if !ok {
					continue
				}
				switch op {
				case sqlparser.LessThanOp, sqlparser.LessEqualOp:
					a.hi = append(a.hi, v)
				case sqlparser.GreaterThanOp, sqlparser.GreaterEqualOp:
					a.lo = append(a.lo, v)
				}
			case *sqlparser.BetweenExpr:
				if !c.IsBetween {
					continue
				}
				if c2, ok := colOf(sc, si, c.Left); ok && c2 == col {
					lo, ok1 := s.before(sc, placed, c.From)
					hi, ok2 := s.before(sc, placed, c.To)
					if ok1 && ok2 {
						a.lo, a.hi = append(a.lo, lo), append(a.hi, hi)
					}
				}
			}
		}
	}
	for ci := range conj {
		if !used[ci] {
			exact = false
		}
	}
	a.exact = exact && a.lo == nil && a.hi == nil
	return a
}

func containsPos(ps []int, p int) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

func anyBound(bound map[int]bool, ps []int) bool {
	for _, p := range ps {
		if bound[p] {
			return true
		}
	}
	return false
}

// tupleBinder handles (a, b) IN ((1, 2), (3, 4)) where a and b are key
// columns of source si.
func (s *Session) tupleBinder(sc *scope, si int, placed uint64, cols []int, left, right sqlparser.ValTuple) (binder, bool) {
	var b binder
	for _, e := range left {
		c, ok := colOf(sc, si, e)
		if !ok {
			return b, false
		}
		k := -1
		for i, kc := range cols {
			if kc == c {
				k = i
			}
		}
		if k < 0 || containsPos(b.pos, k) {
			return b, false
		}
		b.pos = append(b.pos, k)
	}
	for _, row := range right {
		tup, ok := row.(sqlparser.ValTuple)
		if !ok || len(tup) != len(left) {
			return b, false
		}
		alt := make([]*compiled, len(tup))
		for i, v := range tup {
			if alt[i], ok = s.before(sc, placed, v); !ok {
				return b, false
			}
		}
		b.alts = append(b.alts, alt)
	}
	return b, len(b.alts) > 0
}

// ranges evaluates the plan for the current outer row into key ranges, or
// nil with ok false when the source must be scanned whole.
func (a *access) ranges(t *sqlstore.Table, env *evalengine.ExpressionEnv) ([]sqlstore.Range, bool, error) {
	if a.keyLen == 0 && a.lo == nil && a.hi == nil {
		return nil, false, nil
	}
	combos := [][]any{make([]any, a.keyLen)}
	for _, b := range a.binders {
		var next [][]any
		for _, alt := range b.alts {
			vals := make([]any, len(alt))
			for i, e := range alt {
				v, err := e.eval(env)
				if err != nil {
					return nil, false, err
				}
				x, ok := keyValue(t, &t.Columns[a.keyCols[b.pos[i]]], v)
				if !ok {
					return nil, false, nil
				}
				vals[i] = x
			}
			for _, c := range combos {
				nc := append([]any(nil), c...)
				for i, p := range b.pos {
					nc[p] = vals[i]
				}
				next = append(next, nc)
			}
		}
		combos = next
	}
	// Every bound must hold, so any one usable bound covers the matches.
	bound := func(es []*compiled) (any, bool, error) {
		for _, e := range es {
			v, err := e.eval(env)
			if err != nil {
				return nil, false, err
			}
			if v.IsNull() {
				continue // matches nothing; the filter says so
			}
			if x, ok := keyValue(t, &t.Columns[a.keyCols[a.keyLen]], v); ok {
				return x, true, nil
			}
		}
		return nil, false, nil
	}
	lo, hasLo, err := bound(a.lo)
	if err != nil {
		return nil, false, err
	}
	hi, hasHi, err := bound(a.hi)
	if err != nil {
		return nil, false, err
	}
	seen := map[string]bool{}
	var out []sqlstore.Range
	for _, c := range combos {
		prefix, err := sqlstore.KeyPrefix(t, a.ix, c)
		if err != nil {
			return nil, false, err
		}
		rg := sqlstore.Range{Index: a.ix, Lo: prefix, Hi: sqlstore.KeyEnd(prefix)}
		if hasLo {
			if rg.Lo, err = sqlstore.KeyPrefix(t, a.ix, append(append([]any(nil), c...), lo)); err != nil {
				return nil, false, err
			}
		}
		if hasHi {
			k, err := sqlstore.KeyPrefix(t, a.ix, append(append([]any(nil), c...), hi))
			if err != nil {
				return nil, false, err
			}
			rg.Hi = sqlstore.KeyEnd(k)
		}
		id := string(rg.Lo) + "\x00" + string(rg.Hi)
		if seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, rg)
	}
	return out, true, nil
}

// fetch reads the rows of one source for the current outer row.
func fetch(ctx context.Context, rows sqlstore.Rows, t *sqlstore.Table, a *access, env *evalengine.ExpressionEnv, limit int) ([]sqlstore.Row, error) {
	rgs, ok, err := a.ranges(t, env)
	if err != nil {
		return nil, err
	}
	if !ok {
		return rows.Scan(ctx, t, sqlstore.FullRange(t), limit)
	}
	if len(rgs) != 1 {
		limit = 0
	}
	var out []sqlstore.Row
	for _, rg := range rgs {
		if a.keyLen == len(a.keyCols) && rg.Index == 0 && a.lo == nil && a.hi == nil {
			// A full primary key: a point read.
			r, err := rows.ScanPoint(ctx, t, rg)
			if err != nil {
				return nil, err
			}
			out = append(out, r...)
			continue
		}
		r, err := rows.Scan(ctx, t, rg, limit)
		if err != nil {
			return nil, err
		}
		out = append(out, r...)
	}
	return out, nil
}
