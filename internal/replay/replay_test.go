package replay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/scan"
	"github.com/retinadb/retina/internal/txn"
	"github.com/retinadb/retina/internal/types"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

type env struct {
	cat   *catalog.Catalog
	idx   *index.Store
	store *lake.Store
	rp    *replay.Replayer
	sc    *scan.Scanner
	table *catalog.Table
}

// newEnv wires a replayer over a real catalog, index and in-memory lake with
// tiny blocks and files, so flushes and combinations happen all the time.
func newEnv(t testing.TB, backend string, tolerate bool, blockRows, fileBlocks int) *env {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	cat, err := catalog.Open(dir + "/catalog")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	idx, err := index.Open(index.Config{Backend: backend, Dir: dir + "/index", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idx.Close() })
	store, err := lake.Open(ctx, "mem://", lake.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	tb, err := cat.CreateTable(ctx, "account", catalog.Schema{
		Columns: []catalog.Column{
			{Name: "id", Type: types.Of(types.Int64)},
			{Name: "bucket", Type: types.Of(types.Int32)},
			{Name: "balance", Type: types.Of(types.Int64)},
			{Name: "note", Type: types.Of(types.String), Nullable: true},
		},
		PrimaryKey: []string{"id"},
	})
	if err != nil {
		t.Fatal(err)
	}
	rp, err := replay.New(replay.Config{ID: 1, Catalog: cat, Index: idx, Lake: store,
		BlockRows: blockRows, FileBlocks: fileBlocks, FlushWorkers: 2, Tolerate: tolerate, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.Close(context.Background()) })
	sc := scan.New(store, func(id uint32) (scan.Owner, bool) { return rp, id == 1 }, nil)
	return &env{cat: cat, idx: idx, store: store, rp: rp, sc: sc, table: tb}
}

type row struct {
	bucket  int64
	balance int64
	note    any
}

// read scans the table at a snapshot into a map id → row.
func (e *env) read(t testing.TB, snapshot uint64) map[int64]row {
	t.Helper()
	s := e.cat.Snapshot()
	out := map[int64]row{}
	_, err := e.sc.Scan(context.Background(), scan.Request{
		Table: e.table, Files: s.LiveFiles(e.table.ID), Snapshot: snapshot, Columns: []int{0, 1, 2, 3},
	}, func(rec arrow.RecordBatch) error {
		defer rec.Release()
		ids := rec.Column(0).(*array.Int64)
		for i := range int(rec.NumRows()) {
			id := ids.Value(i)
			if _, dup := out[id]; dup {
				return fmt.Errorf("id %d seen twice at snapshot %d", id, snapshot)
			}
			var note any
			if !rec.Column(3).IsNull(i) {
				note = rec.Column(3).(*array.String).Value(i)
			}
			out[id] = row{int64(rec.Column(1).(*array.Int32).Value(i)), rec.Column(2).(*array.Int64).Value(i), note}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func values(id int64, r row) []any {
	return []any{id, r.bucket, r.balance, r.note}
}

// TestModelBased applies random transactions (inserts, updates with and
// without key changes, deletes, one key touched several times in one
// transaction) to the replayer and to a map, and compares the visible rows
// at random snapshots while flush and combination run.
func TestModelBased(t *testing.T) {
	for _, backend := range []string{"memory", "pebble"} {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, backend, false, 16, 4)
			rng := rand.New(rand.NewPCG(42, 7))
			state := map[int64]row{}
			history := []map[int64]row{{}} // state after ts (index = ts)
			nextID := int64(1)
			lwm := uint64(0) // snapshots below it were collected
			ctx := context.Background()
			for ts := uint64(1); ts <= 400; ts++ {
				var ops []replay.Op
				for range 1 + rng.IntN(6) {
					keys := slices.Sorted(maps.Keys(state))
					switch k := rng.IntN(10); {
					case k < 4 || len(keys) == 0:
						id := nextID
						nextID++
						r := row{int64(id % 4), rng.Int64N(1000), []any{nil, "n"}[rng.IntN(2)]}
						state[id] = r
						ops = append(ops, replay.Op{TS: ts, Table: e.table.ID, Kind: replay.Insert, Row: values(id, r)})
					case k < 7:
						id := keys[rng.IntN(len(keys))]
						r := state[id]
						r.balance = rng.Int64N(1000)
						state[id] = r
						ops = append(ops, replay.Op{TS: ts, Table: e.table.ID, Kind: replay.Update, Row: values(id, r)})
					case k < 8: // primary-key change
						id := keys[rng.IntN(len(keys))]
						r := state[id]
						delete(state, id)
						nid := nextID
						nextID++
						state[nid] = r
						ops = append(ops, replay.Op{TS: ts, Table: e.table.ID, Kind: replay.Update, Key: []any{id}, Row: values(nid, r)})
					default:
						id := keys[rng.IntN(len(keys))]
						delete(state, id)
						ops = append(ops, replay.Op{TS: ts, Table: e.table.ID, Kind: replay.Delete, Key: []any{id}})
					}
				}
				if err := e.rp.Apply(ctx, ops); err != nil {
					t.Fatalf("ts %d: %v", ts, err)
				}
				history = append(history, maps.Clone(state))
				if ts%37 == 0 {
					for range 3 {
						s := lwm + uint64(rng.IntN(int(ts-lwm)+1))
						if got, want := e.read(t, s), history[s]; !maps.Equal(got, want) {
							t.Fatalf("after ts %d, snapshot %d: %d rows, want %d\n got %v\nwant %v", ts, s, len(got), len(want), got, want)
						}
					}
				}
				if ts%100 == 0 {
					lwm = ts - 50
					e.rp.Collect(lwm)
				}
			}
			if err := e.rp.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			for _, s := range []uint64{350, 399, 400} {
				if got := e.read(t, s); !maps.Equal(got, history[s]) {
					t.Fatalf("after flush, snapshot %d differs", s)
				}
			}
			buf, _ := e.rp.Buffer(e.table.ID)
			if st := buf.Stats(); st.Combined == 0 || st.Flushed == 0 {
				t.Fatalf("no flush or combination happened: %+v", st)
			}
		})
	}
}

// TestInsertThenDeleteInOneTransaction leaves no row, and a second insert of
// a live key or a delete of a missing key is a typed error naming them.
func TestOrderingAndErrors(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "memory", false, 16, 4)
	tid := e.table.ID
	ops := []replay.Op{
		{TS: 1, Table: tid, Kind: replay.Insert, Row: []any{int64(1), int64(0), int64(5), nil}},
		{TS: 1, Table: tid, Kind: replay.Delete, Key: []any{int64(1)}},
		{TS: 1, Table: tid, Kind: replay.Insert, Row: []any{int64(2), int64(0), int64(7), nil}},
		{TS: 1, Table: tid, Kind: replay.Update, Row: []any{int64(2), int64(0), int64(8), "x"}},
	}
	if err := e.rp.Apply(ctx, ops); err != nil {
		t.Fatal(err)
	}
	if got := e.read(t, 1); len(got) != 1 || got[2].balance != 8 {
		t.Fatalf("visible at 1: %v", got)
	}
	err := e.rp.Apply(ctx, []replay.Op{{TS: 2, Table: tid, Kind: replay.Insert, Row: []any{int64(2), int64(0), int64(1), nil}}})
	var oe *replay.OpError
	if !errors.As(err, &oe) || !errors.Is(err, index.ErrConflict) || oe.TS != 2 || oe.Table != "account" {
		t.Fatalf("insert of a live key: %v", err)
	}
	err = e.rp.Apply(ctx, []replay.Op{{TS: 3, Table: tid, Kind: replay.Delete, Key: []any{int64(99)}}})
	if !errors.As(err, &oe) || fmt.Sprint(oe.Key) != "[99]" {
		t.Fatalf("delete of a missing key: %v", err)
	}
	err = e.rp.Apply(ctx, []replay.Op{{TS: 4, Table: tid, Kind: replay.Insert, Row: []any{"bad", int64(0), int64(1), nil}}})
	if !errors.Is(err, replay.ErrOp) {
		t.Fatalf("type mismatch: %v", err)
	}
	// The rejected insert at ts 2 never becomes visible.
	if got := e.read(t, 10); len(got) != 1 || got[2].balance != 8 {
		t.Fatalf("after rejected ops: %v", got)
	}
}

func TestTolerateSkipsAndCounts(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "memory", true, 16, 4)
	tid := e.table.ID
	ops := []replay.Op{
		{TS: 1, Table: tid, Kind: replay.Insert, Row: []any{int64(1), int64(0), int64(5), nil}},
		{TS: 1, Table: tid, Kind: replay.Insert, Row: []any{int64(1), int64(0), int64(6), nil}}, // duplicate
		{TS: 1, Table: tid, Kind: replay.Delete, Key: []any{int64(50)}},                         // missing
		{TS: 1, Table: tid, Kind: replay.Insert, Row: []any{int64(3), nil, int64(1), nil}},      // NULL in NOT NULL
		{TS: 1, Table: tid, Kind: replay.Insert, Row: []any{int64(4), int64(0), int64(9), nil}},
	}
	if err := e.rp.Apply(ctx, ops); err != nil {
		t.Fatal(err)
	}
	if st := e.rp.Stats(); st.Tolerated != 3 || st.Inserts != 2 {
		t.Fatalf("stats %+v", st)
	}
	got := e.read(t, 1)
	if len(got) != 2 || got[1].balance != 5 || got[4].balance != 9 {
		t.Fatalf("visible: %v", got)
	}
}

