package index

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"testing"
)

// TestMemoryPurgeReturnsMemory: after a purge, an index whose keys were
// updated many times holds about what an index written once with the same
// live versions holds. Go maps keep their tables after deletes, so without
// rebuilding them the spill maps would hold their peak for good.
func TestMemoryPurgeReturnsMemory(t *testing.T) {
	const keys, updates = 50_000, 4
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	write := func(s *Store, versions int) {
		b := &Batch{}
		for v := range versions {
			for i := range keys {
				k, err := s.Key(pkIndex, int64(i), "k")
				if err != nil {
					t.Fatal(err)
				}
				b.Put(k, uint64(v+1), uint64(v*keys+i))
				if b.Len() == 512 {
					if err := s.Apply(ctx, b); err != nil {
						t.Fatal(err)
					}
					b.Reset()
				}
			}
		}
		if err := s.Apply(ctx, b); err != nil {
			t.Fatal(err)
		}
	}

	base := heap()
	once := openStore(t, "memory", "")
	defer once.Close()
	write(once, 1)
	onceBytes := heap() - base

	base = heap()
	churned := openStore(t, "memory", "")
	defer churned.Close()
	write(churned, updates)
	peakBytes := heap() - base
	n, err := churned.Purge(ctx, updates)
	if err != nil {
		t.Fatal(err)
	}
	if n != keys*(updates-1) {
		t.Fatalf("purge removed %d versions, want %d", n, keys*(updates-1))
	}
	purgedBytes := heap() - base
	t.Logf("written once: %d KiB; %d versions a key: %d KiB, after the purge %d KiB", onceBytes>>10, updates, peakBytes>>10, purgedBytes>>10)
	if float64(purgedBytes) > 1.25*float64(onceBytes) {
		t.Fatalf("after the purge the index holds %d KiB, the same live versions written once %d KiB: the maps kept their peak", purgedBytes>>10, onceBytes>>10)
	}
	for i := range 100 {
		k, _ := churned.Key(pkIndex, int64(i), "k")
		row, ok, err := churned.Lookup(ctx, k, updates)
		if err != nil || !ok || row != uint64((updates-1)*keys+i) {
			t.Fatalf("key %d after the purge: row %d found %v err %v", i, row, ok, err)
		}
	}
}

