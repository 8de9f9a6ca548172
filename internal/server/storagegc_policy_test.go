package server

import (
	"slices"
	"strings"
	"testing"

	"github.com/retinadb/retina/internal/visibility"
)

func TestChooseRewrite(t *testing.T) {
	const capacity = 1000
	for _, c := range []struct {
		name  string
		files []fileStat
		want  []uint64
	}{
		{"nothing stale, files full", []fileStat{{1, 1000, 100}, {2, 1000, 0}}, nil},
		{"one stale file", []fileStat{{1, 1000, 100}, {2, 1000, 600}}, []uint64{2}},
		{"the stalest first, filled with what fits", []fileStat{{1, 1000, 500}, {2, 1000, 900}, {3, 1000, 700}},
			[]uint64{2, 3, 1}},
		{"what does not fit waits", []fileStat{{1, 1000, 500}, {2, 1000, 900}, {3, 1000, 200}, {4, 1000, 520}},
			[]uint64{2, 4}},
		{"a lone small file stays", []fileStat{{1, 300, 0}}, nil},
		{"small files combine", []fileStat{{1, 300, 0}, {2, 200, 50}, {3, 1000, 0}}, []uint64{2, 1}},
		{"small files up to capacity", []fileStat{{1, 400, 0}, {2, 400, 0}, {3, 400, 0}}, []uint64{1, 2}},
		{"all stale goes alone or with others", []fileStat{{1, 500, 500}}, []uint64{1}},
		{"an empty file is skipped", []fileStat{{1, 0, 0}, {2, 100, 0}}, nil},
	} {
		got := chooseRewrite(c.files, 0.5, capacity)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestSealEarly(t *testing.T) {
	const capacity = 1 << 20 // a sixteenth is 65536 rows, two blocks 16384
	for _, c := range []struct {
		name        string
		rows, stale int64
		want        bool
	}{
		{"small and half stale waits", 20_000, 10_000, false},
		{"small and mostly stale goes", 20_000, 16_000, true},
		{"tiny and all stale waits", 16_000, 16_000, false},
		{"a sixteenth half stale goes", 65_536, 32_768, true},
		{"a sixteenth mostly live waits", 65_536, 30_000, false},
		{"nothing", 0, 0, false},
	} {
		if got := sealEarly(c.rows, c.stale, capacity, 0.5); got != c.want {
			t.Errorf("%s: %d rows, %d stale: got %v", c.name, c.rows, c.stale, got)
		}
	}
}

// TestStaleCountAfterMemoryGCMovedOn: a GC round's bound read before memory
// GC collected the file past it (the low watermark moved on) counts at the
// collected point, not skipping the file; a collected point above what the
// low watermark allows now is reported as the broken invariant it is.
func TestStaleCountAfterMemoryGCMovedOn(t *testing.T) {
	vis, err := visibility.NewRowGroup(100)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		row uint32
		ts  uint64
	}{{1, 5}, {2, 7}, {3, 9}} {
		if err := vis.Delete(d.row, d.ts); err != nil {
			t.Fatal(err)
		}
	}
	bound := func(ts uint64) func() (uint64, error) { return func() (uint64, error) { return ts, nil } }
	c := &staleCounter{at: 6} // the round's bound
	if n, err := c.countAtBound(vis, 0, 100, bound(6)); err != nil || n != 1 {
		t.Fatalf("before memory GC: %d stale, %v; want 1", n, err)
	}
	vis.Collect(8) // the low watermark moved on to 8
	if n, err := c.countAtBound(vis, 0, 100, bound(8)); err != nil || n != 2 {
		t.Fatalf("memory GC at 8, the round's bound 6: %d stale, %v; want the 2 deleted at 8", n, err)
	}
	if _, err := c.countAtBound(vis, 0, 100, bound(7)); err == nil || !strings.Contains(err.Error(), "collected its visibility to 8, above 7") {
		t.Fatalf("memory GC at 8 with the low watermark allowing 7: %v, want the broken invariant named", err)
	}
}
