package lake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/metadata"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// CreateTSColumn is the hidden column holding each row's create timestamp:
// the mirror transaction that wrote the version. It is the last column of
// every Retina file.
const CreateTSColumn = "_retina_create_ts"

// Field ids. Every file numbers its columns in the Parquet schema, so that
// readers that match columns by id (Iceberg's) find them: table column i
// has id i+1 (a table only ever gains columns at its end, so an id is never
// given to another column), and the create_ts column has CreateTSFieldID,
// which no table column reaches and which Iceberg's reserved ids (the 200
// below 2^31) leave free.
const CreateTSFieldID = 1<<31 - 202

// FieldID is the field id of table column i.
func FieldID(column int) int { return column + 1 }

// fieldIDKey is the Arrow field metadata key the Parquet writer reads a
// field id from.
const fieldIDKey = "PARQUET:field_id"

// withFieldIDs numbers the fields of a file schema (create_ts last).
func withFieldIDs(schema *arrow.Schema) *arrow.Schema {
	fields := slices.Clone(schema.Fields())
	for i := range fields {
		id := FieldID(i)
		if i == len(fields)-1 {
			id = CreateTSFieldID
		}
		fields[i].Metadata = arrow.NewMetadata([]string{fieldIDKey}, []string{strconv.Itoa(id)})
	}
	md := schema.Metadata()
	return arrow.NewSchema(fields, &md)
}

// ErrBadFile reports a file that is not a Retina Parquet file.
var ErrBadFile = errors.New("lake: not a Retina file")

// FileSchema is the schema of a table's files: the table's columns followed
// by the non-null int64 create-timestamp column.
func FileSchema(table *arrow.Schema) *arrow.Schema {
	fields := append(table.Fields(), arrow.Field{Name: CreateTSColumn, Type: arrow.PrimitiveTypes.Int64})
	return arrow.NewSchema(fields, nil)
}

// RowGroupMeta is what a scan needs to plan a row group without reading it.
type RowGroupMeta struct {
	Rows        int64
	MinCreateTS uint64
	MaxCreateTS uint64
}

// WriterOptions tune the Parquet writer.
type WriterOptions struct {
	// RowGroupRows caps rows per row group (default 1<<20).
	RowGroupRows int64
	// Codec is "zstd" (the default), "snappy", "gzip", "lz4" or "none".
	Codec string
	// Level is the codec's compression level; 0 is the default, which for
	// zstd is level 1. On ingest-shaped rows level 1 made files about 6%
	// larger than zstd's own default (3) and the whole write a third
	// cheaper; every ingested row is written twice (a block, then a file).
	Level int
	// PlainStrings turns dictionary encoding of string and binary columns off.
	PlainStrings bool
}

func (o *WriterOptions) codec() (compress.Compression, error) {
	switch o.Codec {
	case "", "zstd":
		return compress.Codecs.Zstd, nil
	case "snappy":
		return compress.Codecs.Snappy, nil
	case "gzip":
		return compress.Codecs.Gzip, nil
	case "lz4":
		return compress.Codecs.Lz4Raw, nil
	case "none":
		return compress.Codecs.Uncompressed, nil
	}
	return 0, fmt.Errorf("lake: unknown codec %q", o.Codec)
}

// dataPageBytes is the target size of a data page before compression.
const dataPageBytes = 64 << 10

// FileWriter writes one Retina Parquet file from Arrow records whose schema
// is FileSchema(table). Row groups hold up to RowGroupRows rows; a record may
// span row groups. Records are held (retained) until their row group is
// complete and then written column by column, so nothing is copied into an
// intermediate buffer.
type FileWriter struct {
	fw      *pqarrow.FileWriter
	schema  *arrow.Schema
	tsIdx   int
	opts    WriterOptions
	groups  []RowGroupMeta
	pending []arrow.RecordBatch // slices of the row group being gathered
	inGroup int64
	closed  bool
}

