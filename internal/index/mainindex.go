package index

import (
	"context"
	"errors"
	"fmt"
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
	loc := e.loc
	loc.Offset += uint32(id - e.r.First)
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

// DropRanges removes every range located in the given files (files deleted
// by storage GC) and returns how many ranges it removed.
func (s *Store) DropRanges(_ context.Context, fileIDs ...uint64) (int, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	return s.mi.dropFiles(fileIDs)
}
