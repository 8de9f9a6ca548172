package visibility

import "fmt"

// Source is a row group whose kept tuples move into a new one (storage GC
// rewrites files with the versions they still need).
type Source struct {
	From *RowGroup
	// Kept are the offsets in From that move, ascending; they take the new
	// row group's offsets in order, after the previous sources' tuples.
	Kept []uint32
}

// Carry builds the visibility of a rewritten file: a row group of the kept
// tuples of every source, whose deleted set at every snapshot ≥ at equals
// what the sources say of those tuples. Deletes at or below at are folded
// into the new base; later ones keep their timestamps. The sources must
// not change meanwhile (the caller holds writes off). When memory GC has
// collected a source above at, the carry point moves up to there: memory GC
// only runs below every running query's snapshot, so none is below it.
func Carry(at uint64, sources []Source, opts ...Option) (*RowGroup, error) {
	rows := 0
	for _, s := range sources {
		rows += len(s.Kept)
		at = max(at, s.From.Collected())
	}
	base := make([]uint64, (rows+63)/64)
	type later struct {
		off uint32
		ts  uint64
	}
	var after []later
	next := 0
	for i, s := range sources {
		cp, err := s.From.Checkpoint(at)
		if err != nil {
			return nil, fmt.Errorf("visibility: carry source %d: %w", i, err)
		}
		newOff := make(map[uint32]uint32) // only for tuples deleted after at
		for k, off := range s.Kept {
			if int(off) >= s.From.rows || k > 0 && off <= s.Kept[k-1] {
				return nil, fmt.Errorf("%w: kept offset %d of source %d (rows %d, ascending)", ErrOffsetOutOfRange, off, i, s.From.rows)
			}
			o := next + k
			if cp.Bitmap[off/64]>>(off%64)&1 == 1 {
				base[o/64] |= 1 << (o % 64)
			} else {
				newOff[off] = uint32(o)
			}
		}
		s.From.deletesAbove(at, func(off uint32, ts uint64) {
			if o, ok := newOff[off]; ok {
				after = append(after, later{o, ts})
			}
		})
		next += len(s.Kept)
	}
	g, err := newRowGroup(rows, at, base, opts)
	if err != nil {
		return nil, err
	}
	for _, d := range after {
		if err := g.Delete(d.off, d.ts); err != nil {
			return nil, fmt.Errorf("visibility: carry a delete at %d: %w", d.ts, err)
		}
	}
	return g, nil
}

// Collected is the highest timestamp memory GC folded deletes up to: the
// oldest snapshot the row group still answers exactly.
func (g *RowGroup) Collected() uint64 {
	var ts uint64
	for i := range g.tiles {
		ts = max(ts, g.tiles[i].snap.Load().baseTS)
	}
	return ts
}

// deletesAbove reports every chain delete with a timestamp above at.
func (g *RowGroup) deletesAbove(at uint64, fn func(off uint32, ts uint64)) {
	for i := range g.tiles {
		s := g.tiles[i].snap.Load()
		for b := s.head; b != nil; b = b.next.Load() {
			for j := range b.entries {
				e := b.load(j)
				if e != 0 && e&tsMask > at {
					fn(uint32(i<<g.tileShift)+entryOffset(e), e&tsMask)
				}
			}
		}
	}
}
