package visibility

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// oracle is the naive model: offset → delete ts.
type oracle map[uint32]uint64

func (o oracle) bitmap(rows int, ts uint64) []uint64 {
	bm := make([]uint64, (rows+63)/64)
	for off, d := range o {
		if d <= ts {
			bm[off/64] |= 1 << (off % 64)
		}
	}
	return bm
}

func diffBitmaps(got, want []uint64) string {
	for i := range want {
		if got[i] != want[i] {
			return fmt.Sprintf("word %d: got %064b want %064b", i, got[i], want[i])
		}
	}
	return ""
}

func mustRowGroup(t testing.TB, rows int, opts ...Option) *RowGroup {
	t.Helper()
	g, err := NewRowGroup(rows, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestPropertyAgainstOracle applies random out-of-order deletes, rollbacks
// of the newest ones, random GC points and random snapshots and compares
// every bitmap with the oracle.
func TestPropertyAgainstOracle(t *testing.T) {
	rounds := 60
	if testing.Short() {
		rounds = 15
	}
	for seed := range uint64(rounds) {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		rows := 1 + rng.IntN(20000)
		tileSize := 64 << rng.IntN(7)
		t.Run(fmt.Sprintf("seed=%d/rows=%d/tile=%d", seed, rows, tileSize), func(t *testing.T) {
			checkAgainstOracle(t, rng, rows, tileSize)
		})
	}
}

func checkAgainstOracle(t *testing.T, rng *rand.Rand, rows, tileSize int) {
	g := mustRowGroup(t, rows, WithTileSize(tileSize))
	model := oracle{}
	live := rng.Perm(rows) // offsets not deleted yet, consumed from the end
	var hwm, lwm uint64 = 1, 0
	dst := make([]uint64, g.BitmapWords())
	for batch := 0; batch < 40 && len(live) > 0; batch++ {
		// A group of transactions gets consecutive timestamps; their deletes
		// land in shuffled order, as from several buckets.
		k := 1 + rng.IntN(min(len(live), 200))
		type del struct {
			off uint32
			ts  uint64
		}
		dels := make([]del, k)
		for i := range dels {
			dels[i] = del{uint32(live[len(live)-1]), hwm + uint64(i)}
			live = live[:len(live)-1]
		}
		rng.Shuffle(len(dels), func(i, j int) { dels[i], dels[j] = dels[j], dels[i] })
		for _, d := range dels {
			if err := g.Delete(d.off, d.ts); err != nil {
				t.Fatalf("delete %d@%d: %v", d.off, d.ts, err)
			}
			model[d.off] = d.ts
			// A second delete of the same tuple is always refused.
			if rng.IntN(8) == 0 {
				if err := g.Delete(d.off, d.ts+uint64(k)); !errors.Is(err, ErrAlreadyDeleted) {
					t.Fatalf("duplicate delete of %d: got %v, want ErrAlreadyDeleted", d.off, err)
				}
			}
		}
		// Sometimes the newest transactions of the group are rolled back:
		// their deletes are taken back (in any order) and the tuples become
		// deletable again.
		if rng.IntN(4) == 0 {
			cut := hwm + rng.Uint64N(uint64(k))
			rng.Shuffle(len(dels), func(i, j int) { dels[i], dels[j] = dels[j], dels[i] })
			for _, d := range dels {
				if d.ts < cut {
					continue
				}
				if err := g.Undelete(d.off, d.ts); err != nil {
					t.Fatalf("undelete %d@%d: %v", d.off, d.ts, err)
				}
				if err := g.Undelete(d.off, d.ts); !errors.Is(err, ErrNotDeleted) {
					t.Fatalf("second undelete of %d@%d: got %v, want ErrNotDeleted", d.off, d.ts, err)
				}
				delete(model, d.off)
				live = append(live, int(d.off))
			}
		}
		hwm += uint64(k)

		for range 4 {
			s := lwm + rng.Uint64N(hwm-lwm)
			if err := g.Bitmap(s, dst); err != nil {
				t.Fatalf("bitmap at %d (lwm %d): %v", s, lwm, err)
			}
			if d := diffBitmaps(dst, model.bitmap(rows, s)); d != "" {
				t.Fatalf("bitmap at %d: %s", s, d)
			}
		}

		if rng.IntN(3) == 0 {
			newLWM := lwm + rng.Uint64N(hwm-lwm)
			g.Collect(newLWM)
			// Below the watermark the answer is either an error or exact.
			if newLWM > 0 {
				s := rng.Uint64N(newLWM)
				if err := g.Bitmap(s, dst); err == nil {
					if d := diffBitmaps(dst, model.bitmap(rows, s)); d != "" {
						t.Fatalf("bitmap below lwm at %d: wrong instead of failing: %s", s, d)
					}
				} else if !errors.Is(err, ErrSnapshotTooOld) {
					t.Fatalf("bitmap below lwm: %v", err)
				}
			}
			lwm = newLWM
			// A delete at or below a collected base is refused.
			if len(live) > 0 && lwm > 0 {
				off := uint32(live[len(live)-1])
				if err := g.Delete(off, lwm); err != nil && !errors.Is(err, ErrBelowBase) {
					t.Fatalf("delete at lwm: %v", err)
				} else if err == nil {
					// The tile had not been collected: the delete is valid.
					model[off] = lwm
					live = live[:len(live)-1]
				}
			}
		}
	}
	// Everything collected: the bitmap at the last timestamp is the oracle's.
	g.Collect(hwm - 1)
	if err := g.Bitmap(hwm-1, dst); err != nil {
		t.Fatal(err)
	}
	if d := diffBitmaps(dst, model.bitmap(rows, hwm-1)); d != "" {
		t.Fatalf("after full collect: %s", d)
	}
}

// TestCollectEquivalence: for any s ≥ lwm the bitmap after Collect(lwm)
// equals the bitmap before it.
func TestCollectEquivalence(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, tileSize := range []int{64, 512, 4096} {
		rows := 3*tileSize + 17
		g := mustRowGroup(t, rows, WithTileSize(tileSize))
		perm := rng.Perm(rows)
		// Timestamps 1..n assigned to random offsets, applied out of order.
		n := rows / 2
		order := rng.Perm(n)
		for _, i := range order {
			if err := g.Delete(uint32(perm[i]), uint64(i+1)); err != nil {
				t.Fatal(err)
			}
		}
		for _, lwm := range []uint64{1, uint64(n / 3), uint64(n / 2), uint64(n - 1), uint64(n), uint64(n + 10)} {
			before := map[uint64][]uint64{}
			for s := lwm; s <= uint64(n)+2; s += max(1, uint64(n)/50) {
				bm := make([]uint64, g.BitmapWords())
				if err := g.Bitmap(s, bm); err != nil {
					t.Fatal(err)
				}
				before[s] = bm
			}
			g.Collect(lwm)
			for s, want := range before {
				got := make([]uint64, g.BitmapWords())
				if err := g.Bitmap(s, got); err != nil {
					t.Fatalf("tile %d lwm %d s %d: %v", tileSize, lwm, s, err)
				}
				if d := diffBitmaps(got, want); d != "" {
					t.Fatalf("tile %d: bitmap at %d changed by Collect(%d): %s", tileSize, s, lwm, d)
				}
			}
		}
	}
}

func TestDeleteRejections(t *testing.T) {
	g := mustRowGroup(t, 100)
	cases := []struct {
		name string
		off  uint32
		ts   uint64
		want error
	}{
		{"offset at row count", 100, 5, ErrOffsetOutOfRange},
		{"offset far out", 1 << 31, 5, ErrOffsetOutOfRange},
		{"zero timestamp", 1, 0, ErrInvalidTimestamp},
		{"timestamp 2^52", 1, 1 << 52, ErrInvalidTimestamp},
		{"timestamp max uint64", 1, ^uint64(0), ErrInvalidTimestamp},
	}
	for _, c := range cases {
		if err := g.Delete(c.off, c.ts); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	if err := g.Delete(3, MaxTimestamp); err != nil {
		t.Fatalf("largest timestamp refused: %v", err)
	}
	if err := g.Delete(3, 9); !errors.Is(err, ErrAlreadyDeleted) {
		t.Fatalf("second delete: got %v", err)
	}
	// A duplicate is still caught after GC folded the first delete and
	// retired the duplicate filter.
	if err := g.Delete(4, 10); err != nil {
		t.Fatal(err)
	}
	if st := g.Collect(20); st.RetiredFilters != 0 {
		// Offset 3 at MaxTimestamp is still pending, so the filter stays.
		t.Fatalf("filter retired with a pending delete: %+v", st)
	}
	g2 := mustRowGroup(t, 100)
	if err := g2.Delete(4, 10); err != nil {
		t.Fatal(err)
	}
	if st := g2.Collect(20); st.RetiredFilters != 1 || st.Folded != 1 {
		t.Fatalf("collect: %+v", st)
	}
	if err := g2.Delete(4, 30); !errors.Is(err, ErrAlreadyDeleted) {
		t.Fatalf("delete of a folded tuple: got %v", err)
	}
	if err := g2.Delete(5, 20); !errors.Is(err, ErrBelowBase) {
		t.Fatalf("delete at the base ts: got %v", err)
	}
	dst := make([]uint64, g2.BitmapWords())
	if err := g2.Bitmap(19, dst); !errors.Is(err, ErrSnapshotTooOld) {
		t.Fatalf("bitmap below base: got %v", err)
	}
	if err := g2.Bitmap(20, dst[:0]); err == nil {
		t.Fatal("short bitmap buffer accepted")
	}
}

func TestBadTileSizes(t *testing.T) {
	for _, n := range []int{0, 32, 100, 8192, -64} {
		if _, err := NewRowGroup(10, WithTileSize(n)); !errors.Is(err, ErrBadTileSize) {
			t.Errorf("tile size %d: got %v", n, err)
		}
	}
	if _, err := NewRowGroup(-1); err == nil {
		t.Error("negative row count accepted")
	}
}

func TestEmptyAndPartialTiles(t *testing.T) {
	g := mustRowGroup(t, 0)
	if err := g.Bitmap(5, nil); err != nil {
		t.Fatal(err)
	}
	if err := g.Delete(0, 1); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("delete in empty row group: %v", err)
	}
	// 4096+70 rows: the last tile has 70 tuples over two words.
	g = mustRowGroup(t, 4096+70)
	for _, off := range []uint32{0, 4095, 4096, 4096 + 69} {
		if err := g.Delete(off, uint64(off)+1); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]uint64, g.BitmapWords())
	if err := g.Bitmap(MaxTimestamp, dst); err != nil {
		t.Fatal(err)
	}
	want := oracle{0: 1, 4095: 4096, 4096: 4097, 4096 + 69: 4096 + 70}.bitmap(g.Rows(), MaxTimestamp)
	if d := diffBitmaps(dst, want); d != "" {
		t.Fatal(d)
	}
}

// TestSparseAndDenseBases crosses the threshold between the two base forms.
func TestSparseAndDenseBases(t *testing.T) {
	for _, deleted := range []int{0, 1, 127, 128, 129, 4000, 4096} {
		g := mustRowGroup(t, 4096)
		model := oracle{}
		rng := rand.New(rand.NewPCG(uint64(deleted), 1))
		for i, off := range rng.Perm(4096)[:deleted] {
			ts := uint64(i + 1)
			if err := g.Delete(uint32(off), ts); err != nil {
				t.Fatal(err)
			}
			model[uint32(off)] = ts
		}
		g.Collect(uint64(deleted) + 1)
		s := g.tiles[0].snap.Load()
		if deleted > 0 && (s.dense == nil) != (deleted <= 128) {
			t.Errorf("%d deleted: dense=%v", deleted, s.dense != nil)
		}
		dst := make([]uint64, 64)
		if err := g.Bitmap(uint64(deleted)+1, dst); err != nil {
			t.Fatal(err)
		}
		if d := diffBitmaps(dst, model.bitmap(4096, MaxTimestamp)); d != "" {
			t.Fatalf("%d deleted: %s", deleted, d)
		}
	}
}

// TestMemoryAfterCollect: a collected row group with 1% deleted stays well
// under one bit per tuple, and an idle tile keeps at most its tail block.
func TestMemoryAfterCollect(t *testing.T) {
	const rows = 1 << 20
	g := mustRowGroup(t, rows)
	rng := rand.New(rand.NewPCG(1, 2))
	perm := rng.Perm(rows)[:rows/100]
	for i, off := range perm {
		if err := g.Delete(uint32(off), uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	before := g.MemoryBytes()
	st := g.Collect(uint64(len(perm)))
	after := g.MemoryBytes()
	if st.RetiredFilters != len(g.tiles) {
		t.Fatalf("retired %d filters of %d tiles", st.RetiredFilters, len(g.tiles))
	}
	bits := float64(after*8) / rows
	t.Logf("memory before GC %d B, after %d B (%.3f bits/tuple)", before, after, bits)
	if bits > 1.05 {
		t.Fatalf("%.3f bits per tuple after GC", bits)
	}
	for i := range g.tiles {
		n := 0
		for b := g.tiles[i].snap.Load().head; b != nil; b = b.next.Load() {
			n++
		}
		if n > 1 {
			t.Fatalf("tile %d keeps %d blocks after a full collect", i, n)
		}
	}
	got := make([]uint64, g.BitmapWords())
	if err := g.Bitmap(uint64(len(perm)), got); err != nil {
		t.Fatal(err)
	}
	want := make([]uint64, g.BitmapWords())
	for _, off := range perm {
		want[off/64] |= 1 << (off % 64)
	}
	if !slices.Equal(got, want) {
		t.Fatal("bitmap after collect differs")
	}
}

// TestBitmapRange: the bitmap of any range of tuples says of each tuple
// what the whole bitmap says, and covers only the tiles of the range.
func TestBitmapRange(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, rows := range []int{1, 63, 64, 1000, 5000} {
		g := mustRowGroup(t, rows, WithTileSize(256))
		o := deleteRandomly(t, g, rng, rows/3, 100)
		var buf []uint64
		for range 200 {
			first := rng.IntN(rows)
			n := rng.IntN(rows - first + 1)
			ts := uint64(rng.IntN(110))
			want := o.bitmap(rows, ts)
			bm, bit, err := g.BitmapRange(ts, first, n, buf)
			if err != nil {
				t.Fatal(err)
			}
			buf = bm
			if tiles := (first+n-1)/256 - first/256 + 1; n > 0 && len(bm) > tiles*4 {
				t.Fatalf("rows %d [%d,+%d): %d words for %d tiles", rows, first, n, len(bm), tiles)
			}
			for i := range n {
				got := bm[(bit+i)/64]>>((bit+i)%64)&1 == 1
				if exp := want[(first+i)/64]>>((first+i)%64)&1 == 1; got != exp {
					t.Fatalf("rows %d [%d,+%d) at %d: tuple %d deleted %v, want %v", rows, first, n, ts, first+i, got, exp)
				}
			}
		}
		if _, _, err := g.BitmapRange(1, rows-1, 2, nil); !errors.Is(err, ErrOffsetOutOfRange) {
			t.Fatalf("a range past the end: %v", err)
		}
	}
}

// deleteRandomly makes up to n deletes at random offsets, with timestamps
// in [1, maxTS], and returns them as an oracle.
func deleteRandomly(t *testing.T, g *RowGroup, rng *rand.Rand, n, maxTS int) oracle {
	t.Helper()
	o := oracle{}
	for range n {
		off := uint32(rng.IntN(g.Rows()))
		if _, done := o[off]; done {
			continue
		}
		ts := uint64(1 + rng.IntN(maxTS))
		if err := g.Delete(off, ts); err != nil {
			t.Fatal(err)
		}
		o[off] = ts
	}
	return o
}
