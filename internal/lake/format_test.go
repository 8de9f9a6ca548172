package lake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/retinadb/retina/internal/types"
	"golang.org/x/sync/errgroup"
)

// testColumns covers every supported type.
var testColumns = []struct {
	name string
	typ  types.Type
}{
	{"i8", types.Of(types.Int8)}, {"i16", types.Of(types.Int16)}, {"i32", types.Of(types.Int32)},
	{"i64", types.Of(types.Int64)}, {"f32", types.Of(types.Float32)}, {"f64", types.Of(types.Float64)},
	{"dec", types.DecimalOf(18, 3)}, {"dec38", types.DecimalOf(38, 10)}, {"s", types.Of(types.String)},
	{"b", types.Of(types.Bytes)}, {"ok", types.Of(types.Bool)}, {"d", types.Of(types.Date)},
	{"ts", types.Of(types.Timestamp)}, {"tstz", types.Of(types.TimestampTZ)},
}

func testSchema() *arrow.Schema {
	fields := make([]arrow.Field, len(testColumns))
	for i, c := range testColumns {
		fields[i] = arrow.Field{Name: c.name, Type: c.typ.ArrowType(), Nullable: true}
	}
	return arrow.NewSchema(fields, nil)
}

// randomRecord builds n rows with edge values and NULLs everywhere; create
// timestamps come from ts(i).
func randomRecord(rng *rand.Rand, schema *arrow.Schema, n int, ts func(int) int64) arrow.RecordBatch {
	b := array.NewRecordBuilder(memory.DefaultAllocator, FileSchema(schema))
	defer b.Release()
	pick := func(edges ...int64) int64 {
		if rng.IntN(3) == 0 {
			return edges[rng.IntN(len(edges))]
		}
		return rng.Int64()
	}
	for i := range n {
		for c := range schema.NumFields() {
			fb := b.Field(c)
			if rng.IntN(7) == 0 {
				fb.AppendNull()
				continue
			}
			switch fb := fb.(type) {
			case *array.Int8Builder:
				fb.Append(int8(pick(math.MinInt8, math.MaxInt8, 0)))
			case *array.Int16Builder:
				fb.Append(int16(pick(math.MinInt16, math.MaxInt16, 0)))
			case *array.Int32Builder:
				fb.Append(int32(pick(math.MinInt32, math.MaxInt32, 0)))
			case *array.Int64Builder:
				fb.Append(pick(math.MinInt64, math.MaxInt64, 0))
			case *array.Float32Builder:
				fb.Append([]float32{0, -1.5, math.MaxFloat32, float32(math.Inf(-1)), math.SmallestNonzeroFloat32, rng.Float32()}[rng.IntN(6)])
			case *array.Float64Builder:
				fb.Append([]float64{0, -1.5, math.MaxFloat64, math.Inf(1), math.SmallestNonzeroFloat64, rng.NormFloat64()}[rng.IntN(6)])
			case *array.Decimal128Builder:
				p := fb.Type().(*arrow.Decimal128Type).Precision
				limit := decimal128.GetMaxValue(p)
				fb.Append([]decimal128.Num{limit, limit.Negate(), decimal128.FromI64(0), decimal128.FromI64(rng.Int64N(1e12) - 5e11)}[rng.IntN(4)])
			case *array.StringBuilder:
				fb.Append([]string{"", "héllo", "a\x00b", string(bytes.Repeat([]byte("x"), 300)), "dup"}[rng.IntN(5)])
			case *array.BinaryBuilder:
				fb.Append([][]byte{{}, {0, 1, 255}, []byte("bin")}[rng.IntN(3)])
			case *array.BooleanBuilder:
				fb.Append(rng.IntN(2) == 0)
			case *array.Date32Builder:
				fb.Append(arrow.Date32(int32(pick(-719162, 2932896, 0))))
			case *array.TimestampBuilder:
				fb.Append(arrow.Timestamp(pick(-62135596800000000, 253402300799999999, 0)))
			}
		}
		b.Field(schema.NumFields()).(*array.Int64Builder).Append(ts(i))
	}
	return b.NewRecordBatch()
}

