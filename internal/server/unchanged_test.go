package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// TestUpdateKeepsUnchangedColumns: an update that does not carry some
// columns (PostgreSQL's unchanged TOAST values) takes them from the row's
// current version wherever it is stored: a combined regular file, a
// flushed block of a virtual file, a block still in memory, or a version
// written earlier in the same batch.
func TestUpdateKeepsUnchangedColumns(t *testing.T) {
	ctx := context.Background()
	n := servertest.OpenNodeWith(t, 64, 4) // 256-row files
	tb := servertest.CreateTable(t, n, "doc", []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "n", Type: types.Of(types.Int64), Nullable: true},
		{Name: "body", Type: types.Of(types.String), Nullable: true},
	}, "id")
	body := func(id int64) string { return fmt.Sprintf("body of %d", id) }
	insert := func(from, to int64) {
		var ops []change.Op
		for id := from; id < to; id++ {
			ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{id, int64(0), body(id)}})
		}
		servertest.Apply(t, n, ops...)
	}
	insert(0, 600)
	if err := n.Replayers[0].Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Full files are combined in the background: wait for the first.
	deadline := time.Now().Add(time.Minute)
	for {
		regular := false
		for _, f := range n.Catalog.Snapshot().Files(tb.ID) {
			regular = regular || f.State == catalog.Regular
		}
		if regular {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no file was combined")
		}
		time.Sleep(10 * time.Millisecond)
	}
	insert(600, 610) // in memory
	keep := func(id, v int64) change.Op {
		return change.Op{Table: tb.ID, Kind: change.Update, Key: []any{id}, Row: []any{id, v, nil}, Unchanged: []int{2}}
	}
	// 3: a combined file; 520: a flushed block of the open file; 605: the
	// block in memory; 605 again: the version the batch itself just wrote.
	servertest.Apply(t, n, keep(3, 1), keep(520, 1), keep(605, 1), keep(605, 2))
	sess, err := n.Engine.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	res, err := sess.Run(ctx, "SELECT id, n, body FROM doc WHERE id IN (3, 520, 605) ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	want := map[int64]int64{3: 1, 520: 1, 605: 2}
	got := 0
	for res.Next() {
		v, err := res.Values()
		if err != nil {
			t.Fatal(err)
		}
		id := v[0].(int64)
		if v[1].(int64) != want[id] || v[2] != body(id) {
			t.Errorf("row %d: n %v body %q, want n %d body %q", id, v[1], v[2], want[id], body(id))
		}
		got++
	}
	if got != 3 {
		t.Fatalf("%d rows, want 3", got)
	}
}