// NewFileWriter starts a file on w. schema must end with the create_ts column.
func NewFileWriter(w io.Writer, schema *arrow.Schema, opts WriterOptions) (*FileWriter, error) {
	if opts.RowGroupRows <= 0 {
		opts.RowGroupRows = 1 << 20
	}
	codec, err := opts.codec()
	if err != nil {
		return nil, err
	}
	n := schema.NumFields()
	if n == 0 || schema.Field(n-1).Name != CreateTSColumn || schema.Field(n-1).Type.ID() != arrow.INT64 {
		return nil, fmt.Errorf("%w: schema must end with int64 %s", ErrBadFile, CreateTSColumn)
	}
	level := opts.Level
	if level == 0 {
		level = compress.DefaultCompressionLevel
		if codec == compress.Codecs.Zstd {
			level = 1
		}
	}
	props := []parquet.WriterProperty{
		parquet.WithCompression(codec),
		parquet.WithCompressionLevel(level),
		parquet.WithStats(true),
		parquet.WithMaxRowGroupLength(opts.RowGroupRows),
		parquet.WithDictionaryDefault(false),
		parquet.WithCreatedBy("retina"),
		// Pages of 64 KiB and an offset index per column chunk let a read
		// of one row (a point lookup) fetch and decode one page per column
		// instead of its whole row group; scans read the same bytes.
		parquet.WithDataPageSize(dataPageBytes),
		parquet.WithPageIndexEnabled(true),
	}
	for _, f := range schema.Fields() {
		if !opts.PlainStrings && (f.Type.ID() == arrow.STRING || f.Type.ID() == arrow.BINARY) {
			props = append(props, parquet.WithDictionaryFor(f.Name, true))
		}
	}
	fw, err := pqarrow.NewFileWriter(withFieldIDs(schema), w, parquet.NewWriterProperties(props...),
		pqarrow.NewArrowWriterProperties(pqarrow.WithStoreSchema()))
	if err != nil {
		return nil, fmt.Errorf("lake: parquet writer: %w", err)
	}
	return &FileWriter{fw: fw, schema: schema, tsIdx: n - 1, opts: opts}, nil
}

// Write appends rows, completing row groups as they fill.
func (w *FileWriter) Write(rec arrow.RecordBatch) error {
	if w.closed {
		return fmt.Errorf("lake: write after close")
	}
	if !rec.Schema().Equal(w.schema) {
		return fmt.Errorf("lake: record schema %s does not match file schema %s", rec.Schema(), w.schema)
	}
	for off := int64(0); off < rec.NumRows(); {
		n := min(rec.NumRows()-off, w.opts.RowGroupRows-w.inGroup)
		w.pending = append(w.pending, rec.NewSlice(off, off+n))
		w.inGroup += n
		off += n
		if w.inGroup == w.opts.RowGroupRows {
			if err := w.flushGroup(); err != nil {
				return err
			}
		}
	}
	return nil
}

// flushGroup writes the gathered rows as one row group.
func (w *FileWriter) flushGroup() error {
	if w.inGroup == 0 {
		return nil
	}
	defer func() {
		for _, r := range w.pending {
			r.Release()
		}
		w.pending, w.inGroup = w.pending[:0], 0
	}()
	g := RowGroupMeta{Rows: w.inGroup, MinCreateTS: math.MaxUint64}
	for _, r := range w.pending {
		for _, ts := range r.Column(w.tsIdx).(*array.Int64).Int64Values() {
			g.MinCreateTS = min(g.MinCreateTS, uint64(ts))
			g.MaxCreateTS = max(g.MaxCreateTS, uint64(ts))
		}
	}
	if err := w.fw.NewRowGroupChecked(); err != nil {
		return fmt.Errorf("lake: start row group: %w", err)
	}
	chunks := make([]arrow.Array, len(w.pending))
	for c := range w.schema.NumFields() {
		for i, r := range w.pending {
			chunks[i] = r.Column(c)
		}
		col := arrow.NewChunked(w.schema.Field(c).Type, chunks)
		err := w.fw.WriteColumnChunked(col, 0, w.inGroup)
		col.Release()
		if err != nil {
			return fmt.Errorf("lake: write column %s: %w", w.schema.Field(c).Name, err)
		}
	}
	w.groups = append(w.groups, g)
	return nil
}

// Close writes the last row group, finishes the file and returns its row
// groups.
func (w *FileWriter) Close() ([]RowGroupMeta, error) {
	if w.closed {
		return w.groups, nil
	}
	w.closed = true
	if err := w.flushGroup(); err != nil {
		w.fw.Close()
		return nil, err
	}
	if err := w.fw.Close(); err != nil {
		return nil, fmt.Errorf("lake: finish parquet file: %w", err)
	}
	return w.groups, nil
}

