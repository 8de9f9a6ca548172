package server_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// player is a row of the table the added-column test evolves: score is
// the column added later, "NULL" where a row has none.
type player struct {
	name  string
	score string
}

// TestAddedColumnReadsNullInOlderData: a table gains a column while rows of
// it sit in every place a row can be (combined files, flushed blocks, the
// block being built). Rows written before read NULL in it, rows written
// after carry their values, operations shaped before the change (a source
// replaying older changes) get NULL, and so it stays through combination,
// storage GC (which rewrites old files with the new column), a checkpoint
// and a restart.
func TestAddedColumnReadsNullInOlderData(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	n := mustOpen(t, dir, "pebble", nil) // blocks of 32 rows, files of 128
	tb := servertest.CreateTable(t, n, "player", []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "name", Type: types.Of(types.String), Nullable: true},
	}, "id")
	want := map[int64]player{}
	var ops []change.Op
	for id := range int64(300) { // two full files and one filling
		name := fmt.Sprintf("p%d", id)
		want[id] = player{name, "NULL"}
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{id, name}})
	}
	servertest.Apply(t, n, ops...)
	waitRegular(t, n, tb.ID, 2)
	if err := checkpointNow(n); err != nil {
		t.Fatal(err)
	}

	if _, err := n.Catalog.AddColumn(ctx, tb.ID, catalog.Column{Name: "score", Type: types.Of(types.Int64), Nullable: true}); err != nil {
		t.Fatal(err)
	}
	checkPlayers(t, n, want, "added, nothing written since")

	// One transaction: an operation shaped before the change, then wide ones.
	ops = []change.Op{
		{Table: tb.ID, Kind: change.Insert, Row: []any{int64(300), "old shape"}},
		{Table: tb.ID, Kind: change.Insert, Row: []any{int64(301), "new", int64(7)}},
		{Table: tb.ID, Kind: change.Update, Row: []any{int64(5), "p5", int64(50)}},       // in a combined file
		{Table: tb.ID, Kind: change.Update, Row: []any{int64(299), "p299", int64(2990)}}, // in the filling file
		{Table: tb.ID, Kind: change.Update, Row: []any{int64(6), "renamed"}},             // old shape: score stays NULL
	}
	want[300] = player{"old shape", "NULL"}
	want[301] = player{"new", "7"}
	want[5] = player{"p5", "50"}
	want[299] = player{"p299", "2990"}
	want[6] = player{"renamed", "NULL"}
	for id := int64(10); id < 120; id++ { // most of the first file: storage GC rewrites it
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{id}})
		delete(want, id)
	}
	servertest.Apply(t, n, ops...)
	checkPlayers(t, n, want, "in memory")

	ops = nil
	for id := int64(400); id < 700; id++ { // files written whole with the new column
		want[id] = player{fmt.Sprintf("p%d", id), fmt.Sprint(id % 3)}
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{id, fmt.Sprintf("p%d", id), id % 3}})
	}
	servertest.Apply(t, n, ops...)
	waitRegular(t, n, tb.ID, 4)
	checkPlayers(t, n, want, "combined")

	if err := n.StorageGCRound(ctx); err != nil {
		t.Fatal(err)
	}
	if err := checkpointNow(n); err != nil {
		t.Fatal(err)
	}
	if _, _, rewritten := gcFiles(n, tb.ID); rewritten == 0 {
		t.Fatal("storage GC rewrote no file: the test does not reach the rewrite of a file older than the column")
	}
	checkPlayers(t, n, want, "after storage GC")

	crashed, cancel := context.WithCancel(ctx)
	cancel()
	n.Close(crashed)
	n = mustOpen(t, dir, "pebble", nil)
	defer n.Close(ctx)
	checkPlayers(t, n, want, "after a restart")

	servertest.Apply(t, n,
		change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(800), "old shape again"}},
		change.Op{Table: tb.ID, Kind: change.Update, Row: []any{int64(301), "new", int64(8)}})
	want[800] = player{"old shape again", "NULL"}
	want[301] = player{"new", "8"}
	checkPlayers(t, n, want, "written after the restart")
}

// checkPlayers compares the player table over SQL with want.
func checkPlayers(t *testing.T, n *server.Node, want map[int64]player, when string) {
	t.Helper()
	got := map[int64]player{}
	for _, v := range servertest.Query(t, n, "SELECT id, name, coalesce(CAST(score AS VARCHAR), 'NULL') FROM player") {
		got[v[0].(int64)] = player{fmt.Sprint(v[1]), fmt.Sprint(v[2])}
	}
	if maps.Equal(got, want) {
		return
	}
	var diff []string
	for id, w := range want {
		if g, ok := got[id]; !ok || g != w {
			diff = append(diff, fmt.Sprintf("%d: got %+v (present %v), want %+v", id, g, ok, w))
		}
	}
	for id, g := range got {
		if _, ok := want[id]; !ok {
			diff = append(diff, fmt.Sprintf("%d: got %+v, want no row", id, g))
		}
	}
	if len(diff) > 5 {
		diff = append(diff[:5], fmt.Sprintf("and %d more", len(diff)-5))
	}
	t.Fatalf("%s: %d rows, want %d:\n%s", when, len(got), len(want), strings.Join(diff, "\n"))
}
