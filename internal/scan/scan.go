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
	MappedReaderAt(ctx context.Context, key string) (*lake.ObjectReader, error) // point reads
	Get(ctx context.Context, key string) ([]byte, error)                        // a whole (block) object
}

// Scanner runs scans; it is safe for concurrent use.
type Scanner struct {
	lake    Lake
	owners  Owners
	mem     memory.Allocator
	footers *lake.Footers
	// NoVisibility skips the deleted-bitmap step (benchmarks measure the
	// filter's cost with it); create_ts filtering still applies.
	NoVisibility bool
}

// footerCacheBytes bounds the Parquet file tails a scanner keeps: a few
// hundred files' footers and offset indexes (at most 128 KiB each).
const footerCacheBytes = 32 << 20

// New makes a scanner.
func New(l Lake, owners Owners, mem memory.Allocator) *Scanner {
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	return &Scanner{lake: l, owners: owners, mem: mem, footers: lake.NewFooters(footerCacheBytes)}
}

// Request is one table scan at one snapshot.
type Request struct {
	Table    *catalog.Table
	Files    []*catalog.File // the live files of the table in the planning snapshot
	Snapshot uint64
	Columns  []int // projected table columns, in output order
	// Deleted, when set, reads the deleted bits at Snapshot instead of the
	// files' visibility structures (a reader whose snapshot was
	// checkpointed keeps its own bitmaps).
	Deleted DeletedReader
}

// DeletedReader reads the deleted bits of rows [offset, offset+rows) of a
// file at a snapshot, as visibility.RowGroup.BitmapRange does: the bits
// start at bit of the returned words, which may reuse buf.
type DeletedReader interface {
	DeletedRange(file uint64, vis *visibility.RowGroup, offset, rows int, buf []uint64) (bm []uint64, bit int, err error)
}

// Stats count what a scan did.
type Stats struct {
	Splits, SkippedSplits int
	// DeadSkipped counts row groups and blocks not read because every
	// version in them is deleted at the snapshot.
	DeadSkipped       int
	RowsRead, RowsOut int64
}

// Split is one unit of scan work: a row group of a regular file, or a
// whole virtual file (its write-buffer blocks).
type Split struct {
	File     *catalog.File
	RowGroup int // regular files; -1 for a virtual file
}

// Plan lists the splits of a request, skipping row groups whose rows are all
// newer than the snapshot (statistics from the catalog, no I/O).
func (sc *Scanner) Plan(req Request) ([]Split, Stats) {
	var st Stats
	var out []Split
	for _, f := range req.Files {
		if f.State == catalog.Virtual {
			out = append(out, Split{File: f, RowGroup: -1})
			continue
		}
		for g, meta := range f.RowGroups {
			if meta.Rows == 0 || meta.MinCreateTS > req.Snapshot {
				st.SkippedSplits++
				continue
			}
			out = append(out, Split{File: f, RowGroup: g})
		}
		if len(f.RowGroups) == 0 { // row groups unknown: read the footer
			out = append(out, Split{File: f, RowGroup: -2})
		}
	}
	st.Splits = len(out) + st.SkippedSplits
	return out, st
}

// Scan emits the visible rows of the requested columns. emit owns each
// record it receives (release it when done).
func (sc *Scanner) Scan(ctx context.Context, req Request, emit func(arrow.RecordBatch) error) (Stats, error) {
	if err := sc.check(req); err != nil {
		return Stats{}, err
	}
	splits, st := sc.Plan(req)
	for _, sp := range splits {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if err := sc.ScanSplit(ctx, req, sp, &st, emit); err != nil {
			return st, err
		}
	}
	return st, nil
}

func (sc *Scanner) check(req Request) error {
	for _, c := range req.Columns {
		if c < 0 || c >= len(req.Table.Schema.Columns) {
			return fmt.Errorf("scan: %s has no column %d", req.Table.Name, c)
		}
	}
	return nil
}

// ScanSplit scans one split. Splits of one request may be scanned in
// parallel, each with its own Stats.
func (sc *Scanner) ScanSplit(ctx context.Context, req Request, sp Split, st *Stats, emit func(arrow.RecordBatch) error) error {
	return sc.ScanSplitSelected(ctx, req, sp, st, sc.materialize(ctx, emit))
}

