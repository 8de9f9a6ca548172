package query_test

import (
	"context"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
)

// The history's window moves: LWM follows it, staying at or below the
// snapshot of every time still inside the window, and only that far.
func TestHistoryWindowHoldsAndReleasesLWM(t *testing.T) {
	const keep = 8 * time.Second
	n := servertest.OpenNodeTuned(t, func(c *server.NodeConfig) { c.QueryHistory = keep })
	tb := createTable(t, n, "account", accountCols(), "id")
	ctx := context.Background()
	start := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	snapAt := map[time.Duration]uint64{} // the snapshot current at each tick
	for i := range 40 {
		at := time.Duration(i) * 500 * time.Millisecond
		apply(t, n, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(i), "o", int64(i)}})
		w, err := n.Txn.Watermarks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		snapAt[at] = w.HWM - 1
		if err := n.Engine.TickHistory(ctx, start.Add(at)); err != nil {
			t.Fatal(err)
		}
		w, err = n.Txn.Watermarks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Everything from at − keep on must still be readable ...
		if from := at - keep; from >= 0 && w.LWM > snapAt[from.Truncate(500*time.Millisecond)] {
			t.Fatalf("at %s: LWM %d passed the snapshot %d of %s, inside the history", at, w.LWM, snapAt[from], from)
		}
		// ... and no more than keep × 9/8 back is held.
		if old := at - keep*9/8 - time.Second; old >= 0 && w.LWM <= snapAt[old.Truncate(500*time.Millisecond)] {
			t.Fatalf("at %s: LWM %d still holds the snapshot of %s, beyond the history", at, w.LWM, old)
		}
	}
}
