package server_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/checkpoint"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// A node on a data directory with its lake on local disk (so a reopened
// node finds it) and tiny write-buffer files, so checkpoints catch files
// in every state.
func openNode(t *testing.T, dir, backend string, fsys vfs.FS) (*server.Node, error) {
	t.Helper()
	return server.OpenNode(context.Background(), server.NodeConfig{
		DataDir: dir, IndexBackend: backend, BlockRows: 32, FileBlocks: 4, Replayers: 2, FS: fsys, Logger: servertest.Quiet(),
	})
}

func mustOpen(t *testing.T, dir, backend string, fsys vfs.FS) *server.Node {
	t.Helper()
	n, err := openNode(t, dir, backend, fsys)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func accountTable(t *testing.T, n *server.Node) *catalog.Table {
	t.Helper()
	if tb, ok := n.Catalog.Snapshot().Table("account"); ok {
		return tb
	}
	return servertest.CreateTable(t, n, "account", []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "balance", Type: types.Of(types.Int64)},
	}, "id")
}

// rows reads the table over SQL at the current snapshot.
func rows(t *testing.T, n *server.Node) map[int64]int64 {
	t.Helper()
	out := map[int64]int64{}
	for _, v := range servertest.Query(t, n, "SELECT id, balance FROM account") {
		id := v[0].(int64)
		if _, dup := out[id]; dup {
			t.Fatalf("row %d twice (%v and %v)", id, out[id], v[1])
		}
		out[id] = v[1].(int64)
	}
	return out
}

// workload applies transactions to the node and to a model of the table.
type workload struct {
	n     *server.Node
	tb    *catalog.Table
	state map[int64]int64
	next  int64
}

func (w *workload) insert(t *testing.T, count int) {
	var ops []change.Op
	for range count {
		w.next++
		w.state[w.next] = w.next * 10
		ops = append(ops, change.Op{Table: w.tb.ID, Kind: change.Insert, Row: []any{w.next, w.next * 10}})
	}
	servertest.Apply(t, w.n, ops...)
}

// churn updates and deletes some of the rows there are.
func (w *workload) churn(t *testing.T) {
	var ops []change.Op
	i := 0
	for _, id := range sortedKeys(w.state) {
		switch i++; i % 5 {
		case 0:
			delete(w.state, id)
			ops = append(ops, change.Op{Table: w.tb.ID, Kind: change.Delete, Key: []any{id}})
		case 2:
			w.state[id]++
			ops = append(ops, change.Op{Table: w.tb.ID, Kind: change.Update, Row: []any{id, w.state[id]}})
		}
	}
	servertest.Apply(t, w.n, ops...)
}