// Selected is a sink for records with their visible rows marked: bit i of
// Mask is set iff row i is visible (nil: all rows). The sink owns rec.
type Selected func(rec arrow.RecordBatch, mask []uint64, visible int) error

// ScanSplitSelected scans one split without copying out the visible rows:
// the sink gets each record with its selection, for consumers that copy
// rows anyway (the SQL engine's table function).
func (sc *Scanner) ScanSplitSelected(ctx context.Context, req Request, sp Split, st *Stats, emit Selected) error {
	var err error
	switch {
	case sp.RowGroup == -1:
		err = sc.scanVirtual(ctx, req, sp.File, st, emit)
	case sp.RowGroup == -2:
		err = sc.scanRegular(ctx, req, sp.File, sp.File.Key, nil, -1, st, emit)
	default:
		err = sc.scanRegular(ctx, req, sp.File, sp.File.Key, nil, sp.RowGroup, st, emit)
	}
	if err != nil {
		return fmt.Errorf("scan %s file %d: %w", req.Table.Name, sp.File.ID, err)
	}
	return nil
}

func (sc *Scanner) owner(f *catalog.File) (Owner, error) {
	o, ok := sc.owners(f.Replayer)
	if !ok {
		return nil, fmt.Errorf("replayer %d owning file %d is not reachable", f.Replayer, f.ID)
	}
	return o, nil
}

// Visibility is the visibility structure of a file, from its owner.
func (sc *Scanner) Visibility(f *catalog.File) (*visibility.RowGroup, error) {
	o, err := sc.owner(f)
	if err != nil {
		return nil, err
	}
	vis, ok := o.FileVisibility(f.ID)
	if !ok {
		return nil, fmt.Errorf("replayer %d has no visibility for file %d", f.Replayer, f.ID)
	}
	return vis, nil
}

// deleted returns the file's deleted set at the snapshot, read per row
// group as the scan reaches it; nil when the scan runs without visibility.
func (sc *Scanner) deleted(f *catalog.File, vis *visibility.RowGroup, req Request) (*deletedSet, error) {
	if sc.NoVisibility {
		return nil, nil
	}
	if vis == nil {
		var err error
		if vis, err = sc.Visibility(f); err != nil {
			return nil, err
		}
	}
	return &deletedSet{file: f.ID, vis: vis, snapshot: req.Snapshot, reader: req.Deleted}, nil
}

// deletedSet is one file's visibility at a snapshot. Each row group (or
// block) takes the bitmap of its own rows: a file's whole bitmap is
// 128 KiB for a million rows, a scan of ten rows needs one tile's.
type deletedSet struct {
	file     uint64
	vis      *visibility.RowGroup
	snapshot uint64
	reader   DeletedReader // nil: vis at snapshot
	buf      []uint64
	// The last range asked for and its bits: a block's dead-block check
	// and its read ask for the same range.
	lastOff, lastRows int
	last              []uint64
}

// at is the deleted bitmap of rows [offset, offset+rows), bit 0 first;
// valid until the next call.
func (d *deletedSet) at(offset, rows int) ([]uint64, error) {
	if d == nil {
		return nil, nil
	}
	if d.last != nil && offset == d.lastOff && rows == d.lastRows {
		return d.last, nil
	}
	var (
		bm  []uint64
		bit int
		err error
	)
	if d.reader != nil {
		bm, bit, err = d.reader.DeletedRange(d.file, d.vis, offset, rows, d.buf)
	} else {
		bm, bit, err = d.vis.BitmapRange(d.snapshot, offset, rows, d.buf)
	}
	if err != nil {
		return nil, err
	}
	d.buf = bm
	d.last, d.lastOff, d.lastRows = bitsAt(bm, bit, rows), offset, rows
	return d.last, nil
}

// scanRegular scans one row group of a Parquet file (only = -1: all).
func (sc *Scanner) scanRegular(ctx context.Context, req Request, f *catalog.File, key string, vis *visibility.RowGroup, only int, st *Stats, emit Selected) error {
	r, err := sc.lake.ReaderAt(ctx, key)
	if err != nil {
		return err
	}
	pf, err := sc.openWidened(key, r, req.Table)
	if err != nil {
		return err
	}
	defer pf.Close()
	del, err := sc.deleted(f, vis, req)
	if err != nil {
		return err
	}
	return sc.scanRowGroups(ctx, req, pf, 0, only, del, st, emit)
}