// TestPurgeLeavesOneVersionAKey: versions counts what the index holds; a
// purge at the newest timestamp leaves one version of each live key and
// none of a deleted one.
func TestPurgeLeavesOneVersionAKey(t *testing.T) {
	backends(t, func(t *testing.T, open func() *Store) {
		ctx := context.Background()
		s := open()
		for ts := uint64(1); ts <= 5; ts++ {
			for i := range 100 {
				k, _ := s.Key(pkIndex, int64(i), "v")
				if err := s.Put(ctx, k, ts, uint64(ts*1000)+uint64(i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i := range 10 {
			k, _ := s.Key(pkIndex, int64(i), "v")
			if err := s.Tombstone(ctx, k, 6, 5000+uint64(i)); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := s.Versions(); err != nil || n != 510 {
			t.Fatalf("before the purge: %d versions, %v; want 510", n, err)
		}
		if _, err := s.Purge(ctx, 6); err != nil {
			t.Fatal(err)
		}
		if n, err := s.Versions(); err != nil || n != 90 {
			t.Fatalf("after the purge: %d versions, %v; want 90", n, err)
		}
	})
}

// TestRemapFileComposes: storage GC rewrites a file twice, keeping fewer
// rows each time; every row id still finds its row, a dropped one is not
// found, and a Pebble index reopened says the same.
func TestRemapFileComposes(t *testing.T) {
	const from, mid, to = 7, 9, 11
	const rows = 1000
	for _, backend := range []string{"memory", "pebble"} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			s := openStore(t, backend, dir)
			// Two ranges in the file, as a write buffer registers them.
			if err := s.Register(ctx, RowRange{First: from << 32, N: 600}, Location{FileID: from}); err != nil {
				t.Fatal(err)
			}
			if err := s.Register(ctx, RowRange{First: from<<32 + 600, N: 400}, Location{FileID: from, Offset: 600}); err != nil {
				t.Fatal(err)
			}
			where := map[uint64]Location{} // the oracle: row id → location
			for o := range uint64(rows) {
				where[from<<32|o] = Location{FileID: from, Offset: uint32(o)}
			}
			rewrite := func(file, into uint64, keep func(off uint32) bool) {
				var kept []uint32
				byOff := map[uint32]uint64{}
				for id, loc := range where {
					if loc.FileID == file {
						byOff[loc.Offset] = id
					}
				}
				for off := range uint32(rows) {
					if _, ok := byOff[off]; ok && keep(off) {
						kept = append(kept, off)
					}
				}
				for off, id := range byOff {
					delete(where, id)
					if i, ok := slices.BinarySearch(kept, off); ok {
						where[id] = Location{FileID: into, Offset: uint32(i)}
					}
				}
				if err := s.RemapFile(ctx, file, into, 0, kept); err != nil {
					t.Fatal(err)
				}
			}
			check := func(when string) {
				for o := range uint64(rows) {
					id := from<<32 | o
					got, err := s.Locate(ctx, id)
					want, ok := where[id]
					if ok && (err != nil || got != want) {
						t.Fatalf("%s: row %d at %+v, %v; want %+v", when, o, got, err, want)
					}
					if !ok && !errors.Is(err, ErrNotFound) {
						t.Fatalf("%s: dropped row %d located at %+v, %v", when, o, got, err)
					}
				}
			}
			rewrite(from, mid, func(off uint32) bool { return off%3 != 0 || off > 900 })
			check("after one rewrite")
			rewrite(mid, to, func(off uint32) bool { return off%5 != 1 })
			check("after two")
			if backend == "pebble" {
				s.Close()
				s = openStore(t, backend, dir)
				check("after a reopen")
			}
			s.Close()
		})
	}
}

// TestHorizonDropsSupersededVersions: with the horizon following the
// writes, an entry updated again and again keeps the versions a purge at
// the horizon would keep, and every snapshot at or above the horizon reads
// what it read with all versions kept. Without a horizon every version
// stays until a purge.
func TestHorizonDropsSupersededVersions(t *testing.T) {
	ctx := context.Background()
	const updates = 100
	for _, withHorizon := range []bool{false, true} {
		s := openStore(t, "memory", "")
		k, err := s.Key(pkIndex, int64(7), "k")
		if err != nil {
			t.Fatal(err)
		}
		for ts := uint64(1); ts <= updates; ts++ {
			if withHorizon && ts > 2 {
				s.SetHorizon(ts - 2) // snapshots ts-2 and ts-1 still read
			}
			if _, err := s.Mutate(ctx, []Mutation{{Key: k, TS: ts, Kind: Replace, RowID: ts * 10}}); err != nil && ts > 1 {
				t.Fatal(err)
			}
			if ts == 1 {
				if err := s.Put(ctx, k, 1, 10); err != nil {
					t.Fatal(err)
				}
			}
		}
		n, err := s.Versions()
		if err != nil {
			t.Fatal(err)
		}
		want := int64(updates)
		if withHorizon {
			want = 3 // the newest ≤ the horizon (98), 99 and 100
		}
		if n != want {
			t.Errorf("horizon %v: %d versions, want %d", withHorizon, n, want)
		}
		for ts := uint64(updates - 2); ts <= updates+1; ts++ {
			id, ok, err := s.Lookup(ctx, k, ts)
			if wantID := min(ts, updates) * 10; err != nil || !ok || id != wantID {
				t.Errorf("horizon %v: lookup at %d = %d %v %v, want %d", withHorizon, ts, id, ok, err, wantID)
			}
		}
		s.Close()
	}
}