func writeFile(t testing.TB, recs []arrow.RecordBatch, opts WriterOptions) ([]byte, []RowGroupMeta) {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewFileWriter(&buf, recs[0].Schema(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	groups, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), groups
}

// randomFile writes one file of rows random rows of testSchema, created at
// 1, 2, ...; it returns the rows (released when the test ends) and the file.
func randomFile(t testing.TB, rng *rand.Rand, rows int, opts WriterOptions) (arrow.RecordBatch, []byte) {
	t.Helper()
	rec := randomRecord(rng, testSchema(), rows, func(i int) int64 { return int64(i + 1) })
	t.Cleanup(rec.Release)
	data, _ := writeFile(t, []arrow.RecordBatch{rec}, opts)
	return rec, data
}

// TestRoundTripEveryType writes records of every type with NULLs through a
// store and reads them back by row group, on every backend.
func TestRoundTripEveryType(t *testing.T) {
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, 2))
			schema := testSchema()
			recs := []arrow.RecordBatch{
				randomRecord(rng, schema, 700, func(i int) int64 { return int64(100 + i) }),
				randomRecord(rng, schema, 650, func(i int) int64 { return int64(5000 - i) }),
			}
			data, groups := writeFile(t, recs, WriterOptions{RowGroupRows: 500})
			_, f := putAndOpen(t, openTestStore(t, bc.url(t), RetryPolicy{}), "t/f1.parquet", data)
			if !f.Schema().Equal(schema) {
				t.Fatalf("schema %s, want %s", f.Schema(), schema)
			}
			// 1350 rows in groups of 500: 500, 500, 350, with exact stats.
			want := expectedGroups(recs, 500)
			if len(f.RowGroups()) != 3 || len(groups) != 3 {
				t.Fatalf("row groups: footer %v, writer %v", f.RowGroups(), groups)
			}
			for i := range want {
				if f.RowGroups()[i] != want[i] || groups[i] != want[i] {
					t.Fatalf("row group %d: footer %+v, writer %+v, want %+v", i, f.RowGroups()[i], groups[i], want[i])
				}
			}
			all := make([]int, schema.NumFields())
			for i := range all {
				all[i] = i
			}
			var row int64
			for g := range f.RowGroups() {
				got, err := f.ReadRowGroup(ctx, g, all, true)
				if err != nil {
					t.Fatal(err)
				}
				for j := range got.NumRows() {
					src, srcRow := locate(recs, row+j)
					for c := range int(got.NumCols()) {
						if !sameCell(got.Column(c), int(j), src.Column(c), srcRow) {
							t.Fatalf("group %d row %d column %s: %v, want %v", g, j, got.ColumnName(c),
								got.Column(c).ValueStr(int(j)), src.Column(c).ValueStr(srcRow))
						}
					}
				}
				row += got.NumRows()
				got.Release()
			}
			// Projection: two columns, no create_ts.
			proj, err := f.ReadRowGroup(ctx, 2, []int{3, 8}, false)
			if err != nil {
				t.Fatal(err)
			}
			if proj.NumCols() != 2 || proj.ColumnName(1) != "s" || proj.NumRows() != 350 {
				t.Fatalf("projection: %s", proj.Schema())
			}
			proj.Release()
		})
	}
}

func expectedGroups(recs []arrow.RecordBatch, size int64) []RowGroupMeta {
	var ts []int64
	for _, r := range recs {
		ts = append(ts, r.Column(int(r.NumCols())-1).(*array.Int64).Int64Values()...)
	}
	var out []RowGroupMeta
	for start := int64(0); start < int64(len(ts)); start += size {
		g := RowGroupMeta{MinCreateTS: math.MaxUint64}
		for _, v := range ts[start:min(start+size, int64(len(ts)))] {
			g.Rows++
			g.MinCreateTS = min(g.MinCreateTS, uint64(v))
			g.MaxCreateTS = max(g.MaxCreateTS, uint64(v))
		}
		out = append(out, g)
	}
	return out
}

