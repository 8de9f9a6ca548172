package pgwire_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
)

func TestTimeTravel(t *testing.T) {
	n := servertest.OpenNodeTuned(t, func(c *server.NodeConfig) { c.QueryHistory = time.Hour })
	tb := servertest.CreateTable(t, n, "account", accountCols(), "id")
	ctx := context.Background()
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	tick := func(at time.Time) {
		if err := n.Engine.TickHistory(ctx, at); err != nil {
			t.Fatal(err)
		}
	}
	tick(t0)
	var ops []change.Op
	for i := range 5 {
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(i), "o", int64(10)}})
	}
	servertest.Apply(t, n, ops...)
	tick(t0.Add(time.Second))
	ops = ops[:0]
	for i := range 4 {
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Update, Row: []any{int64(i), "o", int64(20)}})
	}
	ops = append(ops, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{int64(4)}})
	servertest.Apply(t, n, ops...)
	tick(t0.Add(2 * time.Second))
	// GC runs as hard as it can: the history's pin holds it back.
	w, err := n.Txn.Watermarks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n.Collect(w.LWM)
	n.PurgeIndex(w.LWM)
	n.CollectVisibility(ctx)

	c := connect(t, serve(t, n))
	state := func() string {
		t.Helper()
		var count, sum int64
		if err := c.QueryRow(ctx, "SELECT count(*), sum(balance) FROM account").Scan(&count, &sum); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%d rows, sum %d", count, sum)
	}
	set := func(v string) {
		t.Helper()
		if _, err := c.Exec(ctx, "SET retina.as_of = '"+v+"'"); err != nil {
			t.Fatal(err)
		}
	}
	if got := state(); got != "4 rows, sum 80" {
		t.Fatalf("now: %s", got)
	}
	for at, want := range map[string]string{
		"2026-12-03 10:00:00.5+00": "0 rows, sum 0", // before the first commit
		"2026-12-03 10:00:01+00":   "5 rows, sum 50",
		"2026-12-03T11:00:01.5+01": "5 rows, sum 50", // the same instant in another zone
		"2026-12-03 10:00:05+00":   "4 rows, sum 80",
	} {
		set(at)
		if at == "2026-12-03 10:00:00.5+00" {
			var count int64
			if err := c.QueryRow(ctx, "SELECT count(*) FROM account").Scan(&count); err != nil || count != 0 {
				t.Fatalf("as of %s: %d rows, %v", at, count, err)
			}
			continue
		}
		if got := state(); got != want {
			t.Fatalf("as of %s: %s, want %s", at, got, want)
		}
	}
	// A snapshot number, as retina_snapshot() reports it, inside a
	// transaction too.
	if _, err := c.Exec(ctx, "RESET retina.as_of"); err != nil {
		t.Fatal(err)
	}
	set("2026-12-03 10:00:01+00")
	var snap uint64
	if err := c.QueryRow(ctx, "SELECT retina_snapshot()").Scan(&snap); err != nil {
		t.Fatal(err)
	}
	set(fmt.Sprint(snap))
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var count int64
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM account").Scan(&count); err != nil || count != 5 {
		t.Fatalf("as of snapshot %d in a transaction: %d rows, %v", snap, count, err)
	}
	tx.Rollback(ctx)

	// Beyond the history: SQLSTATE 72000 (snapshot_too_old), and a bad
	// value is refused when set.
	set("2026-12-03 08:00:00+00")
	_, err = c.Exec(ctx, "SELECT count(*) FROM account")
	if sqlState(err) != "72000" {
		t.Fatalf("before the history: %v", err)
	}
	if _, err := c.Exec(ctx, "SET retina.as_of = 'yesterday-ish'"); sqlState(err) != "22023" {
		t.Fatalf("a bad as-of: %v", err)
	}
	if _, err := c.Exec(ctx, "RESET retina.as_of"); err != nil {
		t.Fatal(err)
	}
	if got := state(); got != "4 rows, sum 80" {
		t.Fatalf("after RESET: %s", got)
	}
}
