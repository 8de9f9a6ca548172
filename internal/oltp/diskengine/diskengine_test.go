package diskengine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/enginetest"
)

func TestConformance(t *testing.T) {
	enginetest.Run(t, func(dir string, tables []engine.TableSpec) (enginetest.Opened, error) {
		return Open(Options{Dir: dir, Tables: tables, CacheBytes: 8 << 20, GCInterval: -1}) // GC has its own test
	})
}

// TestVersionGC steps GC by hand: versions below the oldest running
// snapshot go, but never past the ForgetThrough mark; a deleted row goes
// whole; a snapshot below the horizon is refused with a retryable error.
func TestVersionGC(t *testing.T) {
	ctx := context.Background()
	e, err := Open(Options{Dir: t.TempDir(), Tables: enginetest.Tables, CacheBytes: 8 << 20, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx, engine.Discard{}); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	write := func(key, v string) {
		tx := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
		var err error
		if v == "" {
			err = tx.Delete("kv", []byte(key))
		} else {
			err = tx.Put("kv", []byte(key), []byte("g:"+v))
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.PreCommit(); err != nil {
			t.Fatal(err)
		}
		if err := tx.PostCommit(nil); err != nil {
			t.Fatal(err)
		}
	}
	versions := func() int {
		it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixRow}, UpperBound: []byte{prefixRow + 1}})
		if err != nil {
			t.Fatal(err)
		}
		defer it.Close()
		n := 0
		for it.First(); it.Valid(); it.Next() {
			n++
		}
		return n
	}
	write("k", "1")
	write("gone", "1")
	old := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation) // pins k=1
	oldSnap := old.Snapshot()
	for i := 2; i <= 5; i++ {
		write("k", fmt.Sprint(i))
	}
	write("gone", "")
	pass := func() int {
		n, err := e.gcPass()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	pass()
	pass()
	if n := pass(); n != 0 || versions() != 7 {
		t.Fatalf("GC deleted %d versions before ForgetThrough (%d left); want none", n, versions())
	}
	if err := e.WaitDurable(ctx, e.LatestSnapshot()); err != nil {
		t.Fatal(err)
	}
	if err := e.ForgetThrough(e.DurableTS()); err != nil {
		t.Fatal(err)
	}
	pass()
	if got, _, _ := old.Get("kv", []byte("k")); string(got) != "g:1" {
		t.Fatalf("a running reader lost its version: %q", got)
	}
	old.Abort()
	pass()
	pass()
	if n := versions(); n != 1 {
		t.Fatalf("%d row versions after GC with no reader, want 1 (k's newest; the deleted row gone)", n)
	}
	late := e.Begin(oldSnap, engine.SnapshotIsolation)
	if _, _, err := late.Get("kv", []byte("k")); !errors.Is(err, engine.ErrSnapshotUnavailable) {
		t.Fatalf("a snapshot below the horizon: %v, want snapshot unavailable", err)
	}
	late.Abort()
	now := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
	if got, _, _ := now.Get("kv", []byte("k")); string(got) != "g:5" {
		t.Fatalf("after GC k = %q, want g:5", got)
	}
	now.Abort()
}

// TestValidationSeesPendingMoveOutOfRange: a writer that has pre-committed
// (not yet applied) an update moving a row out of an index range another
// serializable transaction scanned is ordered before it, so the scanner
// must fail validation (found in review: only the new index key was
// checked).
func TestValidationSeesPendingMoveOutOfRange(t *testing.T) {
	ctx := context.Background()
	e, err := Open(Options{Dir: t.TempDir(), Tables: enginetest.Tables, CacheBytes: 8 << 20, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx, engine.Discard{}); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	seed := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
	if err := seed.Put("kv", []byte("k"), []byte("active:1")); err != nil {
		t.Fatal(err)
	}
	if _, err := seed.PreCommit(); err != nil {
		t.Fatal(err)
	}
	if err := seed.PostCommit(nil); err != nil {
		t.Fatal(err)
	}
	snap := e.LatestSnapshot()
	mover := e.Begin(snap, engine.Serializable)
	scanner := e.Begin(snap, engine.Serializable)
	n := 0
	if err := scanner.Scan("kv", "by_group", []byte("active"), []byte("active\x00"), func(k, v []byte) bool { n++; return true }); err != nil || n != 1 {
		t.Fatalf("scan: %d rows, %v", n, err)
	}
	if err := scanner.Put("kv", []byte("x"), []byte("other:1")); err != nil {
		t.Fatal(err)
	}
	if err := mover.Put("kv", []byte("k"), []byte("inactive:1")); err != nil {
		t.Fatal(err)
	}
	if _, err := mover.PreCommit(); err != nil {
		t.Fatal(err)
	}
	if _, err := scanner.PreCommit(); !errors.Is(err, engine.ErrValidation) {
		t.Fatalf("scanner validated past a pending move out of its range: %v", err)
	}
	if err := mover.PostCommit(nil); err != nil {
		t.Fatal(err)
	}
}
