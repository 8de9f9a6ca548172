package streamorder

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestMerger runs the scripts in testdata. Commands:
//
//	add m=A s=B       → a commit at memory ts A and storage ts B (0: none)
//	    [rm=R] [rs=R] → that read the memory (storage) engine at R
//	advance m=A s=B   → the marks; prints what is released, in order
func TestMerger(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var m Merger
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var mem, disk uint64
			d.ScanArgs(t, "m", &mem)
			d.ScanArgs(t, "s", &disk)
			switch d.Cmd {
			case "add":
				var rm, rs uint64
				if d.HasArg("rm") {
					d.ScanArgs(t, "rm", &rm)
				}
				if d.HasArg("rs") {
					d.ScanArgs(t, "rs", &rs)
				}
				if err := m.Add(Commit{Mem: mem, Storage: disk, ReadMem: rm, ReadStorage: rs}); err != nil {
					return "error: " + err.Error() + "\n"
				}
				return fmt.Sprintf("pending %d\n", m.Pending())
			case "advance":
				m.Advance(mem, disk)
				out, err := m.Ready()
				var b strings.Builder
				for _, c := range out {
					fmt.Fprintf(&b, "%s ", c)
				}
				if len(out) == 0 {
					b.WriteString("(nothing)")
				}
				if err != nil {
					fmt.Fprintf(&b, "\nerror: %v", err)
				}
				return strings.TrimSpace(b.String()) + fmt.Sprintf("\npending %d\n", m.Pending())
			}
			d.Fatalf(t, "unknown command %s", d.Cmd)
			return ""
		})
	})
}

// TestModel checks random histories against what a global order must
// keep: every commit comes out exactly once, only once the marks pass it,
// each engine's commits in timestamp order, and no commit on either side of
// a cross-engine commit in the wrong place.
func TestModel(t *testing.T) {
	for seed := int64(1); seed <= 300; seed++ {
		if err := runModel(seed, 200); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

func runModel(seed int64, n int) error {
	rng := rand.New(rand.NewSource(seed))
	// A serial history: each engine's timestamps grow along it, with gaps
	// (aborted timestamps).
	var hist []Commit
	var mem, disk uint64
	for range n {
		var c Commit
		switch rng.Intn(3) {
		case 0:
			mem += 1 + uint64(rng.Intn(2))
			c.Mem = mem
		case 1:
			disk += 1 + uint64(rng.Intn(2))
			c.Storage = disk
		default:
			mem += 1 + uint64(rng.Intn(2))
			disk += 1 + uint64(rng.Intn(2))
			c.Mem, c.Storage = mem, disk
		}
		hist = append(hist, c)
	}
	// Commits are added in an order close to the history's, and a mark
	// moves only past timestamps whose commits were all added.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	for i := range n {
		j := min(n-1, i+rng.Intn(4))
		order[i], order[j] = order[j], order[i]
	}
	added := make([]bool, n)
	var m Merger
	var out []Commit
	markOf := func(ts func(Commit) uint64) uint64 {
		mark := uint64(0)
		for i, c := range hist {
			if ts(c) == 0 {
				continue
			}
			if !added[i] {
				return ts(c) - 1
			}
			mark = ts(c)
		}
		return mark + 1 // the trailing gap is passed too
	}
	var mm, dm uint64
	for _, i := range order {
		if err := m.Add(hist[i]); err != nil {
			return err
		}
		added[i] = true
		if rng.Intn(3) == 0 {
			mm = max(mm, min(markOf(func(c Commit) uint64 { return c.Mem }), uint64(rng.Intn(int(mem)+2))))
			dm = max(dm, min(markOf(func(c Commit) uint64 { return c.Storage }), uint64(rng.Intn(int(disk)+2))))
			m.Advance(mm, dm)
			r, err := m.Ready()
			if err != nil {
				return err
			}
			for _, c := range r {
				if c.Mem > mm || c.Storage > dm {
					return fmt.Errorf("%s released before the marks m%d/s%d passed it", c, mm, dm)
				}
			}
			out = append(out, r...)
		}
	}
	m.Advance(mem, disk)
	r, err := m.Ready()
	if err != nil {
		return err
	}
	out = append(out, r...)
	if len(out) != n || m.Pending() != 0 {
		return fmt.Errorf("released %d of %d, %d pending", len(out), n, m.Pending())
	}
	var lastM, lastS uint64
	for i, c := range out {
		if c.Mem != 0 {
			if c.Mem <= lastM {
				return fmt.Errorf("memory order broken at %s", c)
			}
			lastM = c.Mem
		}
		if c.Storage != 0 {
			if c.Storage <= lastS {
				return fmt.Errorf("storage order broken at %s", c)
			}
			lastS = c.Storage
		}
		if c.Mem == 0 || c.Storage == 0 {
			continue
		}
		for _, b := range out[:i] {
			if b.Mem > c.Mem || b.Storage > c.Storage {
				return fmt.Errorf("%s released before cross-engine %s", b, c)
			}
		}
	}
	return nil
}
