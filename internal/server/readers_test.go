package server_test

import (
	"context"
	"maps"
	"testing"
)

// TestVisibilityCheckpointFreesLWM: a read transaction whose visibility is
// checkpointed stops holding LWM; memory GC folds the deletes after its
// snapshot, the index purges, storage GC rewrites the file it reads and the
// switch goes in, and it still reads exactly its snapshot, until it ends
// and the replaced file goes.
func TestVisibilityCheckpointFreesLWM(t *testing.T) {
	for _, backend := range []string{"memory", "pebble"} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			n := mustOpen(t, t.TempDir(), backend, nil)
			defer n.Close(ctx)
			w := &workload{n: n, tb: accountTable(t, n), state: map[int64]int64{}}
			w.insert(t, 300) // two full files of 128 rows and one filling
			first := waitRegular(t, n, w.tb.ID, 2)[0]
			held := beginRead(t, n)
			atHeld := maps.Clone(w.state)
			if got := held.rows(t); !maps.Equal(got, atHeld) {
				t.Fatalf("held read: %d rows, want %d", len(got), len(atHeld))
			}
			var stale []int64
			for id := int64(1); id <= 100; id++ {
				stale = append(stale, id)
			}
			w.del(t, stale[:50]...)
			w.update(t, stale[50:]...) // the first file is 100/128 stale after the held snapshot
			lwm := func() uint64 {
				wm, err := n.Txn.Watermarks(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return wm.LWM
			}
			before := lwm()

			n.CheckpointReaders(ctx, 0)
			if got := n.Readers().Checkpoints.Load(); got != 1 {
				t.Fatalf("%d visibility checkpoints, want 1", got)
			}
			w.update(t, 200)
			if after := lwm(); after <= before {
				t.Fatalf("LWM stayed at %d after the checkpoint", after)
			}
			if st := n.CollectVisibility(ctx); st.Folded == 0 {
				t.Fatal("memory GC folded nothing past the held snapshot")
			}
			n.PurgeIndex(lwm())
			if got := held.rows(t); !maps.Equal(got, atHeld) {
				t.Fatalf("held read after GC: %d rows, want %d", len(got), len(atHeld))
			}

			rewriteAndSwitch(t, n, w.tb.ID)
			w.update(t, 201) // LWM passes the switch
			if err := n.StorageGCRound(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := n.Lake.Size(ctx, first.Key); err != nil {
				t.Fatalf("the replaced file went while a checkpointed reader plans with it: %v", err)
			}
			if got := held.rows(t); !maps.Equal(got, atHeld) {
				t.Fatalf("held read after the switch: %d rows, want %d", len(got), len(atHeld))
			}
			if got := rows(t, n); !maps.Equal(got, w.state) {
				t.Fatalf("a new read: %d rows, want %d", len(got), len(w.state))
			}

			held.end(t)
			if err := n.StorageGCRound(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := n.Lake.Size(ctx, first.Key); err == nil {
				t.Fatal("the replaced file stayed after the reader ended")
			}
		})
	}
}
