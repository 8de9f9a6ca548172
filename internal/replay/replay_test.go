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
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
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
func newEnv(t testing.TB, backend string, blockRows, fileBlocks int) *env {
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
	// A tiny undo bound: batches of a few operations spill their older
	// undo records to disk, so every rollback here reads some back.
	rp, err := replay.New(replay.Config{ID: 1, Catalog: cat, Index: idx, Lake: store,
		BlockRows: blockRows, FileBlocks: fileBlocks, FlushWorkers: 2, UndoInMemory: 8, UndoDir: t.TempDir(), Logger: quiet()})
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

// one applies a batch of one bucket (of one).
func (e *env) apply(ctx context.Context, stable uint64, ops ...change.Op) error {
	return e.rp.Apply(ctx, replay.Batch{Bucket: 0, Buckets: 1, Ops: ops, Stable: stable})
}

// TestModelBased applies random transactions (inserts, upserts, updates
// with and without key changes, deletes, truncates, one key touched several
// times in one transaction) in batches of several transactions to the
// replayer and to a map, and compares the visible rows at random snapshots
// while flush and combination run. Some transactions carry a bad operation
// somewhere among good ones: Apply must report that transaction's timestamp
// with everything before it applied, and Rollback must leave no trace of it
// or of the transactions after it in the batch, at any snapshot.
func TestModelBased(t *testing.T) {
	for _, backend := range []string{"memory", "pebble"} {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, backend, 16, 4)
			rng := rand.New(rand.NewPCG(42, 7))
			state := map[int64]row{}
			history := []map[int64]row{{}} // state after ts (index = ts)
			nextID := int64(1)
			lwm := uint64(0) // snapshots below it were collected
			ctx := context.Background()
			rollbacks := 0
			for ts := uint64(1); ts <= 600; {
				first := ts
				var ops []change.Op
				work := maps.Clone(state)
				states := []map[int64]row{} // after each transaction of the batch
				badTS := uint64(0)
				for range 1 + rng.IntN(3) {
					n := 1 + rng.IntN(6)
					bad := -1
					if badTS == 0 && rng.IntN(6) == 0 {
						bad = rng.IntN(n)
						badTS = ts
					}
					for i := range n {
						if i == bad {
							ops = append(ops, badOp(rng, e.table.ID, ts, work))
						}
						ops = append(ops, randomOp(rng, e.table.ID, ts, work, &nextID))
					}
					states = append(states, maps.Clone(work))
					ts++
				}
				err := e.apply(ctx, first, ops...)
				if badTS == 0 {
					if err != nil {
						t.Fatalf("ts %d..%d: %v", first, ts-1, err)
					}
				} else {
					var oe *replay.OpError
					if !errors.As(err, &oe) || oe.TS != badTS {
						t.Fatalf("batch %d..%d with a bad transaction at %d: got %v", first, ts-1, badTS, err)
					}
					if got, want := e.read(t, badTS-1), states[max(int(badTS-first)-1, 0)]; badTS > first && !maps.Equal(got, want) {
						t.Fatalf("before rollback, snapshot %d: transactions below the failure are not all applied", badTS-1)
					}
					if err := e.rp.Rollback(ctx, 0, badTS); err != nil {
						t.Fatal(err)
					}
					rollbacks++
				}
				for at := first; at < ts; at++ {
					if badTS == 0 || at < badTS {
						state = states[at-first]
					}
					history = append(history, maps.Clone(state))
				}
				if rng.IntN(8) == 0 {
					for range 3 {
						s := lwm + uint64(rng.IntN(int(ts-1-lwm)+1))
						if got, want := e.read(t, s), history[s]; !maps.Equal(got, want) {
							t.Fatalf("after ts %d, snapshot %d: %d rows, want %d\n got %v\nwant %v", ts-1, s, len(got), len(want), got, want)
						}
					}
				}
				if ts > 100 && rng.IntN(20) == 0 {
					lwm = ts - 50
					e.rp.Collect(lwm)
				}
			}
			if err := e.rp.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			last := uint64(len(history) - 1)
			for s := lwm; s <= last; s++ {
				if got := e.read(t, s); !maps.Equal(got, history[s]) {
					t.Fatalf("after flush, snapshot %d differs", s)
				}
			}
			buf, _ := e.rp.Buffer(e.table.ID)
			if st := buf.Stats(); st.Combined == 0 || st.Flushed == 0 || rollbacks == 0 {
				t.Fatalf("no flush, combination or rollback happened: %+v, %d rollbacks", st, rollbacks)
			}
			t.Logf("%d transactions, %d rollbacks", last, rollbacks)
		})
	}
}

