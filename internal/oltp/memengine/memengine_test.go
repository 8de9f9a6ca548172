package memengine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/enginetest"
)

func TestConformance(t *testing.T) {
	enginetest.Run(t, func(dir string, tables []engine.TableSpec) (enginetest.Opened, error) {
		return Open(Options{Dir: dir, Tables: tables, GCInterval: -1}) // GC has its own test
	})
}

// TestTornTailThenMoreSegments: a torn tail at the end of the last segment
// (a crash mid-write) is cut off at recovery, so once newer segments
// follow it the old segment still reads cleanly.
func TestTornTailThenMoreSegments(t *testing.T) {
	dir := t.TempDir()
	commitOne := func(e *Engine, key string) { commitDurable(t, e, key) }
	open := func() *Engine { return openStarted(t, dir, false) }
	e := open()
	commitOne(e, "a")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "redo-*.log"))
	last := segs[len(segs)-1]
	f, err := os.OpenFile(last, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{200, 0, 0, 0, 1, 2, 3, 4, 5}) // a block header promising more than follows
	f.Close()
	for _, k := range []string{"b", "c"} {
		e = open()
		commitOne(e, k)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	e = open()
	defer e.Close()
	tx := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
	for _, k := range []string{"a", "b", "c"} {
		if _, ok, err := tx.Get("kv", []byte(k)); err != nil || !ok {
			t.Fatalf("row %s after recoveries: %v %v", k, ok, err)
		}
	}
}

// TestVersionGC steps GC by hand: versions below the oldest running
// snapshot go when the row is next written; a snapshot below the horizon
// is refused with a retryable error; a running reader keeps its versions.
func TestVersionGC(t *testing.T) {
	ctx := context.Background()
	e, err := Open(Options{Dir: t.TempDir(), Tables: enginetest.Tables, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx, engine.Discard{}); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	write := func(v string) {
		tx := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
		if err := tx.Put("kv", []byte("k"), []byte("g:"+v)); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.PreCommit(); err != nil {
			t.Fatal(err)
		}
		if err := tx.PostCommit(nil); err != nil {
			t.Fatal(err)
		}
	}
	rec := func() *record { return e.tables["kv"].find([]byte("k")) }
	write("1")
	old := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation) // pins "1"
	oldSnap := old.Snapshot()
	for i := 2; i <= 5; i++ {
		write(fmt.Sprint(i))
	}
	e.gcPass()
	e.gcPass()
	write("6")
	if got, _, _ := old.Get("kv", []byte("k")); string(got) != "g:1" {
		t.Fatalf("a running reader lost its version: %q", got)
	}
	if n := rec().versions(); n != 6 {
		t.Fatalf("%d versions while a reader at the first one runs, want all 6", n)
	}
	old.Abort()
	e.gcPass()
	write("7")
	if n := rec().versions(); n > 3 {
		t.Fatalf("%d versions after GC with no reader, want at most 3", n)
	}
	late := e.Begin(oldSnap, engine.SnapshotIsolation)
	if _, _, err := late.Get("kv", []byte("k")); !errors.Is(err, engine.ErrSnapshotUnavailable) || !engine.Retryable(err) {
		t.Fatalf("a snapshot below the horizon: %v, want a retryable snapshot-unavailable error", err)
	}
	late.Abort()
}

// TestCheckpointKeepsLaterRecords: a checkpoint below the newest commits
// (the caller's safe point lags) keeps the segments holding those commits,
// however many checkpoints follow, and recovery replays them.
func TestCheckpointKeepsLaterRecords(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	e := openStarted(t, dir, true)
	commit := func(k string) uint64 { return commitDurable(t, e, k) }
	safe := commit("a")
	commit("b") // acknowledged, above the safe point
	for i := 0; i < 3; i++ {
		if ok, err := e.Checkpoint(ctx, safe); err != nil || !ok {
			t.Fatalf("checkpoint %d: %v %v", i, ok, err)
		}
	}
	commit("c")
	if ok, err := e.Checkpoint(ctx, safe); err != nil || !ok {
		t.Fatalf("checkpoint: %v %v", ok, err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = openStarted(t, dir, true)
	defer e.Close()
	tx := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
	for _, k := range []string{"a", "b", "c"} {
		if _, ok, err := tx.Get("kv", []byte(k)); err != nil || !ok {
			t.Fatalf("acknowledged row %s lost after checkpoints below it: %v %v", k, ok, err)
		}
	}
	tx.Abort()
	// Once the safe point passes everything, old segments go.
	e2 := e
	if ok, err := e2.Checkpoint(ctx, e2.LatestSnapshot()); err != nil || !ok {
		t.Fatalf("checkpoint: %v %v", ok, err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "redo-*.log"))
	if len(segs) != 1 {
		t.Fatalf("%d redo segments after a checkpoint covering everything, want 1 (the open one)", len(segs))
	}
}

// openStarted opens and starts an engine in dir (version GC stepped by hand
// when manualGC).
func openStarted(t *testing.T, dir string, manualGC bool) *Engine {
	t.Helper()
	opts := Options{Dir: dir, Tables: enginetest.Tables}
	if manualGC {
		opts.GCInterval = -1
	}
	e, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background(), engine.Discard{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// commitDurable writes key = "g:"+key and waits until it is durable.
func commitDurable(t *testing.T, e *Engine, key string) uint64 {
	t.Helper()
	tx := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
	if err := tx.Put("kv", []byte(key), []byte("g:"+key)); err != nil {
		t.Fatal(err)
	}
	cts, err := tx.PreCommit()
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.PostCommit(nil); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitDurable(context.Background(), cts); err != nil {
		t.Fatal(err)
	}
	return cts
}