func locate(recs []arrow.RecordBatch, row int64) (arrow.RecordBatch, int) {
	for _, r := range recs {
		if row < r.NumRows() {
			return r, int(row)
		}
		row -= r.NumRows()
	}
	panic("row out of range")
}

func sameCell(a arrow.Array, i int, b arrow.Array, j int) bool {
	if a.IsNull(i) || b.IsNull(j) {
		return a.IsNull(i) == b.IsNull(j)
	}
	return a.ValueStr(i) == b.ValueStr(j)
}

// TestReaderFetchesOnlyWhatItNeeds: opening reads the footer, and reading
// one narrow column of one row group fetches far less than the file.
func TestReaderFetchesOnlyWhatItNeeds(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 3))
	schema := testSchema()
	rec := randomRecord(rng, schema, 20000, func(i int) int64 { return int64(i + 1) })
	data, _ := writeFile(t, []arrow.RecordBatch{rec}, WriterOptions{RowGroupRows: 5000})
	r, f := openStored(t, data)
	afterOpen := r.Reads()
	got, err := f.ReadRowGroup(ctx, 1, []int{0}, false)
	if err != nil {
		t.Fatal(err)
	}
	got.Release()
	if afterOpen > 3 || r.Reads()-afterOpen > 4 {
		t.Fatalf("open took %d range reads, one int8 column chunk %d more", afterOpen, r.Reads()-afterOpen)
	}
}

func TestWriterRejectsBadSchemas(t *testing.T) {
	var buf bytes.Buffer
	if _, err := NewFileWriter(&buf, testSchema(), WriterOptions{}); err == nil {
		t.Fatal("schema without create_ts accepted")
	}
	if _, err := NewFileWriter(&buf, FileSchema(testSchema()), WriterOptions{Codec: "brotli9"}); err == nil {
		t.Fatal("unknown codec accepted")
	}
	if _, err := OpenFile(bytes.NewReader([]byte("not parquet at all")), nil); err == nil {
		t.Fatal("garbage opened as a file")
	}
}

// TestReadRowEqualsItsRowGroup reads single rows of every type, NULLs
// included, at page and row-group edges and at random, and compares them
// with the row groups read whole; a projection reads only its columns.
func TestReadRowEqualsItsRowGroup(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 8))
	schema := testSchema()
	rec, data := randomFile(t, rng, 30000, WriterOptions{RowGroupRows: 12000})
	_, f := openStored(t, data)
	all := make([]int, schema.NumFields())
	for i := range all {
		all[i] = i
	}
	rows := []int64{0, 1, 11999, 12000, 12001, 23999, 24000, 29999}
	for range 40 {
		rows = append(rows, rng.Int64N(30000))
	}
	for _, row := range rows {
		for _, cols := range [][]int{all, {8, 3}, {}} {
			got, err := f.ReadRow(ctx, row, cols)
			if err != nil {
				t.Fatalf("row %d: %v", row, err)
			}
			if got.NumRows() != 1 || int(got.NumCols()) != len(cols) {
				t.Fatalf("row %d columns %v: %d rows, %d columns", row, cols, got.NumRows(), got.NumCols())
			}
			for i, c := range cols {
				if !sameCell(got.Column(i), 0, rec.Column(c), int(row)) {
					t.Fatalf("row %d column %s: %v, want %v", row, got.ColumnName(i), got.Column(i).ValueStr(0), rec.Column(c).ValueStr(int(row)))
				}
			}
			got.Release()
		}
	}
	for _, bad := range []int64{-1, 30000} {
		if _, err := f.ReadRow(ctx, bad, all); err == nil {
			t.Fatalf("row %d of 30000 read", bad)
		}
	}
}

