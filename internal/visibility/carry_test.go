package visibility

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// TestCarryKeepsEveryLaterSnapshot: the carried row group answers every
// snapshot at or above the carry point as the sources do for the kept
// tuples, before and after memory GC ran on the sources, and takes later
// deletes like any row group.
func TestCarryKeepsEveryLaterSnapshot(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for round := range 50 {
		var sources []Source
		var oracles []oracle
		for range 1 + rng.IntN(3) {
			rows := 1 + rng.IntN(3000)
			g := mustRowGroup(t, rows, WithTileSize(256))
			o := deleteRandomly(t, g, rng, rng.IntN(rows), 200)
			if rng.IntN(2) == 0 {
				g.Collect(uint64(rng.IntN(80)))
			}
			sources = append(sources, Source{From: g})
			oracles = append(oracles, o)
		}
		s := uint64(80 + rng.IntN(20)) // the rewrite keeps what is live at s
		at := s + uint64(rng.IntN(20)) // and switches later, at
		for i := range sources {
			for off := range sources[i].From.Rows() {
				if d, ok := oracles[i][uint32(off)]; !ok || d > s {
					sources[i].Kept = append(sources[i].Kept, uint32(off))
				}
			}
		}
		g, err := Carry(at, sources, WithTileSize(256))
		if err != nil {
			t.Fatal(err)
		}
		check := func(ts uint64) {
			bm := make([]uint64, g.BitmapWords())
			if err := g.Bitmap(ts, bm); err != nil {
				t.Fatalf("round %d at %d: %v", round, ts, err)
			}
			n := 0
			for i, src := range sources {
				for _, off := range src.Kept {
					d, ok := oracles[i][off]
					want := ok && d <= ts
					if got := bm[n/64]>>(n%64)&1 == 1; got != want {
						t.Fatalf("round %d snapshot %d: source %d offset %d (new %d) deleted %v, want %v", round, ts, i, off, n, got, want)
					}
					n++
				}
			}
		}
		for ts := at; ts <= 210; ts += 7 {
			check(ts)
		}
		if _, err := g.Checkpoint(at - 1); at > 0 && err == nil {
			t.Fatalf("round %d: a snapshot below the carry point answered", round)
		}
		if g.Rows() > 0 {
			o := uint32(rng.IntN(g.Rows()))
			if err := g.Delete(o, 300); err != nil && !errors.Is(err, ErrAlreadyDeleted) {
				t.Fatalf("a later delete: %v", err)
			}
		}
	}
}
