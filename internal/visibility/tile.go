package visibility

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"sync/atomic"
)

const (
	// TimestampBits is the width of a delete timestamp in a chain entry.
	TimestampBits = 52
	// MaxTimestamp is the largest timestamp the structure accepts.
	MaxTimestamp = 1<<TimestampBits - 1
	// MaxTileSize is the largest tile: its offsets must fit beside a timestamp.
	MaxTileSize = 1 << (64 - TimestampBits)
	// MinTileSize is the smallest tile: one bitmap word.
	MinTileSize = 64
	// DefaultTileSize is the tile size used when none is configured.
	DefaultTileSize = 4096

	tsMask         = uint64(MaxTimestamp)
	entriesPerBlok = 8
)

var (
	// ErrOffsetOutOfRange reports an offset at or beyond the tuple count.
	ErrOffsetOutOfRange = errors.New("visibility: offset out of range")
	// ErrInvalidTimestamp reports a timestamp of 0 or ≥ 2^52.
	ErrInvalidTimestamp = errors.New("visibility: invalid timestamp")
	// ErrAlreadyDeleted reports a second delete of the same tuple version.
	ErrAlreadyDeleted = errors.New("visibility: tuple already deleted")
	// ErrBelowBase reports a delete timestamp at or below a tile's base
	// timestamp: memory GC has passed it, so the MVCC rules were broken.
	ErrBelowBase = errors.New("visibility: delete timestamp at or below the collected watermark")
	// ErrSnapshotTooOld reports a snapshot below a tile's base timestamp: the
	// exact bitmap no longer exists in memory and the caller needs a checkpoint.
	ErrSnapshotTooOld = errors.New("visibility: snapshot older than the collected watermark")
	// ErrNotDeleted reports an undelete of a tuple not deleted at that timestamp.
	ErrNotDeleted = errors.New("visibility: tuple not deleted at that timestamp")
	// ErrBadTileSize reports a tile size that is not a power of two in
	// [MinTileSize, MaxTileSize].
	ErrBadTileSize = errors.New("visibility: tile size must be a power of two between 64 and 4096")
)

// block is one 64-byte unit of a delete-ts chain.
// Entries are accessed with sync/atomic functions once the block is
// published, and written plainly before that.
type block struct {
	entries [entriesPerBlok]uint64
	next    atomic.Pointer[block]
}

func (b *block) load(i int) uint64 { return atomic.LoadUint64(&b.entries[i]) }

// snapshot is the immutable part of a tile: the base set, its timestamp and
// the first chain block. Readers take one pointer and see a consistent state.
type snapshot struct {
	baseTS uint64
	head   *block
	dense  []uint64 // one bit per tuple, or nil when sparse is used
	sparse []uint16 // sorted deleted offsets when dense is nil
}

// dupFilter has one bit per tuple of every delete the tile accepted since the
// filter was built (and everything in the base when it was built). A filter
// with nil bits is a marker left by memory GC after it retired the previous
// filter; each marker is a fresh allocation so a compare-and-swap against it
// cannot succeed after a later retirement (no ABA).
type dupFilter struct {
	bits    []atomic.Uint64
	retired atomic.Bool
}

// tile holds the visibility of one tile. Its size is owned by the container.
type tile struct {
	snap   atomic.Pointer[snapshot]
	tail   atomic.Pointer[block]
	filter atomic.Pointer[dupFilter]
}

func validTileSize(size int) bool {
	return size >= MinTileSize && size <= MaxTileSize && size&(size-1) == 0
}

func entry(off uint32, ts uint64) uint64 { return uint64(off)<<TimestampBits | ts }

func entryOffset(e uint64) uint32 { return uint32(e >> TimestampBits) }

func entryTS(e uint64) uint64 { return e & tsMask }

func checkTimestamp(ts uint64) error {
	if ts == 0 || ts > MaxTimestamp {
		return fmt.Errorf("%w: %d (want 1 ≤ ts < 2^52)", ErrInvalidTimestamp, ts)
	}
	return nil
}

// delete records that the tuple at off (within the tile) was deleted at ts.
// off and ts are already validated by the caller.
func (t *tile) delete(off uint32, ts uint64, words int) error {
	if base := t.snap.Load().baseTS; ts <= base {
		return fmt.Errorf("%w: delete ts %d, base ts %d", ErrBelowBase, ts, base)
	}
	w, bit := off>>6, uint64(1)<<(off&63)
	for {
		f := t.filter.Load()
		if f == nil || f.bits == nil {
			nf := t.buildFilter(words)
			if !t.filter.CompareAndSwap(f, nf) {
				continue
			}
			f = nf
		}
		old := f.bits[w].Or(bit)
		if f.retired.Load() {
			// GC is retiring this filter. Undo our claim and look again: either
			// GC keeps the filter or a fresh one is built from the chain.
			if old&bit != 0 {
				return ErrAlreadyDeleted
			}
			f.bits[w].And(^bit)
			runtime.Gosched()
			continue
		}
		if old&bit != 0 {
			return ErrAlreadyDeleted
		}
		t.append(entry(off, ts))
		return nil
	}
}

