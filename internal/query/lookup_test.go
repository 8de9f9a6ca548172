package query_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/query"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
)

// Point lookups (WHERE pk = value through the index) return what a scan
// returns, at every snapshot: at a statement's own, in transactions begun
// before later changes, and in transactions whose view was checkpointed
// (the index may no longer know their snapshot; they scan). The scan is
// the same query with the key wrapped so it is not a lookup. On a file://
// lake the rows come from files read directly and footers kept, and the
// scan is DuckDB's native one.
func TestPointLookupsMatchScans(t *testing.T) {
	t.Run("memory lake", func(t *testing.T) { pointLookupsMatchScans(t, openNode(t)) })
	t.Run("file lake", func(t *testing.T) {
		pointLookupsMatchScans(t, servertest.OpenNodeTuned(t, func(c *server.NodeConfig) { c.Lake = "" }))
	})
}

func pointLookupsMatchScans(t *testing.T, n *server.Node) {
	ctx := context.Background()
	tb := createTable(t, n, "account", accountCols(), "id")
	rng := rand.New(rand.NewPCG(3, 4))
	live := map[int64]bool{}
	var held []*query.Session // sessions inside a transaction at an older snapshot
	check := func(s *query.Session, what string) {
		t.Helper()
		for range 4 {
			k := rng.Int64N(40)
			// The lookup, as a literal and as a parameter; the scan.
			a := fmt.Sprint(queryAll(t, s, fmt.Sprintf("SELECT id, owner, balance FROM account WHERE id = %d", k)))
			b := fmt.Sprint(queryAll(t, s, "SELECT id, owner, balance FROM account a WHERE a.id = $1 AND balance >= 0", k))
			c := fmt.Sprint(queryAll(t, s, fmt.Sprintf("SELECT id, owner, balance FROM account WHERE id + 0 = %d", k)))
			if a != c || b != c {
				t.Fatalf("%s: key %d: lookup %s, with a parameter %s, scan %s", what, k, a, b, c)
			}
		}
	}
	for round := range 21 {
		var ops []change.Op
		for range 8 {
			k := rng.Int64N(40)
			switch {
			case !live[k]:
				ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{k, fmt.Sprintf("o%d", round), int64(round)}})
				live[k] = true
			case rng.IntN(3) == 0:
				ops = append(ops, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{k}})
				live[k] = false
			default:
				ops = append(ops, change.Op{Table: tb.ID, Kind: change.Update, Row: []any{k, fmt.Sprintf("u%d", round), int64(round * 10)}})
			}
		}
		apply(t, n, ops...)
		s, err := n.Engine.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		check(s, fmt.Sprintf("round %d", round))
		if round%5 == 0 {
			queryAll(t, s, "BEGIN")
			held = append(held, s)
		} else {
			s.Close()
		}
		if round%7 == 6 {
			// Checkpoint every view: held transactions now read frozen
			// bitmaps, and GC may drop the index versions they would need.
			if _, err := n.Engine.CheckpointOldViews(ctx, 0); err != nil {
				t.Fatal(err)
			}
			w, err := n.Txn.Watermarks(ctx)
			if err != nil {
				t.Fatal(err)
			}
			n.Collect(w.LWM)
			n.PurgeIndex(w.LWM)
		}
		for i, h := range held {
			check(h, fmt.Sprintf("round %d, transaction %d", round, i))
		}
	}
	for _, h := range held {
		h.Close()
	}
	if st := n.Engine.Stats(); st.PointLookups == 0 || st.PointLookupScans == 0 {
		t.Fatalf("%d lookups through the index, %d by scanning: both paths must be checked", st.PointLookups, st.PointLookupScans)
	}
}