// TestConcurrentBucketsReadersAndFlush: buckets apply transfer transactions
// in parallel through the real transaction service, while readers scan at
// query snapshots and check every bucket's balance total and row count.
func TestConcurrentBucketsReadersAndFlush(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "memory", false, 256, 8)
	fs, err := txn.OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	svc, err := txn.NewLocal(ctx, fs, txn.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	const buckets, perBucket, start = 4, 20, 100
	// Load: one transaction per bucket.
	for b := range buckets {
		r, _ := svc.BeginMirror(ctx, 1)
		var ops []replay.Op
		for i := range perBucket {
			id := int64(b*1000 + i)
			ops = append(ops, replay.Op{TS: r.First, Table: e.table.ID, Kind: replay.Insert, Row: []any{id, int64(b), int64(start), nil}})
		}
		if err := e.rp.Apply(ctx, ops); err != nil {
			t.Fatal(err)
		}
		svc.CommitMirror(ctx, r.First)
	}
	dur := 2 * time.Second
	if testing.Short() {
		dur = 700 * time.Millisecond
	}
	run, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	var wg sync.WaitGroup
	for b := range buckets {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(b), 3))
			bal := make([]int64, perBucket)
			for i := range bal {
				bal[i] = start
			}
			for run.Err() == nil {
				r, err := svc.BeginMirror(ctx, 1)
				if err != nil {
					t.Error(err)
					return
				}
				i, j := rng.IntN(perBucket), rng.IntN(perBucket)
				amt := rng.Int64N(10)
				bal[i] -= amt
				bal[j] += amt
				ops := []replay.Op{
					{TS: r.First, Table: e.table.ID, Kind: replay.Update, Row: []any{int64(b*1000 + i), int64(b), bal[i], nil}},
					{TS: r.First, Table: e.table.ID, Kind: replay.Update, Row: []any{int64(b*1000 + j), int64(b), bal[j], "moved"}},
				}
				if err := e.rp.Apply(ctx, ops); err != nil {
					t.Error(err)
					return
				}
				if err := svc.CommitMirror(ctx, r.First); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var scans int
	var mu sync.Mutex
	for range 3 {
		wg.Go(func() {
			for run.Err() == nil {
				q, err := svc.BeginQuery(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				got := e.read(t, q.Snapshot)
				svc.EndQuery(ctx, q.Handle)
				sums, counts := map[int64]int64{}, map[int64]int{}
				for _, r := range got {
					sums[r.bucket] += r.balance
					counts[r.bucket]++
				}
				for b := range int64(buckets) {
					if sums[b] != perBucket*start || counts[b] != perBucket {
						t.Errorf("snapshot %d bucket %d: sum %d count %d", q.Snapshot, b, sums[b], counts[b])
						return
					}
				}
				mu.Lock()
				scans++
				mu.Unlock()
			}
		})
	}
	wg.Go(func() { // memory GC below LWM
		for run.Err() == nil {
			w, _ := svc.Watermarks(ctx)
			e.rp.Collect(w.LWM)
			time.Sleep(20 * time.Millisecond)
		}
	})
	wg.Wait()
	if scans < 5 {
		t.Fatalf("only %d scans", scans)
	}
	buf, _ := e.rp.Buffer(e.table.ID)
	t.Logf("%d scans; buffer %+v; replayer %+v", scans, buf.Stats(), e.rp.Stats())
}