func sortedKeys(m map[int64]int64) []int64 {
	keys := make([]int64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}

// checkpointNow takes a replay checkpoint of everything committed.
func checkpointNow(n *server.Node) error {
	w, err := n.Txn.Watermarks(context.Background())
	if err != nil {
		return err
	}
	st, err := n.Seal(w.HWM - 1)
	if err != nil {
		return err
	}
	return st.Write(context.Background(), []checkpoint.Source{{URI: "file:/in.jsonl"}})
}

// TestRestoreDropsWhatCameAfterTheCheckpoint: after a crash (no clean
// stop) the node comes back with exactly the state of its last checkpoint,
// whatever was flushed, combined or registered since; the index answers for
// that state, and replay goes on from it. "large" writes enough after the
// checkpoint for new files and for the checkpoint's last file to fill and
// be combined; "small" leaves that file virtual, for the restore to combine.
func TestRestoreDropsWhatCameAfterTheCheckpoint(t *testing.T) {
	for _, backend := range []string{"memory", "pebble"} {
		for _, size := range []string{"large", "small"} {
			t.Run(backend+"/"+size, func(t *testing.T) {
				dir := t.TempDir()
				n := mustOpen(t, dir, backend, nil)
				w := &workload{n: n, tb: accountTable(t, n), state: map[int64]int64{}}
				w.insert(t, 300) // several files, some combined, one still filling
				if err := checkpointNow(n); err != nil {
					t.Fatal(err)
				}
				w.churn(t) // the next checkpoint has other deletes in the same files
				if err := checkpointNow(n); err != nil {
					t.Fatal(err)
				}
				atCheckpoint := maps.Clone(w.state)
				if size == "large" {
					w.insert(t, 500)
					w.churn(t)
				} else {
					w.insert(t, 5)
				}
				if got := rows(t, n); !maps.Equal(got, w.state) {
					t.Fatalf("before the crash: %d rows, want %d", len(got), len(w.state))
				}
				// A crash: no final checkpoint, and the buffers are not
				// flushed (the context is over).
				done, cancel := context.WithCancel(context.Background())
				cancel()
				n.Close(done)

				n = mustOpen(t, dir, backend, nil)
				defer n.Close(context.Background())
				if got := rows(t, n); !maps.Equal(got, atCheckpoint) {
					t.Fatalf("after the restore: %d rows, want the checkpoint's %d", len(got), len(atCheckpoint))
				}
				for _, f := range n.Catalog.Snapshot().Files(w.tb.ID) {
					if f.State != catalog.Regular {
						t.Fatalf("file %d is %s after the restore", f.ID, f.State)
					}
				}
				if objs, _ := n.Lake.List(context.Background(), fmt.Sprintf("t%d/v", w.tb.ID)); len(objs) != 0 {
					t.Fatalf("%d block objects left after the restore", len(objs))
				}
				if r := n.Recovery; size == "large" && r.Dropped == 0 || size == "small" && r.Combined == 0 {
					t.Fatalf("recovery %+v: the %s case did not exercise what it is for", r, size)
				}
				// The index is the checkpoint's: the keys inserted after it can
				// be inserted again, and those of the checkpoint updated.
				w.n, w.state, w.next = n, atCheckpoint, 300
				w.insert(t, 500)
				w.churn(t)
				if got := rows(t, n); !maps.Equal(got, w.state) {
					t.Fatalf("replay after the restore: %d rows, want %d", len(got), len(w.state))
				}
			})
		}
	}
}

// failAt fails the file-system operation number at (counting from 0) of
// the checkpoint's files, once armed.
type failAt struct {
	armed atomic.Bool
	at    int32
	count atomic.Int32
	fired atomic.Bool
}

func (f *failAt) MaybeError(op errorfs.Op) error {
	if !f.armed.Load() {
		return nil
	}
	if f.count.Add(1)-1 == f.at {
		f.fired.Store(true)
		return errorfs.ErrInjected
	}
	return nil
}

func (f *failAt) String() string { return fmt.Sprintf("fail operation %d", f.at) }

// TestCheckpointFailingAtEveryStepLeavesARecoverableDirectory: a checkpoint
// write whose file-system operation k fails (for every k: creating,
// writing, syncing or renaming a visibility file or the manifest, syncing
// their directory), followed by a crash, leaves a directory that restores
// to the previous checkpoint's state or the new one's, never a mix.
func TestCheckpointFailingAtEveryStepLeavesARecoverableDirectory(t *testing.T) {
	for k := int32(0); ; k++ {
		dir := t.TempDir()
		inj := &failAt{at: k}
		n := mustOpen(t, dir, "memory", errorfs.Wrap(vfs.Default, inj))
		w := &workload{n: n, tb: accountTable(t, n), state: map[int64]int64{}}
		w.insert(t, 200)
		w.churn(t)
		if err := checkpointNow(n); err != nil {
			t.Fatal(err)
		}
		first := maps.Clone(w.state)
		w.insert(t, 100)
		w.churn(t)
		inj.armed.Store(true)
		err := checkpointNow(n)
		n.Close(context.Background())
		if err != nil && !errors.Is(err, errorfs.ErrInjected) {
			t.Fatalf("operation %d: %v", k, err)
		}

		n2, oerr := openNode(t, dir, "memory", nil)
		if oerr != nil {
			t.Fatalf("failure at operation %d (%v): the directory does not open: %v", k, err, oerr)
		}
		got := rows(t, n2)
		n2.Close(context.Background())
		switch {
		case maps.Equal(got, w.state):
		case maps.Equal(got, first) && err != nil:
		default:
			t.Fatalf("failure at operation %d (%v): restored %d rows, neither checkpoint's state", k, err, len(got))
		}
		if !inj.fired.Load() {
			if k == 0 {
				t.Fatal("no operation failed: the injection did nothing")
			}
			t.Logf("a checkpoint of this node is %d file-system operations; each failed in turn", k)
			return
		}
	}
}

// TestCorruptCheckpointIsRefused: a start never serves a half-restored
// state: a damaged manifest or visibility file stops it, naming the file
// and the check that failed.
func TestCorruptCheckpointIsRefused(t *testing.T) {
	dir := t.TempDir()
	n := mustOpen(t, dir, "memory", nil)
	w := &workload{n: n, tb: accountTable(t, n), state: map[int64]int64{}}
	w.insert(t, 100)
	w.churn(t)
	if err := checkpointNow(n); err != nil {
		t.Fatal(err)
	}
	n.Close(context.Background())
	manifest := filepath.Join(dir, checkpoint.ManifestName)
	good, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), good...)
	bad[len(bad)/2] ^= 0xff
	os.WriteFile(manifest, bad, 0o644)
	if _, err := openNode(t, dir, "memory", nil); err == nil || !strings.Contains(err.Error(), manifest) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("a damaged manifest: %v", err)
	}
	os.WriteFile(manifest, good[:len(good)-7], 0o644)
	if _, err := openNode(t, dir, "memory", nil); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("a truncated manifest: %v", err)
	}
	os.WriteFile(manifest, good, 0o644)
	vis, _ := filepath.Glob(filepath.Join(dir, checkpoint.VisDir, "*.vis"))
	if len(vis) == 0 {
		t.Fatal("no visibility file to damage")
	}
	data, _ := os.ReadFile(vis[0])
	data[len(data)-1] ^= 1
	os.WriteFile(vis[0], data, 0o644)
	if _, err := openNode(t, dir, "memory", nil); err == nil || !strings.Contains(err.Error(), filepath.Base(vis[0])) {
		t.Fatalf("a damaged visibility file: %v", err)
	}
	data[len(data)-1] ^= 1
	os.WriteFile(vis[0], data, 0o644)
	cat := filepath.Join(dir, "catalog", "catalog.db")
	good, _ = os.ReadFile(cat)
	os.WriteFile(cat, good[:len(good)/2], 0o644)
	if _, err := openNode(t, dir, "memory", nil); err == nil || !strings.Contains(err.Error(), cat) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("a truncated catalog: %v", err)
	}
}