// TestReadRowsOutliveLaterReads: a point read decodes into buffers that
// later reads reuse, so every row it returns must be a copy. Rows read by
// several goroutines at once are all kept, and checked only after the
// last read.
func TestReadRowsOutliveLaterReads(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(6, 2))
	schema := testSchema()
	rec, data := randomFile(t, rng, 20000, WriterOptions{})
	_, f := openStored(t, data)
	all := make([]int, schema.NumFields())
	for i := range all {
		all[i] = i
	}
	const readers, each = 4, 50
	got := make([][]arrow.RecordBatch, readers)
	rows := make([][]int64, readers)
	var g errgroup.Group
	for r := range readers {
		for range each {
			rows[r] = append(rows[r], rng.Int64N(20000))
		}
		g.Go(func() error {
			for _, row := range rows[r] {
				b, err := f.ReadRow(ctx, row, all)
				if err != nil {
					return fmt.Errorf("row %d: %w", row, err)
				}
				got[r] = append(got[r], b)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for r := range readers {
		for i, b := range got[r] {
			row := int(rows[r][i])
			for c := range all {
				if !sameCell(b.Column(c), 0, rec.Column(c), row) {
					t.Fatalf("row %d column %s, checked after later reads: %v, want %v", row, b.ColumnName(c), b.Column(c).ValueStr(0), rec.Column(c).ValueStr(row))
				}
			}
			b.Release()
		}
	}
}

// TestReadRowFetchesOnlyItsPages: one row of a large row group fetches a
// small part of the column chunk holding it (the offset index finds its
// page), not the chunk.
func TestReadRowFetchesOnlyItsPages(t *testing.T) {
	ctx := context.Background()
	b := array.NewRecordBuilder(memory.DefaultAllocator, FileSchema(arrow.NewSchema([]arrow.Field{{Name: "id", Type: arrow.PrimitiveTypes.Int64}}, nil)))
	defer b.Release()
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 1 << 20 {
		b.Field(0).(*array.Int64Builder).Append(rng.Int64()) // incompressible
		b.Field(1).(*array.Int64Builder).Append(int64(i))
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	data, _ := writeFile(t, []arrow.RecordBatch{rec}, WriterOptions{})
	r, f := openStored(t, data)
	before, reads := r.BytesRead(), r.Reads()
	got, err := f.ReadRow(ctx, 700_000, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	defer got.Release()
	if v := got.Column(0).(*array.Int64).Value(0); v != rec.Column(0).(*array.Int64).Value(700_000) {
		t.Fatalf("row 700000: %d", v)
	}
	chunk := int64(8 << 20) // the column chunk: 1M incompressible int64
	if read := r.BytesRead() - before; read > chunk/16 {
		t.Fatalf("one row fetched %d bytes of a %d-byte column chunk", read, chunk)
	}
	// Opening read the file's tail, offset indexes included: the row
	// takes one request, for its page, however many readers look at the
	// offset indexes.
	if reads > 1 {
		t.Fatalf("opening the file took %d range reads", reads)
	}
	if n := r.Reads() - reads; n > 1 {
		t.Fatalf("one row of one column took %d range reads", n)
	}
}

// TestReadRowWithoutOffsetIndex: a file written before files carried an
// offset index (here by the Parquet writer's defaults: no page index, 1 MiB
// pages) reads single rows too, page header by page header.
func TestReadRowWithoutOffsetIndex(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 9))
	schema := testSchema()
	rec := randomRecord(rng, schema, 20000, func(i int) int64 { return int64(i + 1) })
	defer rec.Release()
	var buf bytes.Buffer
	props := parquet.NewWriterProperties(parquet.WithMaxRowGroupLength(8000), parquet.WithStats(true))
	w, err := pqarrow.NewFileWriter(rec.Schema(), &buf, props, pqarrow.NewArrowWriterProperties(pqarrow.WithStoreSchema()))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, f := openStored(t, buf.Bytes())
	for _, row := range []int64{0, 7999, 8000, 15001, 19999} {
		got, err := f.ReadRow(ctx, row, []int{0, 8, 13})
		if err != nil {
			t.Fatalf("row %d: %v", row, err)
		}
		for i, c := range []int{0, 8, 13} {
			if !sameCell(got.Column(i), 0, rec.Column(c), int(row)) {
				t.Fatalf("row %d column %s: %v, want %v", row, got.ColumnName(i), got.Column(i).ValueStr(0), rec.Column(c).ValueStr(int(row)))
			}
		}
		got.Release()
	}
}

// openStored puts a file's bytes in a mem:// store and opens it; the
// reader counts the requests made.
func openStored(t *testing.T, data []byte) (*ObjectReader, *File) {
	t.Helper()
	return putAndOpen(t, openTestStore(t, "mem://", RetryPolicy{}), "f", data)
}

// putAndOpen stores data under key and opens it as a Parquet file, closed
// when the test ends.
func putAndOpen(t *testing.T, s *Store, key string, data []byte) (*ObjectReader, *File) {
	t.Helper()
	ctx := context.Background()
	if err := s.Put(ctx, key, data); err != nil {
		t.Fatal(err)
	}
	r, err := s.ReaderAt(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return r, f
}

// TestLocalReadsComeFromTheMapping: a local file is read where it is
// mapped, once for every read: a point read makes no open, read or close of
// the file (each a system call, which from inside a DuckDB callback may wait
// for the scheduler). Reads go on after the file's name is gone; the store's
// own delete unmaps it, and a write of the key is read anew.
func TestLocalReadsComeFromTheMapping(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(4, 2))
	schema := testSchema()
	rec, data := randomFile(t, rng, 20000, WriterOptions{})
	dir := t.TempDir()
	s := openTestStore(t, "file://"+dir, RetryPolicy{})
	if err := s.Put(ctx, "f.parquet", data); err != nil {
		t.Fatal(err)
	}
	r, err := s.MappedReaderAt(ctx, "f.parquet")
	if err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all := make([]int, schema.NumFields()-1) // the table columns, not create_ts
	for i := range all {
		all[i] = i
	}
	check := func(row int64) {
		t.Helper()
		got, err := f.ReadRow(ctx, row, all)
		if err != nil {
			t.Fatal(err)
		}
		defer got.Release()
		for i, c := range all {
			if !sameCell(got.Column(i), 0, rec.Column(c), int(row)) {
				t.Fatalf("row %d column %s: %v, want %v", row, got.ColumnName(i), got.Column(i).ValueStr(0), rec.Column(c).ValueStr(int(row)))
			}
		}
	}
	check(12345)
	if n := s.MappedObjects(); n != 1 {
		t.Fatalf("%d objects mapped after a point read, want 1", n)
	}
	if err := os.Remove(filepath.Join(dir, "f.parquet")); err != nil {
		t.Fatal(err)
	}
	for _, row := range []int64{0, 7, 19999, 12345} {
		check(row) // from the mapping: the name is gone
	}
	if err := s.Delete(ctx, "f.parquet"); err != nil {
		t.Fatal(err)
	}
	if n := s.MappedObjects(); n != 0 {
		t.Fatalf("%d objects mapped after the delete, want 0", n)
	}
	if _, err := s.MappedReaderAt(ctx, "f.parquet"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("reader of a deleted object: %v, want ErrNotFound", err)
	}
	// A key written again is read as written, not as it was mapped.
	for _, content := range []string{"first version", "the second, longer version"} {
		if err := s.Put(ctx, "k", []byte(content)); err != nil {
			t.Fatal(err)
		}
		r, err := s.MappedReaderAt(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, r.Size())
		if _, err := r.ReadAt(got, 0); err != nil || string(got) != content {
			t.Fatalf("read %q (%v), want %q", got, err, content)
		}
	}
}
