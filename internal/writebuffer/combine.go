package writebuffer

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/apache/arrow-go/v18/arrow"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/lake"
)

// Combination: once a sealed file's blocks are all durable, one job reads
// them back and writes the file's regular Parquet object under the same
// file id, then marks the file regular in the catalog. The block objects
// are deleted once no view holds the file. A combination the lake or the
// catalog failed is tried again after the lake's backoff.

// maybeCombine starts combination of a sealed file whose blocks are all
// durable. Called with mu held.
func (b *Buffer) maybeCombine(f *VirtualFile) {
	if !f.sealed || f.combining || f.combined || f == b.cur && b.build.rows > 0 {
		return
	}
	for _, blk := range f.blocks {
		if blk.key == "" {
			return
		}
	}
	f.combining = true
	keys := make([]string, len(f.blocks))
	var cached [][]arrow.RecordBatch // blocks still decoded in the cache
	if b.cfg.Cache != nil {
		cached = make([][]arrow.RecordBatch, len(f.blocks))
	}
	for i, blk := range f.blocks {
		keys[i] = blk.key
		if cached != nil {
			cached[i] = b.cfg.Cache.borrow(blk.cached)
		}
	}
	schema := b.schema
	b.bg.Go(func() { b.combine(f, keys, cached, schema) })
}

// combine runs one combination of f; on failure it schedules the next try
// (reading every block from the lake: the borrowed records are returned).
func (b *Buffer) combine(f *VirtualFile, keys []string, cached [][]arrow.RecordBatch, schema *arrow.Schema) {
	ctx := context.Background()
	b.cfg.Combines.acquire()
	defer b.cfg.Combines.release()
	groups, size, err := combineBlocks(ctx, b.cfg.Lake, schema, b.cfg.TableID, f.id, keys, cached, CombinedGroupRows(b.cfg.BlockRows), b.combinedSize.Load())
	if err == nil {
		b.combinedSize.Store(size)
	}
	for _, recs := range cached {
		for _, r := range recs {
			r.Release()
		}
	}
	if err == nil {
		b.cfg.Failpoints.Hit(failpoint.CombineBeforeCatalog)
		_, err = b.cfg.Catalog.SetFileState(ctx, f.id, catalog.Regular, groups)
	}
	if err == nil {
		b.cfg.Failpoints.Hit(failpoint.CombineAfterCatalog)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		f.combineFails++
		b.stats.FlushErrors++
		b.stats.LastFlushError = err.Error()
		if b.closed {
			f.combining = false
			b.notify()
			b.log.Warn("combination failed while closing; the file stays virtual", "file", f.id, "err", err)
			return
		}
		delay := b.retry.Backoff(f.combineFails)
		b.log.Warn("combination failed; will retry", "file", f.id, "attempt", f.combineFails, "retry_in", delay, "err", err)
		time.AfterFunc(delay, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.closed {
				f.combining = false
				b.notify()
				return
			}
			b.bg.Go(func() { b.combine(f, keys, nil, schema) })
		})
		return
	}
	f.combining = false
	f.combined = true
	b.stats.Combined++
	b.maybeClean(f)
	b.notify()
}

// CombinedGroupRows is the row-group size of combined files: sixteen blocks
// (128Ki rows by default), small enough that a scan skips a group whose
// versions are all deleted (the oldest rows of a table that purges its
// history) and prunes by statistics, large enough to read fast.
func CombinedGroupRows(blockRows int) int64 { return int64(max(blockRows, 1)) * 16 }

// CombineBlocks writes block objects, in order, as one regular file with
// row groups of up to groupRows rows under the file's regular key, and
// returns its row groups. A block written before the table gained columns
// gets NULL in them. The blocks stay; the caller deletes them once the
// catalog names the regular file.
func CombineBlocks(ctx context.Context, l Lake, schema *arrow.Schema, table uint32, file uint64, keys []string, groupRows int64) ([]lake.RowGroupMeta, error) {
	groups, _, err := combineBlocks(ctx, l, schema, table, file, keys, nil, groupRows, 0)
	return groups, err
}

// combineBlocks is CombineBlocks taking a block's rows from cached[i] when
// the cache still had them decoded, in the file's schema: the object is
// then neither read nor decoded. sizeHint is the expected file size (the
// last one combined): the file is encoded into a buffer that size, not one
// grown by doubling. It returns the file's size.
func combineBlocks(ctx context.Context, l Lake, schema *arrow.Schema, table uint32, file uint64, keys []string, cached [][]arrow.RecordBatch, groupRows int64, sizeHint int64) ([]lake.RowGroupMeta, int64, error) {
	var buf bytes.Buffer
	buf.Grow(int(sizeHint + sizeHint/8))
	w, err := lake.NewFileWriter(&buf, schema, lake.WriterOptions{RowGroupRows: groupRows})
	if err != nil {
		return nil, 0, err
	}
	for i, key := range keys {
		if i < len(cached) && sameSchema(cached[i], schema) {
			for _, r := range cached[i] {
				if err := w.Write(r); err != nil {
					return nil, 0, err
				}
			}
			continue
		}
		data, err := l.Get(ctx, key)
		if err != nil {
			return nil, 0, err
		}
		if err := copyBlock(ctx, w, schema, key, data); err != nil {
			return nil, 0, err
		}
	}
	groups, err := w.Close()
	if err != nil {
		return nil, 0, err
	}
	if err := l.Put(ctx, RegularKey(table, file), buf.Bytes()); err != nil {
		return nil, 0, err
	}
	return groups, int64(buf.Len()), nil
}

// sameSchema reports records that are there and all in schema (a block
// built before the table gained columns is not).
func sameSchema(recs []arrow.RecordBatch, schema *arrow.Schema) bool {
	for _, r := range recs {
		if !r.Schema().Equal(schema) {
			return false
		}
	}
	return len(recs) > 0
}

// copyBlock appends every row of one block object to w, in the file's
// schema (NULL in the columns the table gained after the block was built).
func copyBlock(ctx context.Context, w *lake.FileWriter, schema *arrow.Schema, key string, data []byte) error {
	recs, err := lake.ReadBlock(ctx, data, nil)
	if err != nil {
		return fmt.Errorf("block %s: %w", key, err)
	}
	defer func() {
		for _, r := range recs {
			r.Release()
		}
	}()
	for _, r := range recs {
		wide, err := lake.WidenBlock(r, schema, nil)
		if err != nil {
			return fmt.Errorf("block %s: %w", key, err)
		}
		err = w.Write(wide)
		wide.Release()
		if err != nil {
			return err
		}
	}
	return nil
}

// maybeClean deletes a combined file's small objects once no view holds
// them. Called with mu held.
func (b *Buffer) maybeClean(f *VirtualFile) {
	if !f.combined || f.readers > 0 || f.cleaned {
		return
	}
	f.cleaned = true
	delete(b.files, f.id)
	keys := make([]string, 0, len(f.blocks))
	for _, blk := range f.blocks {
		keys = append(keys, blk.key)
		if blk.cached != nil {
			b.cfg.Cache.remove(blk.cached)
		}
	}
	f.blocks = nil
	b.bg.Go(func() {
		for _, k := range keys {
			if err := b.cfg.Lake.Delete(context.Background(), k); err != nil {
				b.log.Warn("deleting a combined block failed; the object is orphaned", "key", k, "err", err)
			}
		}
	})
}
