// Package scan reads the rows of a table visible at a snapshot with
// vectorized filter-on-read (the Retina paper's Algorithm 1): for every
// split, skip it if all its rows are newer than the snapshot, take the
// deleted bitmap at the snapshot from the owning replayer, filter
// create_ts ≤ snapshot only when the split has newer rows, read only the
// projected columns, and emit only visible rows as Arrow records.
package scan

import (
	"context"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/visibility"
	"github.com/retinadb/retina/internal/writebuffer"
)

// Owner is the replayer that owns a file's visibility and write buffer.
type Owner interface {
	FileVisibility(file uint64) (*visibility.RowGroup, bool)
	Buffer(table uint32) (*writebuffer.Buffer, error)
}

// Owners finds the owner of a file by its replayer id.
type Owners func(replayer uint32) (Owner, bool)

// Lake is what a scan reads from object storage.
type Lake interface {
	ReaderAt(ctx context.Context, key string) (*lake.ObjectReader, error)
}

// Scanner runs scans; it is safe for concurrent use.
type Scanner struct {
	lake   Lake
	owners Owners
	mem    memory.Allocator
	// NoVisibility skips the deleted-bitmap step (benchmarks measure the
	// filter's cost with it); create_ts filtering still applies.
	NoVisibility bool
}

// New makes a scanner.
func New(l Lake, owners Owners, mem memory.Allocator) *Scanner {
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	return &Scanner{lake: l, owners: owners, mem: mem}
}

// Request is one table scan at one snapshot.
type Request struct {
	Table    *catalog.Table
	Files    []*catalog.File // the live files of the table in the planning snapshot
	Snapshot uint64
	Columns  []int // projected table columns, in output order
}

// Stats count what a scan did.
type Stats struct {
	Splits, SkippedSplits int
	RowsRead, RowsOut     int64
}

// Scan emits the visible rows of the requested columns. emit owns each
// record it receives (release it when done).
func (sc *Scanner) Scan(ctx context.Context, req Request, emit func(arrow.RecordBatch) error) (Stats, error) {
	var st Stats
	for _, c := range req.Columns {
		if c < 0 || c >= len(req.Table.Schema.Columns) {
			return st, fmt.Errorf("scan: %s has no column %d", req.Table.Name, c)
		}
	}
	for _, f := range req.Files {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		var err error
		if f.State == catalog.Virtual {
			err = sc.scanVirtual(ctx, req, f, &st, emit)
		} else {
			err = sc.scanRegular(ctx, req, f, f.Key, nil, &st, emit)
		}
		if err != nil {
			return st, fmt.Errorf("scan %s file %d: %w", req.Table.Name, f.ID, err)
		}
	}
	return st, nil
}

func (sc *Scanner) owner(f *catalog.File) (Owner, error) {
	o, ok := sc.owners(f.Replayer)
	if !ok {
		return nil, fmt.Errorf("replayer %d owning file %d is not reachable", f.Replayer, f.ID)
	}
	return o, nil
}

// bitmap returns the file's deleted bitmap at the snapshot, or nil when the
// scan runs without visibility.
func (sc *Scanner) bitmap(f *catalog.File, vis *visibility.RowGroup, snapshot uint64) ([]uint64, error) {
	if sc.NoVisibility {
		return nil, nil
	}
	if vis == nil {
		o, err := sc.owner(f)
		if err != nil {
			return nil, err
		}
		var ok bool
		if vis, ok = o.FileVisibility(f.ID); !ok {
			return nil, fmt.Errorf("replayer %d has no visibility for file %d", f.Replayer, f.ID)
		}
	}
	bm := make([]uint64, vis.BitmapWords())
	if err := vis.Bitmap(snapshot, bm); err != nil {
		return nil, err
	}
	return bm, nil
}

// scanRegular scans the row groups of a Parquet file (one per regular file
// today; the loop covers rewritten files with several).
func (sc *Scanner) scanRegular(ctx context.Context, req Request, f *catalog.File, key string, vis *visibility.RowGroup, st *Stats, emit func(arrow.RecordBatch) error) error {
	groups := f.RowGroups
	live := false
	for _, g := range groups {
		live = live || (g.Rows > 0 && g.MinCreateTS <= req.Snapshot)
	}
	st.Splits += len(groups)
	if !live && groups != nil {
		st.SkippedSplits += len(groups)
		return nil
	}
	r, err := sc.lake.ReaderAt(ctx, key)
	if err != nil {
		return err
	}
	pf, err := lake.OpenFile(r, sc.mem)
	if err != nil {
		return err
	}
	defer pf.Close()
	bm, err := sc.bitmap(f, vis, req.Snapshot)
	if err != nil {
		return err
	}
	offset := 0
	for g, meta := range pf.RowGroups() {
		rows := int(meta.Rows)
		if meta.Rows == 0 || meta.MinCreateTS > req.Snapshot {
			st.SkippedSplits++
			offset += rows
			continue
		}
		rec, err := pf.ReadRowGroup(ctx, g, req.Columns, true)
		if err != nil {
			return err
		}
		err = sc.filterEmit(ctx, rec, bitsAt(bm, offset, rows), req.Snapshot < meta.MaxCreateTS, req.Snapshot, st, emit)
		rec.Release()
		if err != nil {
			return err
		}
		offset += rows
	}
	return nil
}

