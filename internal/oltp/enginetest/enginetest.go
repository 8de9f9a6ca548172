// Package enginetest is the conformance suite every engine behind the
// engine interface passes: snapshot reads, first-committer-wins, scans by
// primary and secondary index, serializable validation, and durability
// across a reopen.
package enginetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/retinadb/retina/internal/oltp/engine"
)

// Opened is an engine as its package returns it.
type Opened interface {
	engine.Engine
	Recovered() []engine.Recovered
	Start(ctx context.Context, d engine.Discard) error
	Close() error
}

// Opener opens the engine in dir with Tables.
type Opener func(dir string, tables []engine.TableSpec) (Opened, error)

// Tables is the schema the suite uses: "kv" rows are "group:value", indexed
// by group.
var Tables = []engine.TableSpec{{
	Name: "kv",
	Indexes: []engine.IndexSpec{{Name: "by_group", Key: func(row []byte) []byte {
		g, _, ok := bytes.Cut(row, []byte(":"))
		if !ok {
			return nil
		}
		return g
	}}},
}}

// Run runs the suite.
func Run(t *testing.T, open Opener) {
	start := func(t *testing.T, dir string) Opened {
		t.Helper()
		e, err := open(dir, Tables)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(context.Background(), engine.Discard{}); err != nil {
			t.Fatal(err)
		}
		return e
	}
	commit := func(t *testing.T, e Opened, tx engine.Tx) uint64 {
		t.Helper()
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
	put := func(t *testing.T, e Opened, kvs ...string) uint64 {
		t.Helper()
		tx := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
		for i := 0; i < len(kvs); i += 2 {
			var err error
			if kvs[i+1] == "" {
				err = tx.Delete("kv", []byte(kvs[i]))
			} else {
				err = tx.Put("kv", []byte(kvs[i]), []byte(kvs[i+1]))
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		return commit(t, e, tx)
	}
	get := func(t *testing.T, tx engine.Tx, k string) string {
		t.Helper()
		v, ok, err := tx.Get("kv", []byte(k))
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return "<none>"
		}
		return string(v)
	}
	scan := func(t *testing.T, tx engine.Tx, index, lo, hi string) string {
		t.Helper()
		var b bytes.Buffer
		var h []byte
		if hi != "" {
			h = []byte(hi)
		}
		if err := tx.Scan("kv", index, []byte(lo), h, func(k, v []byte) bool {
			fmt.Fprintf(&b, "%s=%s ", k, v)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}

	t.Run("snapshot", func(t *testing.T) {
		e := start(t, t.TempDir())
		defer e.Close()
		put(t, e, "a", "g1:1", "b", "g1:2")
		old := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
		put(t, e, "a", "g2:3", "b", "")
		now := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
		if got := get(t, old, "a") + " " + get(t, old, "b"); got != "g1:1 g1:2" {
			t.Fatalf("old snapshot reads %q", got)
		}
		if got := get(t, now, "a") + " " + get(t, now, "b"); got != "g2:3 <none>" {
			t.Fatalf("new snapshot reads %q", got)
		}
		if got := scan(t, old, "by_group", "g1", "g2"); got != "a=g1:1 b=g1:2 " {
			t.Fatalf("old index scan %q", got)
		}
		if got := scan(t, now, "by_group", "g1", "g2"); got != "" {
			t.Fatalf("new index scan of g1 %q (stale entries must be filtered)", got)
		}
		if got := scan(t, now, "", "", ""); got != "a=g2:3 " {
			t.Fatalf("new primary scan %q", got)
		}
		// Own writes overlay the snapshot.
		if err := now.Put("kv", []byte("c"), []byte("g1:4")); err != nil {
			t.Fatal(err)
		}
		if got := scan(t, now, "by_group", "g1", ""); got != "c=g1:4 a=g2:3 " {
			t.Fatalf("scan with own writes %q", got)
		}
		old.Abort()
		now.Abort()
	})

	t.Run("first-committer-wins", func(t *testing.T) {
		e := start(t, t.TempDir())
		defer e.Close()
		put(t, e, "a", "g:0")
		t1 := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
		t2 := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
		if err := t1.Put("kv", []byte("a"), []byte("g:1")); err != nil {
			t.Fatal(err)
		}
		if err := t2.Put("kv", []byte("a"), []byte("g:2")); !errors.Is(err, engine.ErrWriteConflict) {
			t.Fatalf("second writer of a held row: %v, want a write conflict", err)
		}
		commit(t, e, t1)
		t2.Abort()
		t3 := e.Begin(t1.Snapshot(), engine.SnapshotIsolation)
		if err := t3.Put("kv", []byte("a"), []byte("g:3")); !errors.Is(err, engine.ErrWriteConflict) {
			t.Fatalf("writer whose snapshot predates a committed version: %v, want a write conflict", err)
		}
		t3.Abort()
		if !engine.Retryable(engine.ErrWriteConflict) {
			t.Fatal("write conflicts must be retryable")
		}
	})

	t.Run("serializable-write-skew", func(t *testing.T) {
		e := start(t, t.TempDir())
		defer e.Close()
		put(t, e, "x", "g:1", "y", "g:1")
		snap := e.LatestSnapshot()
		t1 := e.Begin(snap, engine.Serializable)
		t2 := e.Begin(snap, engine.Serializable)
		get(t, t1, "y")
		get(t, t2, "x")
		if err := t1.Put("kv", []byte("x"), []byte("g:0")); err != nil {
			t.Fatal(err)
		}
		if err := t2.Put("kv", []byte("y"), []byte("g:0")); err != nil {
			t.Fatal(err)
		}
		commit(t, e, t1)
		if _, err := t2.PreCommit(); !errors.Is(err, engine.ErrValidation) {
			t.Fatalf("write skew committed: %v, want a validation failure", err)
		}
		t2.Abort()
		// A phantom: an insert into a scanned index range.
		t3 := e.Begin(e.LatestSnapshot(), engine.Serializable)
		t4 := e.Begin(e.LatestSnapshot(), engine.Serializable)
		scan(t, t3, "by_group", "h", "i")
		if err := t3.Put("kv", []byte("z"), []byte("g:9")); err != nil {
			t.Fatal(err)
		}
		if err := t4.Put("kv", []byte("w"), []byte("h:1")); err != nil {
			t.Fatal(err)
		}
		commit(t, e, t4)
		if _, err := t3.PreCommit(); !errors.Is(err, engine.ErrValidation) {
			t.Fatalf("phantom in a scanned range committed: %v, want a validation failure", err)
		}
		t3.Abort()
	})

	t.Run("reopen", func(t *testing.T) {
		dir := t.TempDir()
		e := start(t, dir)
		for i := 0; i < 100; i++ {
			put(t, e, fmt.Sprintf("k%03d", i), fmt.Sprintf("g%d:%d", i%3, i))
		}
		put(t, e, "k000", "")
		last := e.LatestSnapshot()
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		e = start(t, dir)
		defer e.Close()
		if e.LatestSnapshot() < last {
			t.Fatalf("reopened at %d, below the last commit %d", e.LatestSnapshot(), last)
		}
		tx := e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation)
		if got := get(t, tx, "k000") + " " + get(t, tx, "k099"); got != "<none> g0:99" {
			t.Fatalf("after reopen: %q", got)
		}
		n := 0
		_ = tx.Scan("kv", "by_group", []byte("g1"), []byte("g2"), func(k, v []byte) bool { n++; return true })
		if n != 33 {
			t.Fatalf("after reopen the g1 index holds %d rows, want 33", n)
		}
		tx.Abort()
		put(t, e, "k000", "g0:new")
	})
}