// undelete removes the entry (off, ts) from the chain and its bit from the
// duplicate filter. The caller holds the row group's GC lock, so no collect
// copies the entry forward meanwhile; a bitmap reader never needs the entry,
// because its snapshot is below ts.
func (t *tile) undelete(off uint32, ts uint64) error {
	s := t.snap.Load()
	if ts <= s.baseTS {
		return fmt.Errorf("%w: undelete ts %d, base ts %d", ErrBelowBase, ts, s.baseTS)
	}
	e := entry(off, ts)
	for b := s.head; b != nil; b = b.next.Load() {
		for i := range b.entries {
			// A zeroed slot is skipped by readers and by collect; in the tail
			// block a later delete may reuse it.
			if b.load(i) == e && atomic.CompareAndSwapUint64(&b.entries[i], e, 0) {
				if f := t.filter.Load(); f != nil && f.bits != nil {
					f.bits[off>>6].And(^(uint64(1) << (off & 63)))
				}
				return nil
			}
		}
	}
	return fmt.Errorf("%w: offset %d, ts %d", ErrNotDeleted, off, ts)
}

// buildFilter makes a duplicate filter holding every delete the tile has.
func (t *tile) buildFilter(words int) *dupFilter {
	s := t.snap.Load()
	f := &dupFilter{bits: make([]atomic.Uint64, words)}
	if s.dense != nil {
		for i, w := range s.dense {
			f.bits[i].Store(w)
		}
	} else {
		for _, o := range s.sparse {
			f.bits[o>>6].Store(f.bits[o>>6].Load() | 1<<(o&63))
		}
	}
	for b := s.head; b != nil; b = b.next.Load() {
		for i := range b.entries {
			if e := b.load(i); e != 0 {
				o := entryOffset(e)
				f.bits[o>>6].Store(f.bits[o>>6].Load() | 1<<(o&63))
			}
		}
	}
	return f
}

// append adds an entry to the chain without locks: it claims the first free
// slot of the tail block with a CAS, or links a new block carrying the entry.
func (t *tile) append(e uint64) {
	for {
		b := t.tail.Load()
		if b == nil {
			if t.installFirstBlock(e) {
				return
			}
			continue
		}
		for i := range b.entries {
			if b.load(i) == 0 && atomic.CompareAndSwapUint64(&b.entries[i], 0, e) {
				return
			}
		}
		next := b.next.Load()
		if next == nil {
			nb := new(block)
			nb.entries[0] = e
			if b.next.CompareAndSwap(nil, nb) {
				t.tail.CompareAndSwap(b, nb)
				return
			}
			next = b.next.Load()
		}
		t.tail.CompareAndSwap(b, next) // help a slow writer move the tail on
	}
}

// installFirstBlock publishes the tile's first chain block through the
// snapshot, so readers can reach it before any writer returns.
func (t *tile) installFirstBlock(e uint64) bool {
	s := t.snap.Load()
	if s.head != nil {
		// Another writer published the first block but has not set the tail
		// yet; while the tail is unset the chain has exactly this one block.
		t.tail.CompareAndSwap(nil, s.head)
		return false
	}
	nb := new(block)
	nb.entries[0] = e
	ns := *s
	ns.head = nb
	if !t.snap.CompareAndSwap(s, &ns) {
		return false
	}
	t.tail.CompareAndSwap(nil, nb)
	return true
}

// bitmap writes the deleted set at snapshot ts into dst[:words].
func (t *tile) bitmap(ts uint64, dst []uint64) error {
	s := t.snap.Load()
	if ts < s.baseTS {
		return fmt.Errorf("%w: snapshot %d, base ts %d", ErrSnapshotTooOld, ts, s.baseTS)
	}
	if s.dense != nil {
		copy(dst, s.dense)
	} else {
		clear(dst)
		for _, o := range s.sparse {
			dst[o>>6] |= 1 << (o & 63)
		}
	}
	for b := s.head; b != nil; b = b.next.Load() {
		for i := range b.entries {
			e := b.load(i)
			if e != 0 && e&tsMask <= ts {
				o := entryOffset(e)
				dst[o>>6] |= 1 << (o & 63)
			}
		}
	}
	return nil
}

// collectStats counts what one Collect did.
type collectStats struct {
	folded   int // entries merged into a base
	freed    int // chain blocks unlinked
	retired  int // duplicate filters released
	swapped  int // snapshots replaced
	survived int // entries above the watermark that were kept
}