// scanVirtual scans a file still in a replayer's write buffer: in-memory
// blocks from the view, flushed blocks from the lake, one bitmap for all.
func (sc *Scanner) scanVirtual(ctx context.Context, req Request, f *catalog.File, st *Stats, emit func(arrow.RecordBatch) error) error {
	o, err := sc.owner(f)
	if err != nil {
		return err
	}
	buf, err := o.Buffer(req.Table.ID)
	if err != nil {
		return err
	}
	view := buf.View(f.ID)
	defer view.Release()
	fv := view.Files[0]
	if fv.Regular { // combined since the plan was made: read it as regular
		rf := *f
		rf.RowGroups = nil
		return sc.scanRegular(ctx, req, &rf, fv.Key, fv.Vis, st, emit)
	}
	bm, err := sc.bitmap(f, fv.Vis, req.Snapshot)
	if err != nil {
		return err
	}
	st.Splits++
	for _, b := range fv.Blocks {
		if b.Records == nil {
			if err := sc.scanBlockObject(ctx, req, b, bm, st, emit); err != nil {
				return err
			}
			continue
		}
		offset := int(b.First)
		for _, rec := range b.Records {
			rows := int(rec.NumRows())
			proj, err := project(rec, req.Columns)
			if err != nil {
				return err
			}
			err = sc.filterEmit(ctx, proj, bitsAt(bm, offset, rows), true, req.Snapshot, st, emit)
			proj.Release()
			if err != nil {
				return err
			}
			offset += rows
		}
	}
	return nil
}

func (sc *Scanner) scanBlockObject(ctx context.Context, req Request, b writebuffer.BlockView, bm []uint64, st *Stats, emit func(arrow.RecordBatch) error) error {
	r, err := sc.lake.ReaderAt(ctx, b.Key)
	if err != nil {
		return err
	}
	pf, err := lake.OpenFile(r, sc.mem)
	if err != nil {
		return err
	}
	defer pf.Close()
	offset := int(b.First)
	for g, meta := range pf.RowGroups() {
		rows := int(meta.Rows)
		if meta.Rows == 0 || meta.MinCreateTS > req.Snapshot {
			offset += rows
			continue
		}
		rec, err := pf.ReadRowGroup(ctx, g, req.Columns, true)
		if err != nil {
			return err
		}
		err = sc.filterEmit(ctx, rec, bitsAt(bm, offset, rows), req.Snapshot < meta.MaxCreateTS, req.Snapshot, st, emit)
		rec.Release()
		if err != nil {
			return err
		}
		offset += rows
	}
	return nil
}

// project keeps the requested columns of a buffered record (all table
// columns + create_ts) and its create_ts column last.
func project(rec arrow.RecordBatch, cols []int) (arrow.RecordBatch, error) {
	n := int(rec.NumCols())
	fields := make([]arrow.Field, 0, len(cols)+1)
	arrs := make([]arrow.Array, 0, len(cols)+1)
	for _, c := range append(append([]int(nil), cols...), n-1) {
		if c >= n {
			return nil, fmt.Errorf("column %d of a %d-column block", c, n)
		}
		fields = append(fields, rec.Schema().Field(c))
		arrs = append(arrs, rec.Column(c))
	}
	return array.NewRecordBatch(arrow.NewSchema(fields, nil), arrs, rec.NumRows()), nil
}

// filterEmit drops invisible rows of rec (projected columns + create_ts
// last) and emits the rest without the create_ts column.
func (sc *Scanner) filterEmit(ctx context.Context, rec arrow.RecordBatch, deleted []uint64, filterTS bool, snapshot uint64, st *Stats, emit func(arrow.RecordBatch) error) error {
	n := int(rec.NumRows())
	st.RowsRead += int64(n)
	var ts []int64
	if filterTS {
		ts = rec.Column(int(rec.NumCols()) - 1).(*array.Int64).Int64Values()
	}
	mask, visible := lake.VisibleMask(nil, n, deleted, ts, snapshot)
	if visible == 0 {
		return nil
	}
	trimmed := array.NewRecordBatch(arrow.NewSchema(rec.Schema().Fields()[:rec.NumCols()-1], nil), rec.Columns()[:rec.NumCols()-1], int64(n))
	defer trimmed.Release()
	out, err := lake.FilterVisible(ctx, trimmed, mask, visible, sc.mem)
	if err != nil {
		return err
	}
	st.RowsOut += out.NumRows()
	return emit(out)
}

// bitsAt returns the n bits of bm starting at bit off, as words from bit 0.
// A nil bm (no visibility) stays nil.
func bitsAt(bm []uint64, off, n int) []uint64 {
	if bm == nil {
		return nil
	}
	words := (n + 63) / 64
	if off%64 == 0 {
		lo := off / 64
		return bm[lo:min(lo+words, len(bm))]
	}
	out := make([]uint64, words)
	w, s := off/64, uint(off%64)
	for i := range out {
		var v uint64
		if w+i < len(bm) {
			v = bm[w+i] >> s
		}
		if w+i+1 < len(bm) {
			v |= bm[w+i+1] << (64 - s)
		}
		out[i] = v
	}
	return out
}

// LiveKeys lists the primary keys of the rows of a table visible at a
// snapshot (a truncate deletes them).
func (sc *Scanner) LiveKeys(ctx context.Context, t *catalog.Table, files []*catalog.File, snapshot uint64) ([][]any, error) {
	keyCols := t.Schema.KeyColumns()
	var out [][]any
	_, err := sc.Scan(ctx, Request{Table: t, Files: files, Snapshot: snapshot, Columns: keyCols}, func(rec arrow.RecordBatch) error {
		defer rec.Release()
		for i := range int(rec.NumRows()) {
			key := make([]any, len(keyCols))
			for c := range keyCols {
				v, err := Value(rec.Column(c), i)
				if err != nil {
					return err
				}
				key[c] = v
			}
			out = append(out, key)
		}
		return nil
	})
	return out, err
}