// randomOp makes one good operation against work and applies it there.
func randomOp(rng *rand.Rand, table uint32, ts uint64, work map[int64]row, nextID *int64) change.Op {
	keys := slices.Sorted(maps.Keys(work))
	newRow := func() row { return row{int64(rng.IntN(4)), rng.Int64N(1000), []any{nil, "n"}[rng.IntN(2)]} }
	switch k := rng.IntN(40); {
	case k < 14 || len(keys) == 0:
		id := *nextID
		*nextID++
		r := newRow()
		work[id] = r
		return change.Op{TS: ts, Table: table, Kind: change.Insert, Row: values(id, r)}
	case k < 17: // a snapshot read: a key that exists or not
		id := keys[rng.IntN(len(keys))]
		if rng.IntN(2) == 0 {
			id = *nextID
			*nextID++
		}
		r := newRow()
		work[id] = r
		return change.Op{TS: ts, Table: table, Kind: change.Upsert, Row: values(id, r)}
	case k < 27:
		id := keys[rng.IntN(len(keys))]
		r := work[id]
		r.balance = rng.Int64N(1000)
		work[id] = r
		return change.Op{TS: ts, Table: table, Kind: change.Update, Row: values(id, r)}
	case k < 31: // primary-key change
		id := keys[rng.IntN(len(keys))]
		r := work[id]
		delete(work, id)
		nid := *nextID
		*nextID++
		work[nid] = r
		return change.Op{TS: ts, Table: table, Kind: change.Update, Key: []any{id}, Row: values(nid, r)}
	case k < 39:
		id := keys[rng.IntN(len(keys))]
		delete(work, id)
		return change.Op{TS: ts, Table: table, Kind: change.Delete, Key: []any{id}}
	default:
		clear(work)
		return change.Op{TS: ts, Table: table, Kind: change.Truncate}
	}
}

// badOp makes an operation that cannot be applied to work.
func badOp(rng *rand.Rand, table uint32, ts uint64, work map[int64]row) change.Op {
	keys := slices.Sorted(maps.Keys(work))
	switch k := rng.IntN(4); {
	case k == 0 && len(keys) > 0: // insert of a live key
		id := keys[rng.IntN(len(keys))]
		return change.Op{TS: ts, Table: table, Kind: change.Insert, Row: values(id, row{0, 1, nil})}
	case k == 1: // update of a key that does not exist
		return change.Op{TS: ts, Table: table, Kind: change.Update, Row: values(-1, row{0, 1, nil})}
	case k == 2: // a value of the wrong type
		return change.Op{TS: ts, Table: table, Kind: change.Insert, Row: []any{int64(-2), "not a number", int64(1), nil}}
	}
	return change.Op{TS: ts, Table: table, Kind: change.Delete, Key: []any{int64(-3)}}
}

