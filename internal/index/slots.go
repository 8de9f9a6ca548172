package index

import (
	"hash/maphash"
	"iter"
	"math/bits"
)

// slotTable holds the slots of short entries: an open-addressing hash
// table with linear probing whose cells are one cache line each (the key
// and its slot, 64 bytes). A lookup of a random entry in a large index
// misses the cache; here it misses once, where Go's map first walks a
// directory, a table and a control group (four dependent misses, which
// made the map lookup most of an update's cost).
//
// A deleted cell becomes a tombstone and no cell ever moves except when
// the table is rebuilt on an insert, so a purge can range over the table
// while it updates and deletes entries.
type slotTable struct {
	cells []cell
	live  int // cells holding an entry
	tombs int // deleted cells, skipped by lookups, reused by inserts
	seed  maphash.Seed
	// hint is the cell getToUpdate found last: the set that follows it
	// (an update reads its entry, then writes it) does not probe again.
	hint int
}

// cell is one entry, laid out flat so that it fills one cache line: a
// shortKey and a slot as fields would take 72 bytes with their padding.
// n, the key's length (1..shortKeyLen), also says whether the cell is
// empty or deleted.
type cell struct {
	key        [shortKeyLen]byte
	last, prev version
	spill      bool
	n          uint8
}

// full reports a cell holding an entry (neither empty nor deleted).
func (c *cell) full() bool { return c.n != cellEmpty && c.n != cellTomb }

func (c *cell) holds(k *shortKey) bool { return c.n == k.n && c.key == k.b }

func (c *cell) val() slot { return slot{last: c.last, prev: c.prev, spill: c.spill} }

func (c *cell) shortKey() shortKey { return shortKey{b: c.key, n: c.n} }

func newCell(k *shortKey, s slot) cell {
	return cell{key: k.b, n: k.n, last: s.last, prev: s.prev, spill: s.spill}
}

func (c *cell) setVal(s slot) { c.last, c.prev, c.spill = s.last, s.prev, s.spill }

const (
	cellEmpty = 0
	cellTomb  = 0xFF
	minCells  = 16
)

func newSlotTable() slotTable { return slotTable{seed: maphash.MakeSeed()} }

func (t *slotTable) len() int { return t.live }

func (t *slotTable) start(k *shortKey) int {
	return int(maphash.Bytes(t.seed, k.b[:k.n]) & uint64(len(t.cells)-1))
}

// find is the cell holding k, or -1.
func (t *slotTable) find(k *shortKey) int {
	if t.live == 0 {
		return -1
	}
	mask := len(t.cells) - 1
	for i := t.start(k); ; i = (i + 1) & mask {
		c := &t.cells[i]
		switch c.n {
		case cellEmpty:
			return -1
		case cellTomb:
			continue
		}
		if c.holds(k) {
			return i
		}
	}
}

func (t *slotTable) get(k *shortKey) (slot, bool) {
	if i := t.find(k); i >= 0 {
		return t.cells[i].val(), true
	}
	return slot{}, false
}

// getToUpdate is get for a caller about to set k (it writes the hint, so
// it needs the shard's write lock).
func (t *slotTable) getToUpdate(k *shortKey) (slot, bool) {
	if i := t.find(k); i >= 0 {
		t.hint = i
		return t.cells[i].val(), true
	}
	return slot{}, false
}

// set stores k's slot. Replacing an entry's slot never moves a cell.
// k's length is 1..shortKeyLen (toShortKey makes no other).
func (t *slotTable) set(k *shortKey, s slot) {
	// The hinted cell is k's if it holds k: keys are unique, and empty
	// and deleted cells hold no key.
	if h := t.hint; h < len(t.cells) && t.cells[h].holds(k) {
		t.cells[h].setVal(s)
		return
	}
	if len(t.cells) > 0 {
		mask := len(t.cells) - 1
		free := -1
		for i := t.start(k); ; i = (i + 1) & mask {
			c := &t.cells[i]
			switch c.n {
			case cellEmpty:
				if free < 0 {
					free = i
				}
			case cellTomb:
				if free < 0 {
					free = i
				}
				continue
			default:
				if !c.holds(k) {
					continue
				}
				c.setVal(s)
				return
			}
			break
		}
		if t.cells[free].n == cellTomb {
			t.tombs--
			t.cells[free] = newCell(k, s)
			t.live++
			return
		}
		if (t.live+t.tombs+1)*4 <= len(t.cells)*3 {
			t.cells[free] = newCell(k, s)
			t.live++
			return
		}
	}
	// Full: live and deleted cells at 3/4, where a lookup of an absent
	// key (every insert's check) scans about eight cells. Twice the size
	// once live cells alone pass half, else the same size without the
	// tombstones.
	n := max(len(t.cells), minCells)
	if (t.live+1)*2 > n {
		n *= 2
	}
	t.rebuild(n)
	t.put(k, s)
}

// put inserts k, known absent, into a table without tombstones and with
// room.
func (t *slotTable) put(k *shortKey, s slot) {
	mask := len(t.cells) - 1
	i := t.start(k)
	for t.cells[i].n != cellEmpty {
		i = (i + 1) & mask
	}
	t.cells[i] = newCell(k, s)
	t.live++
}

// rebuild moves every entry into n cells (a power of two).
func (t *slotTable) rebuild(n int) {
	old := t.cells
	t.cells = make([]cell, n)
	adviseHugePages(t.cells)
	t.live, t.tombs = 0, 0
	for i := range old {
		if old[i].full() {
			k := old[i].shortKey()
			t.put(&k, old[i].val())
		}
	}
}

// remove deletes k, if there.
func (t *slotTable) remove(k *shortKey) {
	i := t.find(k)
	if i < 0 {
		return
	}
	t.cells[i] = cell{n: cellTomb}
	t.live--
	t.tombs++
	if t.live == 0 { // nothing to skip: every cell is free again
		clear(t.cells)
		t.tombs = 0
	}
}

// compact rebuilds a table a purge left mostly empty or deleted, so memory
// follows the live entries rather than the most ever held. Not while
// ranging over it.
func (t *slotTable) compact() {
	n := len(t.cells)
	if n <= minCells || (t.live*8 >= n && t.tombs*4 <= n) {
		return
	}
	if t.live == 0 {
		t.cells, t.tombs = nil, 0
		return
	}
	// Room for twice the live entries: the next inserts do not rebuild.
	t.rebuild(min(n, max(minCells, 1<<bits.Len(uint(t.live*2)))))
}

// all ranges over the entries. The body may replace the slot of the entry
// it is given or remove it, not insert.
func (t *slotTable) all() iter.Seq2[*shortKey, slot] {
	return func(yield func(*shortKey, slot) bool) {
		for i := range t.cells {
			c := &t.cells[i]
			if !c.full() {
				continue
			}
			k := c.shortKey()
			if !yield(&k, c.val()) {
				return
			}
		}
	}
}
