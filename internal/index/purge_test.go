package index

import (
	"context"
	"runtime"
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