// TestOrderingAndErrors: an insert then a delete of one key in one
// transaction leaves no row, and a second insert of a live key, a delete of
// a missing key or a value of the wrong type is a typed error naming them;
// after the rollback nothing of the failed transaction is visible.
func TestOrderingAndErrors(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "memory", 16, 4)
	tid := e.table.ID
	ops := []change.Op{
		{TS: 1, Table: tid, Kind: change.Insert, Row: []any{int64(1), int64(0), int64(5), nil}},
		{TS: 1, Table: tid, Kind: change.Delete, Key: []any{int64(1)}},
		{TS: 1, Table: tid, Kind: change.Insert, Row: []any{int64(2), int64(0), int64(7), nil}},
		{TS: 1, Table: tid, Kind: change.Update, Row: []any{int64(2), int64(0), int64(8), "x"}},
	}
	if err := e.apply(ctx, 1, ops...); err != nil {
		t.Fatal(err)
	}
	if got := e.read(t, 1); len(got) != 1 || got[2].balance != 8 {
		t.Fatalf("visible at 1: %v", got)
	}
	var oe *replay.OpError
	err := e.apply(ctx, 2,
		change.Op{TS: 2, Table: tid, Kind: change.Insert, Row: []any{int64(3), int64(0), int64(1), nil}},
		change.Op{TS: 2, Table: tid, Kind: change.Insert, Row: []any{int64(2), int64(0), int64(1), nil}})
	if !errors.As(err, &oe) || !errors.Is(err, index.ErrConflict) || oe.TS != 2 || oe.Table != "account" {
		t.Fatalf("insert of a live key: %v", err)
	}
	if err := e.rp.Rollback(ctx, 0, 2); err != nil {
		t.Fatal(err)
	}
	err = e.apply(ctx, 3, change.Op{TS: 3, Table: tid, Kind: change.Delete, Key: []any{int64(99)}})
	if !errors.As(err, &oe) || fmt.Sprint(oe.Key) != "[99]" {
		t.Fatalf("delete of a missing key: %v", err)
	}
	if err := e.rp.Rollback(ctx, 0, 3); err != nil {
		t.Fatal(err)
	}
	err = e.apply(ctx, 4, change.Op{TS: 4, Table: tid, Kind: change.Insert, Row: []any{"bad", int64(0), int64(1), nil}})
	if !errors.Is(err, replay.ErrOp) {
		t.Fatalf("type mismatch: %v", err)
	}
	if err := e.rp.Rollback(ctx, 0, 4); err != nil {
		t.Fatal(err)
	}
	// The rolled-back insert of key 3 at ts 2 is visible at no snapshot,
	// and key 3 can be inserted again.
	for s := uint64(1); s <= 10; s++ {
		if got := e.read(t, s); len(got) != 1 || got[2].balance != 8 {
			t.Fatalf("snapshot %d after rejected ops: %v", s, got)
		}
	}
	if err := e.apply(ctx, 5, change.Op{TS: 5, Table: tid, Kind: change.Insert, Row: []any{int64(3), int64(0), int64(4), nil}}); err != nil {
		t.Fatal(err)
	}
	if got := e.read(t, 5); len(got) != 2 || got[3].balance != 4 {
		t.Fatalf("after re-insert: %v", got)
	}
}

