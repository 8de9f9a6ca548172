package visibility

import (
	"fmt"
	"slices"
	"sync"
	"unsafe"
)

var (
	snapshotSize = int(unsafe.Sizeof(snapshot{}))
	blockSize    = int(unsafe.Sizeof(block{}))
	filterSize   = int(unsafe.Sizeof(dupFilter{}))
	tileSize     = int(unsafe.Sizeof(tile{}))
)

// RowGroup is the visibility of one row group: its tuples split into tiles.
// Delete, Bitmap and MemoryBytes may be called from any goroutine at any
// time; Collect calls are serialised internally and never block the others.
type RowGroup struct {
	rows      int
	words     int // ceil(rows/64)
	tileSize  int
	tileWords int
	tileShift uint
	tiles     []tile
	empty     *snapshot // initial snapshot shared by untouched tiles

	gcMu    sync.Mutex
	scratch []uint64 // per-tile work area for Collect, under gcMu
}

// Option configures a RowGroup.
type Option func(*options)

type options struct{ tileSize int }

// WithTileSize sets the tuples per tile: a power of two in [64, 4096].
func WithTileSize(n int) Option { return func(o *options) { o.tileSize = n } }

// NewRowGroup returns the visibility of a row group of rows tuples, none deleted.
func NewRowGroup(rows int, opts ...Option) (*RowGroup, error) {
	return newRowGroup(rows, 0, nil, opts)
}

func newRowGroup(rows int, baseTS uint64, base []uint64, opts []Option) (*RowGroup, error) {
	o := options{tileSize: DefaultTileSize}
	for _, opt := range opts {
		opt(&o)
	}
	if !validTileSize(o.tileSize) {
		return nil, fmt.Errorf("%w: got %d", ErrBadTileSize, o.tileSize)
	}
	if rows < 0 || uint64(rows) > 1<<32 {
		return nil, fmt.Errorf("visibility: row count %d out of range [0, 2^32]", rows)
	}
	g := &RowGroup{
		rows:      rows,
		words:     (rows + 63) / 64,
		tileSize:  o.tileSize,
		tileWords: o.tileSize / 64,
		tiles:     make([]tile, (rows+o.tileSize-1)/o.tileSize),
		empty:     &snapshot{baseTS: baseTS},
		scratch:   make([]uint64, o.tileSize/64),
	}
	for g.tileSize>>g.tileShift > 1 {
		g.tileShift++
	}
	for i := range g.tiles {
		s := g.empty
		if base != nil {
			lo, hi := g.tileWordRange(i)
			if anySet(base[lo:hi]) {
				s = &snapshot{baseTS: baseTS}
				s.setBase(base[lo:hi], hi-lo)
			}
		}
		g.tiles[i].snap.Store(s)
	}
	return g, nil
}

func anySet(words []uint64) bool {
	for _, w := range words {
		if w != 0 {
			return true
		}
	}
	return false
}

// Rows is the number of tuples the row group covers.
func (g *RowGroup) Rows() int { return g.rows }

// TileSize is the number of tuples per tile.
func (g *RowGroup) TileSize() int { return g.tileSize }

// BitmapWords is the length of the bitmap Bitmap writes: ceil(Rows/64).
func (g *RowGroup) BitmapWords() int { return g.words }

// tileWordRange is the range of bitmap words covered by tile i.
func (g *RowGroup) tileWordRange(i int) (lo, hi int) {
	lo = i * g.tileWords
	return lo, min(lo+g.tileWords, g.words)
}

// Delete records that the tuple at offset was deleted by the mirror
// transaction with timestamp ts. It fails for an offset out of range, a
// timestamp outside [1, 2^52), a tuple already deleted, and a timestamp at or
// below what memory GC has collected. Deletes of one tile may run
// concurrently and in any timestamp order.
func (g *RowGroup) Delete(offset uint32, ts uint64) error {
	if int64(offset) >= int64(g.rows) {
		return fmt.Errorf("%w: offset %d, rows %d", ErrOffsetOutOfRange, offset, g.rows)
	}
	if err := checkTimestamp(ts); err != nil {
		return err
	}
	i := offset >> g.tileShift
	lo, hi := g.tileWordRange(int(i))
	if err := g.tiles[i].delete(offset&uint32(g.tileSize-1), ts, hi-lo); err != nil {
		return fmt.Errorf("offset %d: %w", offset, err)
	}
	return nil
}

