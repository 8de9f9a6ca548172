package server_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// histRow is a row of a table without a source key: content columns a, b,
// f, gone (a column the source dropped), and Retina's generated key.
type histRow struct {
	a    int64
	b    any // nil or string
	f    float64
	gone any // nil or int64
}

type histKey [2]int64

func (r histRow) values(k histKey) []any {
	return []any{r.a, r.b, r.f, r.gone, k[0], k[1]}
}

// sameContent compares rows as the source names them: f as float4, gone
// only when compared.
func (r histRow) sameContent(o histRow, withGone bool) bool {
	return r.a == o.a && r.b == o.b && float32(r.f) == float32(o.f) && (!withGone || r.gone == o.gone)
}

// TestRowsFoundByContentModel replays random transactions of a table
// without a source key (inserts of duplicate rows, deletes and updates that
// name their row by content, some comparing a dropped column and some not,
// truncates, and now and then an operation naming a row that does not
// exist) in batches of several transactions while rows move to flushed
// blocks and files, and compares every committed state with a model that
// takes, among equal rows, the one with the smallest key. A failing
// transaction must leave the ones before it in its batch applied and
// nothing of itself or the ones after it.
func TestRowsFoundByContentModel(t *testing.T) {
	ctx := context.Background()
	n := servertest.OpenNodeWith(t, 16, 4)
	tb, err := n.Catalog.CreateTable(ctx, "hist", catalog.Schema{
		Columns: []catalog.Column{
			{Name: "a", Type: types.Of(types.Int64), Nullable: true},
			{Name: "b", Type: types.Of(types.String), Nullable: true},
			{Name: "f", Type: types.Of(types.Float32), Nullable: true},
			{Name: "gone", Type: types.Of(types.Int64), Nullable: true},
			{Name: "k1", Type: types.Of(types.Int64)},
			{Name: "k2", Type: types.Of(types.Int64)},
		},
		PrimaryKey:   []string{"k1", "k2"},
		GeneratedKey: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	const gone = 3
	rng := rand.New(rand.NewPCG(7, 11))
	randRow := func() histRow {
		r := histRow{a: rng.Int64N(3), f: []float64{0.1, 0.5}[rng.IntN(2)]}
		if b := rng.IntN(3); b > 0 {
			r.b = fmt.Sprint("b", b)
		}
		if rng.IntN(2) == 0 {
			r.gone = rng.Int64N(2)
		}
		return r
	}
	model := map[histKey]histRow{}
	// find is the model's choice: the smallest key among equal live rows.
	find := func(m map[histKey]histRow, want histRow, withGone bool) (histKey, bool) {
		var keys []histKey
		for k, r := range m {
			if r.sameContent(want, withGone) {
				keys = append(keys, k)
			}
		}
		if len(keys) == 0 {
			return histKey{}, false
		}
		return slices.MinFunc(keys, func(x, y histKey) int { return slices.Compare(x[:], y[:]) }), true
	}
	before := func(r histRow, withGone bool) ([]any, []int) {
		v := r.values(histKey{})
		v[4], v[5] = nil, nil // the source does not know Retina's key
		if !withGone {
			v[gone] = nil
			return v, []int{gone}
		}
		return v, nil
	}
	seq := int64(0)
	failures := 0
	for round := range 150 {
		txns := 1 + rng.IntN(4)
		rg, err := n.Txn.BeginMirror(ctx, txns)
		if err != nil {
			t.Fatal(err)
		}
		work := cloneHist(model)
		var states []map[histKey]histRow // the model after each transaction
		var ops []change.Op
		for i := range txns {
			ts := rg.First + uint64(i)
			seq++
			for j := range 1 + rng.IntN(5) {
				withGone := rng.IntN(2) == 0
				var live []histKey
				for k := range work {
					live = append(live, k)
				}
				slices.SortFunc(live, func(x, y histKey) int { return slices.Compare(x[:], y[:]) })
				switch p := rng.IntN(100); {
				case p < 3:
					ops = append(ops, change.Op{TS: ts, Table: tb.ID, Kind: change.Truncate})
					clear(work)
				case p < 8: // names a row that does not exist
					r := randRow()
					r.a = 99
					b, un := before(r, withGone)
					ops = append(ops, change.Op{TS: ts, Table: tb.ID, Kind: change.Delete, Before: b, Unmatched: un, ByContent: true})
				case p < 45 || len(live) == 0:
					k, r := histKey{seq, int64(j)}, randRow()
					ops = append(ops, change.Op{TS: ts, Table: tb.ID, Kind: change.Insert, Row: r.values(k)})
					work[k] = r
				default:
					target := work[live[rng.IntN(len(live))]]
					k, _ := find(work, target, withGone)
					b, un := before(target, withGone)
					if rng.IntN(2) == 0 {
						ops = append(ops, change.Op{TS: ts, Table: tb.ID, Kind: change.Delete, Before: b, Unmatched: un, ByContent: true})
						delete(work, k)
						break
					}
					r := randRow()
					after := r.values(histKey{})
					after[4], after[5] = nil, nil
					if !withGone {
						after[gone] = nil
						r.gone = nil
					}
					ops = append(ops, change.Op{TS: ts, Table: tb.ID, Kind: change.Update, Row: after, Before: b, Unmatched: un, ByContent: true})
					work[k] = r
				}
				if o := ops[len(ops)-1]; o.Kind == change.Delete && o.Before != nil && o.Before[0] == int64(99) {
					work = nil // this transaction fails
				}
				if work == nil {
					break
				}
			}
			if work == nil {
				break
			}
			states = append(states, cloneHist(work))
		}
		err = n.Replayers[0].Apply(ctx, replay.Batch{Bucket: 0, Buckets: 1, Ops: ops, Stable: rg.First})
		applied := len(states)
		if work == nil { // the transaction after the last state fails
			var oe *replay.OpError
			if !errors.As(err, &oe) || !errors.Is(err, index.ErrConflict) || oe.TS != rg.First+uint64(applied) || oe.Table != "hist" {
				t.Fatalf("round %d: a delete of a missing row in transaction %d: %v", round, applied, err)
			}
			if err := n.Replayers[0].Rollback(ctx, 0, oe.TS); err != nil {
				t.Fatal(err)
			}
			failures++
		} else if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i := range txns {
			ts := rg.First + uint64(i)
			commit := n.Txn.CommitMirror
			if i >= applied {
				commit = n.Txn.AbandonMirror
			}
			if err := commit(ctx, ts); err != nil {
				t.Fatal(err)
			}
		}
		if applied > 0 {
			model = states[applied-1]
		}
		if round%10 == 9 {
			if err := n.Replayers[0].Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
		got := map[histKey]histRow{}
		snap := n.Catalog.Snapshot()
		tbNow, _ := snap.TableByID(tb.ID)
		err = n.Scanner.EachRow(ctx, tbNow, snap.LiveFiles(tb.ID), rg.Last(), func(v []any) error {
			k := histKey{v[4].(int64), v[5].(int64)}
			if _, dup := got[k]; dup {
				return fmt.Errorf("key %v twice", k)
			}
			got[k] = histRow{a: v[0].(int64), b: v[1], f: v[2].(float64), gone: v[3]}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for k, r := range model {
			g, ok := got[k]
			if !ok || !g.sameContent(r, true) {
				t.Fatalf("round %d: key %v holds %+v (present %v), want %+v", round, k, g, ok, r)
			}
		}
		if len(got) != len(model) {
			t.Fatalf("round %d: %d rows, want %d", round, len(got), len(model))
		}
	}
	if failures == 0 {
		t.Fatal("no transaction failed: the test does not cover failures")
	}
}

func cloneHist(m map[histKey]histRow) map[histKey]histRow {
	if m == nil {
		return map[histKey]histRow{}
	}
	out := make(map[histKey]histRow, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