// TestConcurrentBucketsReadersAndFlush: buckets apply transfer transactions
// in parallel through the real transaction service, while readers scan at
// query snapshots and check every bucket's balance total and row count.
func TestConcurrentBucketsReadersAndFlush(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "memory", 256, 8)
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
		var ops []change.Op
		for i := range perBucket {
			id := int64(b*1000 + i)
			ops = append(ops, change.Op{TS: r.First, Table: e.table.ID, Kind: change.Insert, Row: []any{id, int64(b), int64(start), nil}})
		}
		if err := e.rp.Apply(ctx, replay.Batch{Bucket: b, Buckets: buckets, Ops: ops}); err != nil {
			t.Fatal(err)
		}
		svc.CommitMirror(ctx, r.First)
	}
	transfers := 400
	if testing.Short() {
		transfers = 150
	}
	run, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg, writers sync.WaitGroup
	for b := range buckets {
		writers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(b), 3))
			bal := make([]int64, perBucket)
			for i := range bal {
				bal[i] = start
			}
			for range transfers {
				r, err := svc.BeginMirror(ctx, 1)
				if err != nil {
					t.Error(err)
					return
				}
				i, j := rng.IntN(perBucket), rng.IntN(perBucket)
				amt := rng.Int64N(10)
				bal[i] -= amt
				bal[j] += amt
				ops := []change.Op{
					{TS: r.First, Table: e.table.ID, Kind: change.Update, Row: []any{int64(b*1000 + i), int64(b), bal[i], nil}},
					{TS: r.First, Table: e.table.ID, Kind: change.Update, Row: []any{int64(b*1000 + j), int64(b), bal[j], "moved"}},
				}
				if err := e.rp.Apply(ctx, replay.Batch{Bucket: b, Buckets: buckets, Ops: ops}); err != nil {
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
	// Readers and the collector run until the writers are done, each at
	// least a few rounds, however long that takes.
	const readerRounds = 5
	for range 3 {
		wg.Go(func() {
			for did := 0; run.Err() == nil || did < readerRounds; did++ {
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
		for did := 0; run.Err() == nil || did < readerRounds; did++ {
			w, _ := svc.Watermarks(ctx)
			e.rp.Collect(w.LWM)
			time.Sleep(20 * time.Millisecond) // pacing only
		}
	})
	writers.Wait()
	cancel()
	wg.Wait()
	buf, _ := e.rp.Buffer(e.table.ID)
	t.Logf("%d scans; buffer %+v; replayer %+v", scans, buf.Stats(), e.rp.Stats())
}

// TestWidenWhileOtherBucketsApply: one bucket brings rows of a table that
// keeps gaining columns while another applies rows of its first width. A
// batch must see one width of the table from start to end: the narrow rows
// are padded with NULL, never rejected for the columns added meanwhile
// ("after image has 4 values for 5 columns"), and every row reads back.
func TestWidenWhileOtherBucketsApply(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "memory", 64, 4)
	added := 40
	if testing.Short() {
		added = 20
	}
	var ts atomic.Uint64
	narrowRows := 0
	done := make(chan struct{})
	var narrow sync.WaitGroup
	narrow.Go(func() {
		for id := int64(1_000_000); ; id++ {
			select {
			case <-done:
				return
			default:
			}
			ops := make([]change.Op, 8)
			for i := range ops {
				ops[i] = change.Op{TS: ts.Add(1), Table: e.table.ID, Kind: change.Insert, Row: []any{id*10 + int64(i), int64(1), int64(1), nil}}
			}
			if err := e.rp.Apply(ctx, replay.Batch{Bucket: 1, Buckets: 2, Ops: ops}); err != nil {
				t.Errorf("narrow rows after %d: %v", narrowRows, err)
				return
			}
			narrowRows += len(ops)
		}
	})
	for k := range added {
		tb, err := e.cat.AddColumn(ctx, e.table.ID, catalog.Column{Name: fmt.Sprintf("c%d", k), Type: types.Of(types.Int64), Nullable: true})
		if err != nil {
			t.Fatal(err)
		}
		row := []any{int64(k), int64(0), int64(0), nil}
		for range k + 1 {
			row = append(row, int64(k))
		}
		op := change.Op{TS: ts.Add(1), Table: tb.ID, Kind: change.Insert, Row: row}
		if err := e.rp.Apply(ctx, replay.Batch{Bucket: 0, Buckets: 2, Ops: []change.Op{op}}); err != nil {
			t.Fatalf("row of %d columns: %v", len(row), err)
		}
	}
	close(done)
	narrow.Wait()
	if t.Failed() {
		return
	}
	e.table, _ = e.cat.Snapshot().TableByID(e.table.ID)
	if got := len(e.read(t, ts.Load())); got != added+narrowRows {
		t.Fatalf("%d rows read back, want %d wide and %d narrow", got, added, narrowRows)
	}
}