// Undelete takes back the delete of the tuple at offset made at ts: the undo
// of a mirror transaction rolled back before it committed. ts must be above
// every snapshot a running or future query holds until the undo is done (at
// or above HWM), so no reader ever saw the delete. Afterwards the tuple can
// be deleted again.
func (g *RowGroup) Undelete(offset uint32, ts uint64) error {
	if int64(offset) >= int64(g.rows) {
		return fmt.Errorf("%w: offset %d, rows %d", ErrOffsetOutOfRange, offset, g.rows)
	}
	if err := checkTimestamp(ts); err != nil {
		return err
	}
	g.gcMu.Lock()
	defer g.gcMu.Unlock()
	i := offset >> g.tileShift
	return g.tiles[i].undelete(offset&uint32(g.tileSize-1), ts)
}

// Bitmap writes the deleted set at snapshot ts into dst[:BitmapWords()]: bit
// i of word j is set iff offset 64j+i was deleted at a timestamp ≤ ts. It
// fails when ts is below the collected watermark of any tile (the exact
// answer is gone; use a checkpoint) and leaves dst undefined then.
func (g *RowGroup) Bitmap(ts uint64, dst []uint64) error {
	n := g.BitmapWords()
	if len(dst) < n {
		return fmt.Errorf("visibility: bitmap buffer has %d words, need %d", len(dst), n)
	}
	for i := range g.tiles {
		lo, hi := g.tileWordRange(i)
		if err := g.tiles[i].bitmap(ts, dst[lo:hi]); err != nil {
			return fmt.Errorf("tile %d: %w", i, err)
		}
	}
	return nil
}

// BitmapRange is Bitmap for the tuples [first, first+n) only: it writes the
// deleted set at ts of the tiles covering them into dst (grown as needed)
// and returns it with the bit at which tuple first sits. A scan of a few
// rows, or of one row group, builds the bitmap of what it reads, not of
// the whole file.
func (g *RowGroup) BitmapRange(ts uint64, first, n int, dst []uint64) ([]uint64, int, error) {
	if first < 0 || n < 0 || first+n > g.rows {
		return nil, 0, fmt.Errorf("%w: tuples [%d, %d) of %d", ErrOffsetOutOfRange, first, first+n, g.rows)
	}
	if n == 0 {
		return dst[:0], 0, nil
	}
	t0, t1 := first>>g.tileShift, (first+n-1)>>g.tileShift
	lo, _ := g.tileWordRange(t0)
	_, hi := g.tileWordRange(t1)
	dst = slices.Grow(dst[:0], hi-lo)[:hi-lo]
	for i := t0; i <= t1; i++ {
		l, h := g.tileWordRange(i)
		if err := g.tiles[i].bitmap(ts, dst[l-lo:h-lo]); err != nil {
			return nil, 0, fmt.Errorf("tile %d: %w", i, err)
		}
	}
	return dst, first - lo*64, nil
}

// CollectStats reports what one Collect did.
type CollectStats struct {
	Folded          int // delete entries merged into base sets
	FreedBlocks     int // delete-ts blocks unlinked
	RetiredFilters  int // duplicate filters released
	SwappedTiles    int // tiles given a new snapshot
	PendingSurvived int // entries above the watermark copied forward
}

// Collect is memory GC: for every tile it folds the deletes with timestamp
// ≤ lwm into a new base set with base timestamp lwm and swaps it in. lwm must
// be a low watermark: no query with a snapshot below it runs or will start.
// A tile already collected at or above lwm is left alone.
func (g *RowGroup) Collect(lwm uint64) CollectStats {
	g.gcMu.Lock()
	defer g.gcMu.Unlock()
	var st collectStats
	for i := range g.tiles {
		lo, hi := g.tileWordRange(i)
		st.add(g.tiles[i].collect(lwm, hi-lo, g.scratch))
	}
	return CollectStats{
		Folded:          st.folded,
		FreedBlocks:     st.freed,
		RetiredFilters:  st.retired,
		SwappedTiles:    st.swapped,
		PendingSurvived: st.survived,
	}
}

// MemoryBytes is the heap the row group's visibility occupies (struct sizes
// and backing arrays; allocator rounding not included).
func (g *RowGroup) MemoryBytes() int {
	n := int(unsafe.Sizeof(*g)) + 8*cap(g.scratch) + tileSize*len(g.tiles) + snapshotSize
	for i := range g.tiles {
		n += g.tiles[i].memoryBytes(g.empty)
	}
	return n
}
