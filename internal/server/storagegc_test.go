package server_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/query"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// waitRegular waits until the table has at least n regular files (write
// buffers combine full files in the background).
func waitRegular(t *testing.T, n *server.Node, table uint32, want int) []*catalog.File {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var regular []*catalog.File
		for _, f := range n.Catalog.Snapshot().LiveFiles(table) {
			if f.State == catalog.Regular {
				regular = append(regular, f)
			}
		}
		if len(regular) >= want {
			return regular
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d regular files after 30s, want %d", len(regular), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// heldRead is an explicit read transaction: it keeps its snapshot.
type heldRead struct {
	sess *query.Session
}

func beginRead(t *testing.T, n *server.Node) heldRead {
	t.Helper()
	h, err := openRead(n)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func openRead(n *server.Node) (heldRead, error) {
	sess, err := n.Engine.NewSession(context.Background())
	if err != nil {
		return heldRead{}, err
	}
	res, err := sess.Run(context.Background(), "BEGIN")
	if err != nil {
		sess.Close()
		return heldRead{}, err
	}
	res.Close()
	return heldRead{sess}, nil
}

// end commits the transaction and closes the session.
func (h heldRead) end(t *testing.T) {
	t.Helper()
	res, err := h.sess.Run(context.Background(), "COMMIT")
	if err != nil {
		t.Fatal(err)
	}
	res.Close()
	h.sess.Close()
}

// rewriteAndSwitch runs a storage GC round and a checkpoint, and checks
// that they replaced one file of table by one rewritten file.
func rewriteAndSwitch(t *testing.T, n *server.Node, table uint32) {
	t.Helper()
	if err := n.StorageGCRound(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := checkpointNow(n); err != nil {
		t.Fatal(err)
	}
	if _, retired, rewritten := gcFiles(n, table); retired != 1 || rewritten != 1 {
		t.Fatalf("after the switch: %d retired, %d rewritten files, want 1 and 1", retired, rewritten)
	}
}

func (h heldRead) rows(t *testing.T) map[int64]int64 {
	t.Helper()
	out, err := h.read()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// read is rows for goroutines other than the test's: it returns the error.
func (h heldRead) read() (map[int64]int64, error) {
	res, err := h.sess.Run(context.Background(), "SELECT id, balance FROM account")
	if err != nil {
		return nil, err
	}
	defer res.Close()
	out := map[int64]int64{}
	for res.Next() {
		v, err := res.Values()
		if err != nil {
			return nil, err
		}
		if _, dup := out[v[0].(int64)]; dup {
			return nil, fmt.Errorf("row %d twice", v[0])
		}
		out[v[0].(int64)] = v[1].(int64)
	}
	return out, res.Err()
}

func (w *workload) del(t *testing.T, ids ...int64) {
	var ops []change.Op
	for _, id := range ids {
		delete(w.state, id)
		ops = append(ops, change.Op{Table: w.tb.ID, Kind: change.Delete, Key: []any{id}})
	}
	servertest.Apply(t, w.n, ops...)
}

func (w *workload) update(t *testing.T, ids ...int64) {
	var ops []change.Op
	for _, id := range ids {
		w.state[id] += 1000
		ops = append(ops, change.Op{Table: w.tb.ID, Kind: change.Update, Row: []any{id, w.state[id]}})
	}
	servertest.Apply(t, w.n, ops...)
}

func gcFiles(n *server.Node, table uint32) (regular, retired, rewritten int) {
	for _, f := range n.Catalog.Snapshot().Files(table) {
		switch {
		case f.State == catalog.Retired:
			retired++
		case strings.Contains(f.Key, "/g"):
			rewritten++
		case f.State == catalog.Regular:
			regular++
		}
	}
	return
}

// TestStorageGCRewritesWithoutChangingAnyAnswer: a file whose versions are
// mostly stale is rewritten while a read transaction holds an older
// snapshot and deletes keep landing on it; after the switch the held
// transaction still sees its snapshot, new queries see the present, the
// rewritten rows take updates and deletes through the index, the old file
// goes once nothing needs it, and a restart comes back to the same rows.
func TestStorageGCRewritesWithoutChangingAnyAnswer(t *testing.T) {
	for _, backend := range []string{"memory", "pebble"} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			n := mustOpen(t, dir, backend, nil)
			w := &workload{n: n, tb: accountTable(t, n), state: map[int64]int64{}}
			w.insert(t, 300) // two full files of 128 rows and one filling
			first := waitRegular(t, n, w.tb.ID, 2)[0]
			var stale []int64
			for id := int64(1); id <= 100; id++ {
				if id%4 != 0 {
					stale = append(stale, id)
				}
			}
			w.del(t, stale...) // 75 of the first file's 128 versions
			w.update(t, 101, 102)
			held := beginRead(t, n)
			atHeld := maps.Clone(w.state)
			if got := held.rows(t); !maps.Equal(got, atHeld) {
				t.Fatalf("held read: %d rows, want %d", len(got), len(atHeld))
			}
			w.del(t, 4, 8) // live at the held snapshot: kept, and deleted after it
			w.update(t, 12)

			if err := n.StorageGCRound(ctx); err != nil {
				t.Fatal(err)
			}
			w.del(t, 16) // lands on the old file between the rewrite and the switch
			w.update(t, 20)
			if _, _, rewritten := gcFiles(n, w.tb.ID); rewritten != 0 {
				t.Fatal("the rewrite switched in before a checkpoint")
			}
			if err := checkpointNow(n); err != nil {
				t.Fatal(err)
			}
			if _, retired, rewritten := gcFiles(n, w.tb.ID); retired != 1 || rewritten != 1 {
				t.Fatalf("after the switch: %d retired, %d rewritten files, want 1 and 1", retired, rewritten)
			}
			if got := held.rows(t); !maps.Equal(got, atHeld) {
				t.Fatalf("held read after the switch: %d rows, want %d", len(got), len(atHeld))
			}
			if got := rows(t, n); !maps.Equal(got, w.state) {
				t.Fatalf("after the switch: %d rows, want %d", len(got), len(w.state))
			}
			w.update(t, 24, 28, 200)
			w.del(t, 32, 36, 250)
			if got := rows(t, n); !maps.Equal(got, w.state) {
				t.Fatalf("changes to rewritten rows: %d rows, want %d", len(got), len(w.state))
			}

			// The old file stays while the held read could still read it.
			if err := n.StorageGCRound(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := n.Lake.Size(ctx, first.Key); err != nil {
				t.Fatalf("the old file went while a query could read it: %v", err)
			}
			held.end(t)
			w.update(t, 40) // HWM, and with it LWM, moves past the switch
			if err := n.StorageGCRound(ctx); err != nil {
				t.Fatal(err)
			}
			if _, retired, _ := gcFiles(n, w.tb.ID); retired != 0 {
				t.Fatalf("%d retired files left", retired)
			}
			if _, err := n.Lake.Size(ctx, first.Key); err == nil {
				t.Fatal("the old file's object is still in the lake")
			}
			if st := n.GCStats(); st.Rewrites.Load() != 1 || st.FilesDropped.Load() != 1 || st.VersionsDropped.Load() != 77 { // 75 deleted, 2 updated
				t.Fatalf("stats: %d rewrites, %d dropped files, %d dropped versions", st.Rewrites.Load(), st.FilesDropped.Load(), st.VersionsDropped.Load())
			}

			if err := checkpointNow(n); err != nil {
				t.Fatal(err)
			}
			done, cancel := context.WithCancel(ctx)
			cancel()
			n.Close(done) // a crash
			n = mustOpen(t, dir, backend, nil)
			defer n.Close(ctx)
			w.n = n
			if got := rows(t, n); !maps.Equal(got, w.state) {
				t.Fatalf("after a restart: %d rows, want %d", len(got), len(w.state))
			}
			w.update(t, 44, 48)
			w.del(t, 52)
			w.churn(t)
			if got := rows(t, n); !maps.Equal(got, w.state) {
				t.Fatalf("changes after the restart: %d rows, want %d", len(got), len(w.state))
			}
		})
	}
}

// TestStorageGCSwitchLostInACrash: a crash after the switch but before
// the checkpoint that took it was durable comes back to the last durable
// checkpoint: the old file is revived, the rewritten one and its object go.
func TestStorageGCSwitchLostInACrash(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	n := mustOpen(t, dir, "memory", nil)
	w := &workload{n: n, tb: accountTable(t, n), state: map[int64]int64{}}
	w.insert(t, 300)
	waitRegular(t, n, w.tb.ID, 2)
	var stale []int64
	for id := int64(1); id <= 120; id++ {
		if id%5 != 0 {
			stale = append(stale, id)
		}
	}
	w.del(t, stale...)
	if err := checkpointNow(n); err != nil {
		t.Fatal(err)
	}
	durable := maps.Clone(w.state)
	if err := n.StorageGCRound(ctx); err != nil {
		t.Fatal(err)
	}
	hw, err := n.Txn.Watermarks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Seal(hw.HWM - 1); err != nil { // switched, never written
		t.Fatal(err)
	}
	if _, _, rewritten := gcFiles(n, w.tb.ID); rewritten != 1 {
		t.Fatalf("%d rewritten files after the seal, want 1", rewritten)
	}
	w.update(t, 5, 10)
	done, cancel := context.WithCancel(ctx)
	cancel()
	n.Close(done)

	n = mustOpen(t, dir, "memory", nil)
	defer n.Close(ctx)
	if got := rows(t, n); !maps.Equal(got, durable) {
		t.Fatalf("after the restore: %d rows, want the durable checkpoint's %d", len(got), len(durable))
	}
	if regular, retired, rewritten := gcFiles(n, w.tb.ID); retired != 0 || rewritten != 0 || regular < 2 {
		t.Fatalf("after the restore: %d regular, %d retired, %d rewritten files", regular, retired, rewritten)
	}
	if objs, _ := n.Lake.List(ctx, replay.GCPrefix(w.tb.ID)); len(objs) != 0 {
		t.Fatalf("%d storage-GC objects left in the lake", len(objs))
	}
	w.n, w.state = n, durable
	w.update(t, 5, 10, 15)
	w.churn(t)
	if got := rows(t, n); !maps.Equal(got, w.state) {
		t.Fatalf("changes after the restore: %d rows, want %d", len(got), len(w.state))
	}
}

// TestStorageGCUnderConcurrentReplayAndReads runs replay, storage GC
// rounds, checkpoints (which switch rewrites in), visibility checkpoints of
// every reader, memory GC and explicit read transactions together: every
// read equals the model's table at the reader's snapshot, whether it
// planned before a rewrite, between the rewrite and the switch, or after
// the swap, and before or after its visibility checkpoint. Run with -race.
func TestStorageGCUnderConcurrentReplayAndReads(t *testing.T) {
	ctx := context.Background()
	n, err := server.OpenNode(ctx, server.NodeConfig{DataDir: t.TempDir(), BlockRows: 16, FileBlocks: 4, Replayers: 1,
		StorageGC: server.StorageGCConfig{StaleShare: 0.2, Duty: 1}, Logger: servertest.Quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(ctx)
	w := &workload{n: n, tb: accountTable(t, n), state: map[int64]int64{}}
	var (
		mu     sync.Mutex
		states = map[uint64]map[int64]int64{} // commit ts → the table after it
		last   uint64
	)
	record := func(ts uint64) {
		mu.Lock()
		states[ts] = maps.Clone(w.state)
		last = ts
		mu.Unlock()
	}
	at := func(snap uint64) (map[int64]int64, bool) {
		mu.Lock()
		defer mu.Unlock()
		if last < snap {
			return nil, false
		}
		best := uint64(0)
		for ts := range states {
			if ts <= snap && ts > best {
				best = ts
			}
		}
		return states[best], true
	}
	record(0)
	rng := rand.New(rand.NewPCG(3, 4))
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // replay, and checkpoints between transactions (quiesced)
		defer close(done)
		for i := range 300 {
			var ops []change.Op
			touched := map[int64]bool{} // a transaction changes a key once
			for range 1 + rng.IntN(8) {
				id := int64(1 + rng.IntN(150))
				if touched[id] {
					continue
				}
				touched[id] = true
				_, live := w.state[id]
				switch {
				case !live:
					w.state[id] = id
					ops = append(ops, change.Op{Table: w.tb.ID, Kind: change.Insert, Row: []any{id, id}})
				case rng.IntN(3) == 0:
					delete(w.state, id)
					ops = append(ops, change.Op{Table: w.tb.ID, Kind: change.Delete, Key: []any{id}})
				default:
					w.state[id]++
					ops = append(ops, change.Op{Table: w.tb.ID, Kind: change.Update, Row: []any{id, w.state[id]}})
				}
			}
			record(servertest.Apply(t, n, ops...))
			if i%10 == 9 {
				if err := checkpointNow(n); err != nil {
					t.Error(err)
					return
				}
			}
		}
	})
	wg.Go(func() { // storage GC, visibility checkpoints of every reader, memory GC
		for {
			select {
			case <-done:
				return
			default:
			}
			if err := n.StorageGCRound(ctx); err != nil {
				t.Error(err)
				return
			}
			n.CheckpointReaders(ctx, 0)
			n.CollectVisibility(ctx)
		}
	})
	for r := range 2 {
		wg.Go(func() { // explicit read transactions across rewrites and switches
			for k := 0; ; k++ {
				select {
				case <-done:
					return
				default:
				}
				h, err := openRead(n)
				if err != nil {
					t.Error(err)
					return
				}
				res, err := h.sess.Run(ctx, "SELECT retina_snapshot()")
				if err != nil {
					t.Error(err)
					return
				}
				res.Next()
				v, _ := res.Values()
				res.Close()
				snap := v[0].(uint64)
				var want map[int64]int64
				for ok := false; !ok; want, ok = at(snap) {
				}
				for q := range 3 {
					got, err := h.read()
					if err != nil || !maps.Equal(got, want) {
						t.Errorf("reader %d, transaction %d, read %d at snapshot %d: %d rows (%v), want %d", r, k, q, snap, len(got), err, len(want))
						return
					}
					time.Sleep(time.Millisecond)
				}
				h.sess.Close()
			}
		})
	}
	wg.Wait()
	if st := n.GCStats(); st.Rewrites.Load() == 0 {
		t.Fatal("no rewrite was switched in: the test did not exercise storage GC")
	}
	if n.Readers().Checkpoints.Load() == 0 {
		t.Fatal("no reader was checkpointed: the test did not exercise visibility checkpoints")
	}
	if got := rows(t, n); !maps.Equal(got, w.state) {
		t.Fatalf("at the end: %d rows, want %d", len(got), len(w.state))
	}
}

// TestStorageGCSealsAStaleFillingFile: a file still filling whose versions
// went stale (a few rows updated over and over) is sealed early, combined,
// and rewritten, without changing an answer; a filling file with live
// versions is left to fill.
func TestStorageGCSealsAStaleFillingFile(t *testing.T) {
	ctx := context.Background()
	n := mustOpen(t, t.TempDir(), "memory", nil)
	defer n.Close(ctx)
	w := &workload{n: n, tb: accountTable(t, n), state: map[int64]int64{}}
	w.insert(t, 40) // a third of a 128-row file, all live
	if err := n.StorageGCRound(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.GCStats().EarlySeals.Load(); got != 0 {
		t.Fatalf("a filling file of live versions was sealed (%d seals)", got)
	}
	for range 4 {
		w.update(t, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10) // 40 versions, 30 of them stale
	}
	if err := n.StorageGCRound(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.GCStats().EarlySeals.Load(); got != 1 {
		t.Fatalf("%d early seals, want 1", got)
	}
	sealed := waitRegular(t, n, w.tb.ID, 1)[0]
	if sealed.Rows() != 80 {
		t.Fatalf("the sealed file has %d rows, want 80", sealed.Rows())
	}
	w.update(t, 11) // goes to a new file
	if got := rows(t, n); !maps.Equal(got, w.state) {
		t.Fatalf("after the early seal: %d rows, want %d", len(got), len(w.state))
	}
	rewriteAndSwitch(t, n, w.tb.ID)
	if got := rows(t, n); !maps.Equal(got, w.state) {
		t.Fatalf("after the rewrite: %d rows, want %d", len(got), len(w.state))
	}
}

// TestStorageGCSwitchesEveryRewriteInOneCatalogChange: rewrites of two
// tables waiting for the same checkpoint are switched in with one catalog
// write (replay waits for one fsync, not one per rewrite), and each table
// still answers with its rows.
func TestStorageGCSwitchesEveryRewriteInOneCatalogChange(t *testing.T) {
	ctx := context.Background()
	n := mustOpen(t, t.TempDir(), "memory", nil)
	var ws []*workload
	for _, name := range []string{"account", "ledger"} {
		tb := servertest.CreateTable(t, n, name, []catalog.Column{
			{Name: "id", Type: types.Of(types.Int64)},
			{Name: "balance", Type: types.Of(types.Int64)},
		}, "id")
		w := &workload{n: n, tb: tb, state: map[int64]int64{}}
		w.insert(t, 300)
		waitRegular(t, n, tb.ID, 2)
		var stale []int64
		for id := int64(1); id <= 100; id++ {
			if id%4 != 0 {
				stale = append(stale, id)
			}
		}
		w.del(t, stale...)
		ws = append(ws, w)
	}
	if err := n.StorageGCRound(ctx); err != nil {
		t.Fatal(err)
	}
	before := n.Catalog.Snapshot().Version()
	if err := checkpointNow(n); err != nil {
		t.Fatal(err)
	}
	if changes := n.Catalog.Snapshot().Version() - before; changes != 1 {
		t.Fatalf("the checkpoint made %d catalog changes, want 1 for both switches", changes)
	}
	for _, w := range ws {
		if _, retired, rewritten := gcFiles(n, w.tb.ID); retired != 1 || rewritten != 1 {
			t.Fatalf("%s after the switch: %d retired, %d rewritten files, want 1 and 1", w.tb.Name, retired, rewritten)
		}
		got := map[int64]int64{}
		for _, v := range servertest.Query(t, n, "SELECT id, balance FROM "+w.tb.Name) {
			got[v[0].(int64)] = v[1].(int64)
		}
		if !maps.Equal(got, w.state) {
			t.Fatalf("%s: %d rows after the switch, want %d", w.tb.Name, len(got), len(w.state))
		}
	}
}
