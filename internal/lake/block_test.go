package lake

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// sameRows fails t unless got holds want's rows, in order, cell by cell.
func sameRows(t *testing.T, got, want []arrow.RecordBatch) {
	t.Helper()
	var gn, wn int64
	for _, r := range got {
		gn += r.NumRows()
	}
	for _, r := range want {
		wn += r.NumRows()
	}
	if gn != wn {
		t.Fatalf("%d rows, want %d", gn, wn)
	}
	for row := range wn {
		g, gi := locate(got, row)
		w, wi := locate(want, row)
		if g.NumCols() != w.NumCols() {
			t.Fatalf("%d columns, want %d", g.NumCols(), w.NumCols())
		}
		for c := range int(w.NumCols()) {
			if !sameCell(g.Column(c), gi, w.Column(c), wi) {
				t.Fatalf("row %d column %s: %v, want %v", row, w.Schema().Field(c).Name, g.Column(c).ValueStr(gi), w.Column(c).ValueStr(wi))
			}
		}
	}
}

// TestBlockRoundTrip: every type with NULLs, several segments, read back
// record by record with every buffer freed.
func TestBlockRoundTrip(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	defer mem.AssertSize(t, 0)
	rng := rand.New(rand.NewPCG(3, 4))
	schema := testSchema()
	want := []arrow.RecordBatch{
		randomRecord(rng, schema, 1000, func(i int) int64 { return int64(7 + i/100) }),
		randomRecord(rng, schema, 1, func(int) int64 { return 20 }),
		randomRecord(rng, schema, 333, func(int) int64 { return 21 }),
	}
	defer releaseAll(want)
	var buf bytes.Buffer
	if err := WriteBlock(&buf, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadBlock(context.Background(), buf.Bytes(), mem)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseAll(got)
	if len(got) != len(want) || !got[0].Schema().Equal(want[0].Schema()) {
		t.Fatalf("%d records of %s, want %d of %s", len(got), got[0].Schema(), len(want), want[0].Schema())
	}
	sameRows(t, got, want)
}

// TestParquetBlocksStillRead: a block flushed as Parquet by an earlier
// version reads as the same rows.
func TestParquetBlocksStillRead(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	want := []arrow.RecordBatch{randomRecord(rng, testSchema(), 900, func(i int) int64 { return int64(i) })}
	defer releaseAll(want)
	data, _ := writeFile(t, want, WriterOptions{RowGroupRows: 900, Codec: "snappy", PlainStrings: true})
	got, err := ReadBlock(context.Background(), data, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseAll(got)
	sameRows(t, got, want)
}

func TestReadBlockRejectsGarbage(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	rec := randomRecord(rng, testSchema(), 50, func(int) int64 { return 1 })
	defer rec.Release()
	var buf bytes.Buffer
	if err := WriteBlock(&buf, []arrow.RecordBatch{rec}); err != nil {
		t.Fatal(err)
	}
	full := buf.Bytes()
	for name, data := range map[string][]byte{
		"empty":              nil,
		"text":               []byte("not a block at all"),
		"truncated":          full[:len(full)/2],
		"parquet magic only": []byte("PAR1xx"),
	} {
		recs, err := ReadBlock(context.Background(), data, nil)
		releaseAll(recs)
		if !errors.Is(err, ErrBadFile) {
			t.Errorf("%s: err %v, want ErrBadFile", name, err)
		}
	}
	noTS := array.NewRecordBatch(arrow.NewSchema(rec.Schema().Fields()[:3], nil), rec.Columns()[:3], rec.NumRows())
	defer noTS.Release()
	if err := WriteBlock(&buf, []arrow.RecordBatch{noTS}); err == nil {
		t.Error("a record without create_ts was written as a block")
	}
}

// TestWidenBlock: columns the table gained read NULL; a block that does
// not match the table's leading columns is refused.
func TestWidenBlock(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	defer mem.AssertSize(t, 0)
	rng := rand.New(rand.NewPCG(9, 10))
	full := testSchema()
	narrow := arrow.NewSchema(full.Fields()[:4], nil)
	rec := randomRecord(rng, narrow, 64, func(i int) int64 { return int64(i) })
	defer rec.Release()

	wide, err := WidenBlock(rec, FileSchema(full), mem)
	if err != nil {
		t.Fatal(err)
	}
	defer wide.Release()
	if !wide.Schema().Equal(FileSchema(full)) {
		t.Fatalf("schema %s, want %s", wide.Schema(), FileSchema(full))
	}
	for c := range 4 {
		for i := range 64 {
			if !sameCell(wide.Column(c), i, rec.Column(c), i) {
				t.Fatalf("column %d row %d changed", c, i)
			}
		}
	}
	for c := 4; c < full.NumFields(); c++ {
		if wide.Column(c).NullN() != 64 {
			t.Fatalf("added column %s has %d NULLs of 64", full.Field(c).Name, wide.Column(c).NullN())
		}
	}
	if got := wide.Column(full.NumFields()).(*array.Int64).Value(63); got != 63 {
		t.Fatalf("create_ts of the last row %d, want 63", got)
	}

	same, err := WidenBlock(rec, FileSchema(narrow), mem)
	if err != nil {
		t.Fatal(err)
	}
	same.Release()
	renamed := arrow.NewSchema(append([]arrow.Field{{Name: "other", Type: full.Field(0).Type, Nullable: true}}, full.Fields()[1:]...), nil)
	if _, err := WidenBlock(rec, FileSchema(renamed), mem); !errors.Is(err, ErrBadFile) {
		t.Fatalf("a block of other columns widened: %v", err)
	}
	if _, err := WidenBlock(wide, FileSchema(narrow), mem); !errors.Is(err, ErrBadFile) {
		t.Fatalf("a block wider than its table narrowed: %v", err)
	}
}

// BenchmarkBlockEncoding compares a block object's encoding with the
// Parquet file a block used to be flushed as (snappy, plain strings).
func BenchmarkBlockEncoding(b *testing.B) {
	rng := rand.New(rand.NewPCG(11, 12))
	recs := []arrow.RecordBatch{randomRecord(rng, testSchema(), 8192, func(i int) int64 { return int64(i / 64) })}
	defer releaseAll(recs)
	b.Run("ipc", func(b *testing.B) {
		var buf bytes.Buffer
		for b.Loop() {
			buf.Reset()
			if err := WriteBlock(&buf, recs); err != nil {
				b.Fatal(err)
			}
			got, err := ReadBlock(context.Background(), buf.Bytes(), nil)
			if err != nil {
				b.Fatal(err)
			}
			releaseAll(got)
		}
		b.ReportMetric(float64(buf.Len()), "bytes")
	})
	b.Run("parquet", func(b *testing.B) {
		var data []byte
		for b.Loop() {
			data, _ = writeFile(b, recs, WriterOptions{RowGroupRows: 8192, Codec: "snappy", PlainStrings: true})
			got, err := ReadBlock(context.Background(), data, nil)
			if err != nil {
				b.Fatal(err)
			}
			releaseAll(got)
		}
		b.ReportMetric(float64(len(data)), "bytes")
	})
}