func (c *collectStats) add(o collectStats) {
	c.folded += o.folded
	c.freed += o.freed
	c.retired += o.retired
	c.swapped += o.swapped
	c.survived += o.survived
}

// collect folds every entry with ts ≤ lwm into a new base with base ts lwm.
// Calls for one tile must not run concurrently with each other; they run
// concurrently with delete and bitmap.
func (t *tile) collect(lwm uint64, words int, scratch []uint64) collectStats {
	var st collectStats
	s := t.snap.Load()
	if s.head == nil || lwm <= s.baseTS {
		return st
	}
	// Blocks before the tail are immutable: a block gets a successor only
	// after a writer saw all its slots taken. The tail block may still fill.
	var survivors []uint64
	fold := scratch[:words]
	s.baseInto(fold)
	frozen := 0
	b := s.head
	for {
		next := b.next.Load()
		for i := range b.entries {
			e := b.load(i)
			if e == 0 {
				continue
			}
			ets := entryTS(e)
			switch {
			case ets <= s.baseTS: // folded by an earlier collect
			case ets <= lwm:
				o := entryOffset(e)
				fold[o>>6] |= 1 << (o & 63)
				st.folded++
			case next != nil:
				survivors = append(survivors, e)
			}
		}
		if next == nil {
			break
		}
		frozen++
		b = next
	}
	last := b
	pendingInTail := false
	for i := range last.entries {
		if e := last.load(i); e != 0 && entryTS(e) > lwm {
			pendingInTail = true
		}
	}
	if st.folded > 0 || frozen > 0 {
		ns := &snapshot{baseTS: lwm, head: chainBefore(survivors, last)}
		ns.setBase(fold, words)
		t.snap.Store(ns)
		st.swapped = 1
		st.freed = frozen - (len(survivors)+entriesPerBlok-1)/entriesPerBlok
		st.survived = len(survivors)
		s = ns
	}
	if len(survivors) == 0 && !pendingInTail && t.retireFilter(s, fold) {
		st.retired = 1
	}
	return st
}

// retireFilter drops the tile's duplicate filter when every bit in it is
// accounted for by the base or the chain, i.e. no Delete is between claiming
// its bit and appending its entry. base is s's base as dense words.
func (t *tile) retireFilter(s *snapshot, base []uint64) bool {
	f := t.filter.Load()
	if f == nil || f.bits == nil {
		return false
	}
	f.retired.Store(true)
	// A writer that claimed its bit before the store above either has its
	// entry in the chain by now or shows up as a mismatch; one that claims
	// after it sees retired and backs off.
	want := base
	for b := s.head; b != nil; b = b.next.Load() {
		for i := range b.entries {
			if e := b.load(i); e != 0 {
				o := entryOffset(e)
				want[o>>6] |= 1 << (o & 63)
			}
		}
	}
	for i := range f.bits {
		if f.bits[i].Load() != want[i] {
			f.retired.Store(false)
			return false
		}
	}
	if !t.filter.CompareAndSwap(f, &dupFilter{}) {
		f.retired.Store(false)
		return false
	}
	return true
}

// chainBefore packs entries into fresh full blocks linked in front of tail.
func chainBefore(entries []uint64, tail *block) *block {
	head := tail
	for end := len(entries); end > 0; end -= entriesPerBlok {
		start := max(end-entriesPerBlok, 0)
		nb := new(block)
		copy(nb.entries[:], entries[start:end])
		nb.next.Store(head)
		head = nb
	}
	return head
}

// baseInto writes the base set as dense words.
func (s *snapshot) baseInto(dst []uint64) {
	if s.dense != nil {
		copy(dst, s.dense)
		return
	}
	clear(dst)
	for _, o := range s.sparse {
		dst[o>>6] |= 1 << (o & 63)
	}
}

// setBase stores words as the base, sparse when that takes under half the room.
func (s *snapshot) setBase(words []uint64, n int) {
	count := 0
	for _, w := range words[:n] {
		count += bits.OnesCount64(w)
	}
	if count <= n*64/32 {
		s.sparse = make([]uint16, 0, count)
		for i, w := range words[:n] {
			for w != 0 {
				s.sparse = append(s.sparse, uint16(i*64+bits.TrailingZeros64(w)))
				w &= w - 1
			}
		}
		return
	}
	s.dense = append([]uint64(nil), words[:n]...)
}

// memoryBytes is the heap the tile holds beyond the tile struct itself.
// A snapshot shared by several tiles is counted by the container instead.
func (t *tile) memoryBytes(shared *snapshot) int {
	s := t.snap.Load()
	n := 0
	if s != shared {
		n += snapshotSize + 8*cap(s.dense) + 2*cap(s.sparse)
	}
	for b := s.head; b != nil; b = b.next.Load() {
		n += blockSize
	}
	if f := t.filter.Load(); f != nil {
		n += filterSize + 8*cap(f.bits)
	}
	return n
}