// TestDamagedPebbleIndexIsRebuilt: the Pebble index a clean stop keeps is
// derived from the files; when it no longer opens, the start rebuilds it
// and answers as before.
func TestDamagedPebbleIndexIsRebuilt(t *testing.T) {
	dir := t.TempDir()
	w := stoppedCleanWithPebble(t, dir)
	manifests, _ := filepath.Glob(filepath.Join(dir, "index", "MANIFEST-*"))
	if len(manifests) == 0 {
		t.Fatal("no Pebble manifest to damage")
	}
	for _, m := range manifests {
		data, _ := os.ReadFile(m)
		data[len(data)/2] ^= 0xff
		os.WriteFile(m, data, 0o644)
	}
	n := mustOpen(t, dir, "pebble", nil)
	defer n.Close(context.Background())
	w.n = n
	if n.Recovery.IndexKept {
		t.Fatal("a damaged index was kept")
	}
	if got := rows(t, n); !maps.Equal(got, w.state) {
		t.Fatalf("after the rebuild: %d rows, want %d", len(got), len(w.state))
	}
	w.churn(t) // updates and deletes find their keys in the rebuilt index
	if got := rows(t, n); !maps.Equal(got, w.state) {
		t.Fatalf("replay after the rebuild: %d rows, want %d", len(got), len(w.state))
	}
}

// TestCleanStopKeepsPebbleIndex: after a clean stop the Pebble index,
// stamped with the checkpoint's snapshot, is kept and serves replay; after
// a further crash it is not (the newest checkpoint is not a clean one).
func TestCleanStopKeepsPebbleIndex(t *testing.T) {
	dir := t.TempDir()
	w := stoppedCleanWithPebble(t, dir)
	n := mustOpen(t, dir, "pebble", nil)
	w.n = n
	if !n.Recovery.IndexKept {
		t.Fatal("the index of a clean stop was rebuilt")
	}
	w.churn(t) // updates and deletes find their keys in the kept index
	if got := rows(t, n); !maps.Equal(got, w.state) {
		t.Fatalf("replay on the kept index: %d rows, want %d", len(got), len(w.state))
	}
	if err := checkpointNow(n); err != nil {
		t.Fatal(err)
	}
	n.Close(context.Background()) // not Persist: as after a crash
	n = mustOpen(t, dir, "pebble", nil)
	defer n.Close(context.Background())
	if n.Recovery.IndexKept {
		t.Fatal("the index was kept after a stop that was not clean")
	}
	w.n = n
	if got := rows(t, n); !maps.Equal(got, w.state) {
		t.Fatalf("after the rebuild: %d rows, want %d", len(got), len(w.state))
	}
}

// stoppedCleanWithPebble runs a node with the Pebble index on dir through
// inserts, updates and deletes, and stops it cleanly; the workload's node
// is closed.
func stoppedCleanWithPebble(t *testing.T, dir string) *workload {
	t.Helper()
	n := mustOpen(t, dir, "pebble", nil)
	w := &workload{n: n, tb: accountTable(t, n), state: map[int64]int64{}}
	w.insert(t, 300)
	w.churn(t)
	if err := n.Persist(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	n.Close(context.Background())
	return w
}
