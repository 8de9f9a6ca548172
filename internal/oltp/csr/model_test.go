package csr

import (
	"fmt"
	"math/rand"
	"testing"
)

// TestModel drives the registry with random selections, commits and
// recycling and compares every decision with an oracle that checks the
// consistency rules against every point ever accepted: an accepted point
// must keep them (soundness), and before any recycling a refused point
// must break them (completeness: the registry aborts nothing it need not).
func TestModel(t *testing.T) {
	for seed := int64(1); seed <= 200; seed++ {
		if err := runModel(seed, 300); err != nil {
			// Shrink to the shortest failing prefix of the history.
			n := 300
			for n > 1 && runModel(seed, n-1) != nil {
				n--
			}
			t.Fatalf("seed %d fails within %d steps: %v", seed, n, runModel(seed, n))
		}
	}
}

type modelPoint struct {
	anchor, lo, hi uint64 // a commit has lo == hi == c2
	commit         bool
}

// consistent reports whether p may join pts.
func consistent(pts []modelPoint, p modelPoint) bool {
	for _, q := range pts {
		a, b := q, p
		if b.anchor < a.anchor || (a.anchor == b.anchor && !a.commit && b.commit) {
			a, b = b, a
		}
		switch {
		case a.anchor == b.anchor && a.commit && b.commit:
			return false
		case a.anchor == b.anchor && !a.commit && !b.commit:
			// Readers at one anchor need not agree.
		case a.anchor == b.anchor: // a commit, b snapshot at the same anchor: b sees a
			if b.lo < a.hi {
				return false
			}
		case a.commit && b.commit:
			if a.hi >= b.lo {
				return false
			}
		case a.commit: // b a later snapshot: sees a
			if b.lo < a.hi {
				return false
			}
		case b.commit: // a an earlier snapshot: does not see b
			if b.lo <= a.hi {
				return false
			}
		default:
			if a.hi > b.lo {
				return false
			}
		}
	}
	return true
}

func runModel(seed int64, steps int) error {
	rng := rand.New(rand.NewSource(seed))
	r := New(1 + rng.Intn(6))
	var oracle []modelPoint
	var anchor, storage uint64 = 1, 1
	recycled := false
	for step := 0; step < steps; step++ {
		switch op := rng.Intn(10); {
		case op < 5: // a reader at a recent anchor selects a storage snapshot
			s := anchor - uint64(rng.Intn(int(min(anchor, 8))))
			b, err := r.Bounds(s)
			if err != nil {
				continue // recycled away
			}
			v := uint64(rng.Int63n(int64(storage + 3)))
			if rng.Intn(2) == 0 && b.Lower <= b.Upper {
				v = b.Lower + uint64(rng.Int63n(int64(min(b.Upper, storage+2)-b.Lower+1)))
			}
			p := modelPoint{anchor: s, lo: v, hi: v}
			// A reader's point widens the range at its anchor.
			for _, q := range oracle {
				if q.anchor == s && !q.commit {
					p.lo, p.hi = min(p.lo, q.lo), max(p.hi, q.hi)
				}
			}
			ok := consistent(without(oracle, s), p)
			err = r.Select(s, v)
			if err == nil && !ok {
				return fmt.Errorf("step %d: accepted snapshot %d→%d that breaks consistency", step, s, v)
			}
			if err != nil && ok && !recycled {
				return fmt.Errorf("step %d: refused snapshot %d→%d that keeps consistency: %v", step, s, v, err)
			}
			if err == nil {
				oracle = append(without(oracle, s), p)
			}
		case op < 9: // a cross-engine commit with fresh timestamps
			anchor += 1 + uint64(rng.Intn(3))
			c2 := storage - uint64(rng.Intn(int(min(storage, 4)))) + uint64(rng.Intn(4))
			storage = max(storage, c2) + uint64(rng.Intn(2))
			p := modelPoint{anchor: anchor, lo: c2, hi: c2, commit: true}
			ok := consistent(oracle, p)
			err := r.CommitCheck(anchor, c2)
			if err == nil && !ok {
				return fmt.Errorf("step %d: accepted commit %d→%d that breaks consistency", step, anchor, c2)
			}
			if err != nil && ok && !recycled {
				return fmt.Errorf("step %d: refused commit %d→%d that keeps consistency: %v", step, anchor, c2, err)
			}
			if err == nil {
				oracle = append(oracle, p)
			}
		default:
			oldest := anchor - uint64(rng.Intn(int(min(anchor, 10))))
			if r.Recycle(oldest, rng.Intn(3)) > 0 {
				recycled = true
			}
		}
	}
	return nil
}

// without drops the snapshot point at anchor s (its widened copy replaces it).
func without(pts []modelPoint, s uint64) []modelPoint {
	out := pts[:0:0]
	for _, q := range pts {
		if !(q.anchor == s && !q.commit) {
			out = append(out, q)
		}
	}
	return out
}