// File reads a Retina Parquet file.
type File struct {
	src    parquet.ReaderAtSeeker
	pf     *file.Reader
	fr     *pqarrow.FileReader
	schema *arrow.Schema // table columns, without create_ts
	tsIdx  int
	added  []arrow.Field // columns the table gained after the file was written (Widen)
	groups []RowGroupMeta
	mem    memory.Allocator
}

// OpenFile reads the footer of a Retina file and its row-group statistics.
// The file's tail is fetched in one read: the footer, its length, and the
// offset indexes written before it, which point reads use.
func OpenFile(r parquet.ReaderAtSeeker, mem memory.Allocator) (*File, error) {
	tr, err := newTailReader(r)
	if err != nil {
		return nil, err
	}
	return openTail(tr, mem)
}

// openTail opens a file through its tail reader, with the footer already
// parsed if opts say so.
func openTail(r *tailReader, mem memory.Allocator, opts ...file.ReadOption) (*File, error) {
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	pf, err := file.NewParquetReader(r, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{BatchSize: 1 << 16}, mem)
	if err != nil {
		pf.Close()
		return nil, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	full, err := fr.Schema()
	if err != nil {
		pf.Close()
		return nil, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	n := full.NumFields()
	if n == 0 || full.Field(n-1).Name != CreateTSColumn {
		pf.Close()
		return nil, fmt.Errorf("%w: no %s column", ErrBadFile, CreateTSColumn)
	}
	f := &File{src: r, pf: pf, fr: fr, schema: arrow.NewSchema(plainFields(full.Fields()[:n-1]), nil), tsIdx: n - 1, mem: mem}
	md := pf.MetaData()
	for i := range md.NumRowGroups() {
		rg := md.RowGroup(i)
		g := RowGroupMeta{Rows: rg.NumRows()}
		if rg.NumRows() > 0 {
			cc, err := rg.ColumnChunk(f.tsIdx)
			if err != nil {
				pf.Close()
				return nil, fmt.Errorf("%w: row group %d: %w", ErrBadFile, i, err)
			}
			st, err := cc.Statistics()
			is, ok := st.(*metadata.Int64Statistics)
			if err != nil || !ok || !is.HasMinMax() {
				pf.Close()
				return nil, fmt.Errorf("%w: row group %d has no %s statistics", ErrBadFile, i, CreateTSColumn)
			}
			g.MinCreateTS, g.MaxCreateTS = uint64(is.Min()), uint64(is.Max())
		}
		f.groups = append(f.groups, g)
	}
	return f, nil
}

// Schema is the table's columns (create_ts excluded).
func (f *File) Schema() *arrow.Schema { return f.schema }

// RowGroups lists row counts and create_ts ranges, read from the footer.
func (f *File) RowGroups() []RowGroupMeta { return f.groups }

// Widen makes the file read as a table with the given columns (create_ts
// excluded), of which the file's are the first: a table gains columns at
// its end, and the rows written before read NULL in them.
func (f *File) Widen(table *arrow.Schema) error {
	if table.NumFields() < f.tsIdx {
		return fmt.Errorf("%w: the file has %d columns, the table %d", ErrBadFile, f.tsIdx, table.NumFields())
	}
	for i := range f.tsIdx {
		have, want := f.schema.Field(i), table.Field(i)
		if !strings.EqualFold(have.Name, want.Name) || !arrow.TypeEqual(have.Type, want.Type) {
			return fmt.Errorf("%w: column %d is %s %s in the file, %s %s in the table", ErrBadFile, i, have.Name, have.Type, want.Name, want.Type)
		}
	}
	f.added = slices.Clone(table.Fields()[f.tsIdx:])
	return nil
}

// ReadRowGroup reads the projected table columns (indices into Schema, or
// into the widened table after Widen) of one row group, plus the create_ts
// column as the last column when withCreateTS. Only the chunks of those
// columns are fetched; a column the file does not have reads NULL.
func (f *File) ReadRowGroup(ctx context.Context, rg int, cols []int, withCreateTS bool) (arrow.RecordBatch, error) {
	if rg < 0 || rg >= len(f.groups) {
		return nil, fmt.Errorf("lake: row group %d of %d", rg, len(f.groups))
	}
	idx, missing, err := f.leaves(cols, withCreateTS)
	if err != nil {
		return nil, err
	}
	tbl, err := f.fr.ReadRowGroups(ctx, idx, []int{rg})
	if err != nil {
		return nil, fmt.Errorf("lake: read row group %d: %w", rg, err)
	}
	defer tbl.Release()
	rec, err := tableToRecord(tbl, f.mem)
	if err != nil || !missing {
		return rec, err
	}
	defer rec.Release()
	return f.withAdded(rec, cols, withCreateTS), nil
}

// leaves maps projected table columns to the file's Parquet columns, with
// create_ts last when withCreateTS; missing reports a projected column
// the file does not have (added to the table later).
func (f *File) leaves(cols []int, withCreateTS bool) (idx []int, missing bool, err error) {
	idx = make([]int, 0, len(cols)+1)
	for _, c := range cols {
		switch {
		case c >= 0 && c < f.tsIdx:
			idx = append(idx, c)
		case c >= f.tsIdx && c < f.tsIdx+len(f.added):
			missing = true
		default:
			return nil, false, fmt.Errorf("lake: column %d of %d", c, f.tsIdx+len(f.added))
		}
	}
	if withCreateTS {
		idx = append(idx, f.tsIdx)
	}
	return idx, missing, nil
}

// withAdded is rec (the file's columns among cols, then create_ts) with
// NULL columns where cols names a column the file does not have.
func (f *File) withAdded(rec arrow.RecordBatch, cols []int, withCreateTS bool) arrow.RecordBatch {
	n := int(rec.NumRows())
	var fields []arrow.Field
	var arrs []arrow.Array
	next := 0
	for _, c := range cols {
		if c < f.tsIdx {
			fields, arrs = append(fields, rec.Schema().Field(next)), append(arrs, rec.Column(next))
			next++
			continue
		}
		fd := f.added[c-f.tsIdx]
		fd.Nullable = true
		fields, arrs = append(fields, fd), append(arrs, array.MakeArrayOfNull(f.mem, fd.Type, n))
	}
	if withCreateTS {
		fields, arrs = append(fields, rec.Schema().Field(next)), append(arrs, rec.Column(next))
	}
	out := array.NewRecordBatch(arrow.NewSchema(fields, nil), arrs, int64(n))
	for i, c := range cols {
		if c >= f.tsIdx {
			arrs[i].Release()
		}
	}
	return out
}

// tableToRecord concatenates a table's chunks into one record.
func tableToRecord(tbl arrow.Table, mem memory.Allocator) (arrow.RecordBatch, error) {
	schema := arrow.NewSchema(plainFields(tbl.Schema().Fields()), nil)
	return newRecord(schema, tbl.NumRows(), func(i int) (arrow.Array, error) {
		chunks := tbl.Column(i).Data().Chunks()
		switch len(chunks) {
		case 0:
			return array.MakeArrayOfNull(mem, tbl.Column(i).DataType(), 0), nil
		case 1:
			chunks[0].Retain()
			return chunks[0], nil
		}
		return array.Concatenate(chunks, mem)
	})
}

// newRecord assembles a record of schema from the columns col makes, each
// a reference handed over; if one fails, those made are released.
func newRecord(schema *arrow.Schema, rows int64, col func(i int) (arrow.Array, error)) (arrow.RecordBatch, error) {
	cols := make([]arrow.Array, schema.NumFields())
	defer func() {
		for _, c := range cols {
			if c != nil {
				c.Release()
			}
		}
	}()
	for i := range cols {
		var err error
		if cols[i], err = col(i); err != nil {
			return nil, err
		}
	}
	return array.NewRecordBatch(schema, cols, rows), nil
}

// plainFields drops the field metadata the Parquet reader adds (field ids),
// so schemas read back equal the schemas written.
func plainFields(fs []arrow.Field) []arrow.Field {
	out := make([]arrow.Field, len(fs))
	for i, f := range fs {
		out[i] = arrow.Field{Name: f.Name, Type: f.Type, Nullable: f.Nullable}
	}
	return out
}

// Close releases the file.
func (f *File) Close() error { return f.pf.Close() }
