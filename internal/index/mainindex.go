package index

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/google/btree"
)

// ErrOverlap reports a row-id range that is already (or not entirely) mapped.
var ErrOverlap = errors.New("index: row-id range overlaps the main index")

// RowRange is the row ids [First, First+N).
type RowRange struct {
	First uint64
	N     uint32
}

func (r RowRange) end() uint64 { return r.First + uint64(r.N) }

// Location is where a row lives: row Offset of row group RowGroup of file
// FileID. A range's row First+i lives at Offset+i.
type Location struct {
	FileID   uint64
	RowGroup uint32
	Offset   uint32
}

type miEntry struct {
	r   RowRange
	loc Location
	// rows, when set, lists the row ids (minus r.First, ascending) that
	// still exist: storage GC rewrote the file without the others, and the
	// i-th of them lives at loc.Offset+i. Nil means every row of r, in
	// order.
	rows []uint32
}

// at is where row id lives, if the entry holds it.
func (e miEntry) at(id uint64) (Location, bool) {
	loc := e.loc
	k := uint32(id - e.r.First)
	if e.rows == nil {
		loc.Offset += k
		return loc, true
	}
	i, ok := slices.BinarySearch(e.rows, k)
	if !ok {
		return Location{}, false
	}
	loc.Offset += uint32(i)
	return loc, true
}

func lessEntry(a, b miEntry) bool { return a.r.First < b.r.First }

// miStore persists main-index changes (nil for the memory backend).
type miStore interface {
	saveMI(put []miEntry, del []uint64) error
	loadMI(fn func(miEntry)) error
}

// mainIndex maps row-id ranges to location ranges. Rows written together get
// consecutive ids and consecutive offsets, so a range is one entry.
type mainIndex struct {
	mu    sync.RWMutex
	tree  *btree.BTreeG[miEntry]
	store miStore
}

func newMainIndex(store miStore) *mainIndex {
	return &mainIndex{tree: btree.NewG(32, lessEntry), store: store}
}

func loadMainIndex(store miStore) (*mainIndex, error) {
	m := newMainIndex(store)
	err := store.loadMI(func(e miEntry) { m.tree.ReplaceOrInsert(e) })
	if err != nil {
		return nil, fmt.Errorf("index: load main index: %w", err)
	}
	return m, nil
}

// covering returns the entry whose range contains id.
func (m *mainIndex) covering(id uint64) (miEntry, bool) {
	var found miEntry
	ok := false
	m.tree.DescendLessOrEqual(miEntry{r: RowRange{First: id}}, func(e miEntry) bool {
		found, ok = e, id < e.r.end()
		return false
	})
	return found, ok
}

// overlapping lists the entries intersecting r, in order.
func (m *mainIndex) overlapping(r RowRange) []miEntry {
	var out []miEntry
	if e, ok := m.covering(r.First); ok {
		out = append(out, e)
	}
	m.tree.AscendRange(miEntry{r: RowRange{First: r.First + 1}}, miEntry{r: RowRange{First: r.end()}}, func(e miEntry) bool {
		out = append(out, e)
		return true
	})
	return out
}

func (m *mainIndex) save(put []miEntry, del []uint64) error {
	if m.store == nil {
		return nil
	}
	return m.store.saveMI(put, del)
}

func (m *mainIndex) register(r RowRange, loc Location) error {
	if r.N == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ov := m.overlapping(r); len(ov) == 1 && ov[0].r == r && ov[0].loc == loc {
		return nil // already registered (a restart re-registers files)
	} else if len(ov) > 0 {
		return fmt.Errorf("%w: [%d, %d) meets [%d, %d)", ErrOverlap, r.First, r.end(), ov[0].r.First, ov[0].r.end())
	}
	e := miEntry{r: r, loc: loc}
	if err := m.save([]miEntry{e}, nil); err != nil {
		return err
	}
	m.tree.ReplaceOrInsert(e)
	return nil
}

func (m *mainIndex) locate(id uint64) (Location, error) {
	m.mu.RLock()
	e, ok := m.covering(id)
	m.mu.RUnlock()
	if !ok {
		return Location{}, fmt.Errorf("%w: row id %d has no location", ErrNotFound, id)
	}
	loc, ok := e.at(id)
	if !ok {
		return Location{}, fmt.Errorf("%w: row id %d was dropped by storage GC", ErrNotFound, id)
	}
	return loc, nil
}

