package iceberg

import (
	"context"
	"fmt"
	"sync"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/writebuffer"
)

// Buffers finds the write buffer a replayer keeps for a table.
type Buffers func(replayer uint32, table uint32) (*writebuffer.Buffer, error)

// rowReader reads runs of a virtual file's rows wherever they are: in the
// write buffer's memory, in its flushed block objects, or in the regular
// object the file was combined into since the publication's timestamp.
type rowReader struct {
	lake    *lake.Store
	buffers Buffers
	mem     memory.Allocator
	blocks  blockCache
}

// blockCache keeps the blocks the publisher read last: a piece's rows are
// read again when it is merged, a few publications later, by when their
// block has been flushed, and decoding it again was a sixth of the
// publisher's work.
type blockCache struct {
	mu     sync.Mutex
	recs   map[string][]arrow.RecordBatch
	order  []string // oldest first
	bytes  int64
	budget int64
}

// blockCacheBytes bounds the decoded blocks kept.
const blockCacheBytes = 64 << 20

// get returns a block's records retained (the caller releases them).
func (c *blockCache) get(key string) ([]arrow.RecordBatch, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	recs, ok := c.recs[key]
	if ok {
		for _, r := range recs {
			r.Retain()
		}
	}
	return recs, ok
}

// put keeps a block's records (retaining them), dropping the oldest
// blocks beyond the budget.
func (c *blockCache) put(key string, recs []arrow.RecordBatch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.recs == nil {
		c.recs, c.budget = map[string][]arrow.RecordBatch{}, blockCacheBytes
	}
	if _, ok := c.recs[key]; ok {
		return
	}
	for _, r := range recs {
		r.Retain()
		c.bytes += recordBytes(r)
	}
	c.recs[key] = recs
	c.order = append(c.order, key)
	for c.bytes > c.budget && len(c.order) > 1 {
		old := c.order[0]
		c.order = c.order[1:]
		for _, r := range c.recs[old] {
			c.bytes -= recordBytes(r)
			r.Release()
		}
		delete(c.recs, old)
	}
}

// clear releases every block.
func (c *blockCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, recs := range c.recs {
		for _, r := range recs {
			r.Release()
		}
	}
	c.recs, c.order, c.bytes = nil, nil, 0
}

func recordBytes(r arrow.RecordBatch) int64 {
	var n int64
	for _, col := range r.Columns() {
		for _, b := range col.Data().Buffers() {
			if b != nil {
				n += int64(b.Len())
			}
		}
	}
	return n
}

// read calls emit with the rows [lo, hi) of file f of table t in the
// table's file schema (its columns at the publication, create_ts last),
// each record with the offset of its first row. emit must not keep rec.
func (r *rowReader) read(ctx context.Context, t *catalog.Table, f FileState, lo, hi int64, emit func(off int64, rec arrow.RecordBatch) error) error {
	schema := lake.FileSchema(writebuffer.Schema(writebuffer.TableColumns(t.Schema)))
	buf, err := r.buffers(f.Replayer, t.ID)
	if err != nil {
		return fmt.Errorf("iceberg: table %s file %d: %w", t.Name, f.ID, err)
	}
	view := buf.View(f.ID)
	defer view.Release()
	fv := view.Files[0]
	if fv.Regular {
		return r.readRegular(ctx, t, fv.Key, schema, lo, hi, emit)
	}
	for _, b := range fv.Blocks {
		first, last := int64(b.First), int64(b.First)+int64(b.Rows)
		if last <= lo || first >= hi {
			continue
		}
		// A block is known by its file, first row and rows: a block read
		// in memory, as checkpoints seal it, is found again once flushed.
		key := fmt.Sprintf("%d@%d+%d", f.ID, b.First, b.Rows)
		recs, owned := b.Records, false
		if cached, ok := r.blocks.get(key); ok {
			recs, owned = cached, true
		} else if recs != nil {
			r.blocks.put(key, recs)
		} else {
			data, err := r.lake.Get(ctx, b.Key)
			if err != nil {
				return fmt.Errorf("iceberg: table %s file %d: %w", t.Name, f.ID, err)
			}
			if recs, err = lake.ReadBlock(ctx, data, r.mem); err != nil {
				return fmt.Errorf("iceberg: table %s file %d: block %s: %w", t.Name, f.ID, b.Key, err)
			}
			r.blocks.put(key, recs)
			owned = true
		}
		err := emitRange(recs, first, lo, hi, schema, r.mem, emit)
		if owned {
			for _, rec := range recs {
				rec.Release()
			}
		}
		if err != nil {
			return fmt.Errorf("iceberg: table %s file %d: %w", t.Name, f.ID, err)
		}
	}
	return nil
}

// readRegular reads rows [lo, hi) of a regular object.
func (r *rowReader) readRegular(ctx context.Context, t *catalog.Table, key string, schema *arrow.Schema, lo, hi int64, emit func(off int64, rec arrow.RecordBatch) error) error {
	obj, err := r.lake.ReaderAt(ctx, key)
	if err != nil {
		return fmt.Errorf("iceberg: table %s: %w", t.Name, err)
	}
	pf, err := lake.OpenFile(obj, r.mem)
	if err != nil {
		return fmt.Errorf("iceberg: table %s: %s: %w", t.Name, key, err)
	}
	defer pf.Close()
	if pf.Schema().NumFields() != len(t.Schema.Columns) {
		if err := pf.Widen(writebuffer.Schema(writebuffer.TableColumns(t.Schema))); err != nil {
			return fmt.Errorf("iceberg: table %s: %s: %w", t.Name, key, err)
		}
	}
	cols := make([]int, len(t.Schema.Columns))
	for i := range cols {
		cols[i] = i
	}
	first := int64(0)
	for g, meta := range pf.RowGroups() {
		last := first + meta.Rows
		if last > lo && first < hi {
			rec, err := pf.ReadRowGroup(ctx, g, cols, true)
			if err != nil {
				return fmt.Errorf("iceberg: table %s: %s: %w", t.Name, key, err)
			}
			err = emitRange([]arrow.RecordBatch{rec}, first, lo, hi, schema, r.mem, emit)
			rec.Release()
			if err != nil {
				return fmt.Errorf("iceberg: table %s: %s: %w", t.Name, key, err)
			}
		}
		first = last
	}
	return nil
}

// emitRange emits the rows [lo, hi) of records that hold consecutive
// offsets from first, widened to schema.
func emitRange(recs []arrow.RecordBatch, first, lo, hi int64, schema *arrow.Schema, mem memory.Allocator, emit func(off int64, rec arrow.RecordBatch) error) error {
	off := first
	for _, rec := range recs {
		n := rec.NumRows()
		a, b := max(lo, off), min(hi, off+n)
		if a < b {
			wide, err := lake.WidenBlock(rec, schema, mem)
			if err != nil {
				return err
			}
			part := wide.NewSlice(a-off, b-off)
			wide.Release()
			err = emit(a, part)
			part.Release()
			if err != nil {
				return err
			}
		}
		off += n
	}
	return nil
}