// scanRowGroups filters and emits the row groups of an open Parquet file
// (only = -1: all) whose first row is at offset in the file's deleted set.
// Row groups created after the snapshot are skipped unread.
func (sc *Scanner) scanRowGroups(ctx context.Context, req Request, pf *lake.File, offset, only int, del *deletedSet, st *Stats, emit Selected) error {
	for g, meta := range pf.RowGroups() {
		rows := int(meta.Rows)
		if (only >= 0 && g != only) || meta.Rows == 0 || meta.MinCreateTS > req.Snapshot {
			offset += rows
			continue
		}
		deleted, err := del.at(offset, rows)
		if err != nil {
			return err
		}
		if allSet(deleted, rows) { // every version deleted: nothing to read
			st.DeadSkipped++
			offset += rows
			continue
		}
		rec, err := pf.ReadRowGroup(ctx, g, req.Columns, true)
		if err != nil {
			return err
		}
		err = sc.filterEmit(ctx, rec, deleted, req.Snapshot < meta.MaxCreateTS, req.Snapshot, st, emit)
		rec.Release()
		if err != nil {
			return err
		}
		offset += rows
	}
	return nil
}

// scanVirtual scans a file still in a replayer's write buffer: in-memory
// blocks from the view, flushed blocks from the lake, each with the
// bitmap of its own rows.
func (sc *Scanner) scanVirtual(ctx context.Context, req Request, f *catalog.File, st *Stats, emit Selected) error {
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
		return sc.scanRegular(ctx, req, f, fv.Key, fv.Vis, -1, st, emit)
	}
	del, err := sc.deleted(f, fv.Vis, req)
	if err != nil {
		return err
	}
	for _, b := range fv.Blocks {
		if dead, err := del.at(int(b.First), b.Rows); err != nil {
			return err
		} else if allSet(dead, b.Rows) { // every version deleted: nothing to read
			st.DeadSkipped++
			continue
		}
		recs := b.Records
		if recs == nil { // flushed and not in the block cache
			var err error
			if recs, err = sc.readBlock(ctx, b.Key); err != nil {
				return err
			}
		}
		err := sc.scanRecords(ctx, req, recs, int(b.First), del, st, emit)
		if b.Records == nil {
			releaseRecords(recs)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// scanRecords filters and emits a block's records, the first of which
// starts at offset first of its file.
func (sc *Scanner) scanRecords(ctx context.Context, req Request, recs []arrow.RecordBatch, first int, del *deletedSet, st *Stats, emit Selected) error {
	offset := first
	for _, rec := range recs {
		rows := int(rec.NumRows())
		proj, err := project(rec, req.Table, req.Columns)
		if err != nil {
			return err
		}
		deleted, err := del.at(offset, rows)
		if err == nil {
			err = sc.filterEmit(ctx, proj, deleted, true, req.Snapshot, st, emit)
		}
		proj.Release()
		if err != nil {
			return err
		}
		offset += rows
	}
	return nil
}

// readBlock reads and decodes a flushed block object; the caller releases
// its records.
func (sc *Scanner) readBlock(ctx context.Context, key string) ([]arrow.RecordBatch, error) {
	data, err := sc.lake.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	recs, err := lake.ReadBlock(ctx, data, sc.mem)
	if err != nil {
		return nil, fmt.Errorf("block object %s: %w", key, err)
	}
	return recs, nil
}

func releaseRecords(recs []arrow.RecordBatch) {
	for _, r := range recs {
		r.Release()
	}
}

// openWidened opens Parquet object key of table t, its footer from the
// scanner's cache when it is there: written before the table gained
// columns, it reads NULL in them.
func (sc *Scanner) openWidened(key string, r *lake.ObjectReader, t *catalog.Table) (*lake.File, error) {
	pf, err := lake.OpenFileCached(r, sc.mem, sc.footers, key)
	if err != nil {
		return nil, err
	}
	if pf.Schema().NumFields() == len(t.Schema.Columns) {
		return pf, nil // the common case: nothing added since; no schema built per scan
	}
	if err := pf.Widen(writebuffer.Schema(writebuffer.TableColumns(t.Schema))); err != nil {
		pf.Close()
		return nil, fmt.Errorf("table %s: %w", t.Name, err)
	}
	return pf, nil
}

// project keeps the requested columns of a buffered record (the table's
// columns when the block was written, then create_ts) and its create_ts
// column last; a column the block predates reads NULL.
func project(rec arrow.RecordBatch, t *catalog.Table, cols []int) (arrow.RecordBatch, error) {
	n := int(rec.NumCols())
	fields := make([]arrow.Field, 0, len(cols)+1)
	arrs := make([]arrow.Array, 0, len(cols)+1)
	var nulls []arrow.Array
	defer func() {
		for _, a := range nulls {
			a.Release()
		}
	}()
	for _, c := range cols {
		if c < n-1 {
			fields = append(fields, rec.Schema().Field(c))
			arrs = append(arrs, rec.Column(c))
			continue
		}
		if c >= len(t.Schema.Columns) {
			return nil, fmt.Errorf("column %d of a %d-column table", c, len(t.Schema.Columns))
		}
		tc := t.Schema.Columns[c]
		a := array.MakeArrayOfNull(memory.DefaultAllocator, tc.Type.ArrowType(), int(rec.NumRows()))
		nulls = append(nulls, a)
		fields = append(fields, arrow.Field{Name: tc.Name, Type: tc.Type.ArrowType(), Nullable: true})
		arrs = append(arrs, a)
	}
	fields = append(fields, rec.Schema().Field(n-1))
	arrs = append(arrs, rec.Column(n-1))
	return array.NewRecordBatch(arrow.NewSchema(fields, nil), arrs, rec.NumRows()), nil
}

// filterEmit drops invisible rows of rec (projected columns + create_ts
// last) and emits the rest without the create_ts column.
func (sc *Scanner) filterEmit(ctx context.Context, rec arrow.RecordBatch, deleted []uint64, filterTS bool, snapshot uint64, st *Stats, emit Selected) error {
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
	st.RowsOut += int64(visible)
	trimmed := array.NewRecordBatch(arrow.NewSchema(rec.Schema().Fields()[:rec.NumCols()-1], nil), rec.Columns()[:rec.NumCols()-1], int64(n))
	if visible == n {
		mask = nil
	}
	return emit(trimmed, mask, visible)
}

// materialize adapts a record sink to selected records: it copies out the
// visible rows (Arrow's filter kernel, the mask as its selection bitmap).
func (sc *Scanner) materialize(ctx context.Context, emit func(arrow.RecordBatch) error) Selected {
	return func(rec arrow.RecordBatch, mask []uint64, visible int) error {
		defer rec.Release()
		if mask == nil {
			rec.Retain()
			return emit(rec)
		}
		out, err := lake.FilterVisible(ctx, rec, mask, visible, sc.mem)
		if err != nil {
			return err
		}
		return emit(out)
	}
}

// bitsAt returns the n bits of bm starting at bit off, as words from bit 0.
// A nil bm (no visibility) stays nil.
// allSet says bits [0, n) of bm are all set (nil: none are).
func allSet(bm []uint64, n int) bool {
	if bm == nil || n <= 0 {
		return false
	}
	full := n / 64
	for _, w := range bm[:full] {
		if w != ^uint64(0) {
			return false
		}
	}
	if r := n % 64; r != 0 {
		mask := uint64(1)<<r - 1
		return bm[full]&mask == mask
	}
	return true
}

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

// EachRow calls fn with every row of a table visible at a snapshot, every
// column, in no particular order (a replayer finds rows by content this
// way). fn may keep row.
func (sc *Scanner) EachRow(ctx context.Context, t *catalog.Table, files []*catalog.File, snapshot uint64, fn func(row []any) error) error {
	cols := make([]int, len(t.Schema.Columns))
	for i := range cols {
		cols[i] = i
	}
	_, err := sc.Scan(ctx, Request{Table: t, Files: files, Snapshot: snapshot, Columns: cols}, func(rec arrow.RecordBatch) error {
		defer rec.Release()
		for i := range int(rec.NumRows()) {
			row, err := rowOf(rec, i, cols)
			if err != nil {
				return err
			}
			if err := fn(row); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scan: rows of %s at snapshot %d: %w", t.Name, snapshot, err)
	}
	return nil
}