// remap moves every row of r to loc (storage GC rewrote them); all of r must
// be mapped now. Entries partly inside r are split.
func (m *mainIndex) remap(r RowRange, loc Location) error {
	if r.N == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ov := m.overlapping(r)
	covered := uint64(0)
	for _, e := range ov {
		covered += min(e.r.end(), r.end()) - max(e.r.First, r.First)
	}
	if covered != uint64(r.N) {
		return fmt.Errorf("%w: remap of [%d, %d): only %d of %d rows are mapped", ErrOverlap, r.First, r.end(), covered, r.N)
	}
	var put []miEntry
	var del []uint64
	for _, e := range ov {
		if e.rows != nil {
			return fmt.Errorf("%w: remap of [%d, %d) meets rows storage GC moved", ErrOverlap, r.First, r.end())
		}
		del = append(del, e.r.First)
		if e.r.First < r.First { // the part before r stays
			put = append(put, miEntry{r: RowRange{First: e.r.First, N: uint32(r.First - e.r.First)}, loc: e.loc})
		}
		if e.r.end() > r.end() { // the part after r stays
			tail := e.loc
			tail.Offset += uint32(r.end() - e.r.First)
			put = append(put, miEntry{r: RowRange{First: r.end(), N: uint32(e.r.end() - r.end())}, loc: tail})
		}
	}
	put = append(put, miEntry{r: r, loc: loc})
	return m.replace(put, del)
}

// remapFile moves the rows located in file from to file to, after storage
// GC rewrote it: kept lists, ascending, the offsets in from that moved; the
// i-th of them is offset base+i of to. Rows at other offsets are gone.
func (m *mainIndex) remapFile(from, to uint64, base uint32, kept []uint32) error {
	if !slices.IsSorted(kept) {
		return fmt.Errorf("index: remap of file %d: kept offsets out of order", from)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var old []miEntry
	m.tree.Ascend(func(e miEntry) bool {
		if e.loc.FileID == from {
			old = append(old, e)
		}
		return true
	})
	var put []miEntry
	var del []uint64
	for _, e := range old {
		// The entry's rows sit at increasing offsets of from; the kept ones
		// take consecutive offsets of to, from the rank of the first.
		var rows []uint32
		first := -1
		n := int(e.r.N)
		if e.rows != nil {
			n = len(e.rows)
		}
		i, _ := slices.BinarySearch(kept, e.loc.Offset)
		for j := 0; j < n && i < len(kept); j++ {
			off := e.loc.Offset + uint32(j)
			for i < len(kept) && kept[i] < off {
				i++
			}
			if i < len(kept) && kept[i] == off {
				if first < 0 {
					first = i
				}
				k := uint32(j)
				if e.rows != nil {
					k = e.rows[j]
				}
				rows = append(rows, k)
			}
		}
		if len(rows) == 0 {
			del = append(del, e.r.First)
			continue
		}
		ne := miEntry{r: e.r, loc: Location{FileID: to, Offset: base + uint32(first)}, rows: rows}
		if len(rows) == int(e.r.N) {
			ne.rows = nil // every row moved, in order
		}
		put = append(put, ne)
	}
	return m.replace(put, del)
}

// replace stores, then applies, the removal of the entries starting at del
// and the entries put. Called with mu held.
func (m *mainIndex) replace(put []miEntry, del []uint64) error {
	if err := m.save(put, del); err != nil {
		return err
	}
	for _, first := range del {
		m.tree.Delete(miEntry{r: RowRange{First: first}})
	}
	for _, e := range put {
		m.tree.ReplaceOrInsert(e)
	}
	return nil
}

func (m *mainIndex) dropFiles(ids []uint64) (int, error) {
	drop := map[uint64]bool{}
	for _, id := range ids {
		drop[id] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var del []uint64
	m.tree.Ascend(func(e miEntry) bool {
		if drop[e.loc.FileID] {
			del = append(del, e.r.First)
		}
		return true
	})
	if err := m.save(nil, del); err != nil {
		return 0, err
	}
	for _, first := range del {
		m.tree.Delete(miEntry{r: RowRange{First: first}})
	}
	return len(del), nil
}

// Register maps the row ids of r to consecutive offsets from loc. The ids
// must not be mapped yet, except to exactly this location (then it is a
// no-op).
func (s *Store) Register(_ context.Context, r RowRange, loc Location) error {
	if err := s.usable(); err != nil {
		return err
	}
	return s.mi.register(r, loc)
}

// Locate returns where row id lives, or an error wrapping ErrNotFound.
func (s *Store) Locate(_ context.Context, rowID uint64) (Location, error) {
	if err := s.usable(); err != nil {
		return Location{}, err
	}
	return s.mi.locate(rowID)
}

// Remap points the rows of r at consecutive offsets from loc, after storage
// GC rewrote them into another file.
func (s *Store) Remap(_ context.Context, r RowRange, loc Location) error {
	if err := s.usable(); err != nil {
		return err
	}
	return s.mi.remap(r, loc)
}

// RemapFile points the rows of file from that storage GC kept at their
// offsets in file to: kept lists their offsets in from, ascending, and the
// i-th of them is offset base+i of to (several files may be rewritten into
// one). The other rows of from are gone; looking them up fails with
// ErrNotFound.
func (s *Store) RemapFile(_ context.Context, from, to uint64, base uint32, kept []uint32) error {
	if err := s.usable(); err != nil {
		return err
	}
	return s.mi.remapFile(from, to, base, kept)
}

// DropRanges removes every range located in the given files (files deleted
// by storage GC) and returns how many ranges it removed.
func (s *Store) DropRanges(_ context.Context, fileIDs ...uint64) (int, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	return s.mi.dropFiles(fileIDs)
}
