package memengine

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/enginetest"
)

func TestConformance(t *testing.T) {
	enginetest.Run(t, func(dir string, tables []engine.TableSpec) (enginetest.Opened, error) {
		return Open(Options{Dir: dir, Tables: tables})
	})
}

// TestTornTailThenMoreSegments: a torn tail at the end of the last segment
// (a crash mid-write) is cut off at recovery, so once newer segments
// follow it the old segment still reads cleanly.
func TestTornTailThenMoreSegments(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	commitOne := func(e *Engine, key string) {
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
		if err := e.WaitDurable(ctx, cts); err != nil {
			t.Fatal(err)
		}
	}
	open := func() *Engine {
		e, err := Open(Options{Dir: dir, Tables: enginetest.Tables})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(ctx, engine.Discard{}); err != nil {
			t.Fatal(err)
		}
		return e
	}
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
