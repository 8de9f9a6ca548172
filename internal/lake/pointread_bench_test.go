package lake

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/parquet"
)

// BenchmarkReadRow reads single rows of every column at random positions
// of a one-row-group file of 1M rows (the shape of a combined file): from
// memory (the decoding a point lookup pays), and from a file:// store as a
// point lookup reads it (MappedReaderAt).
func BenchmarkReadRow(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	schema := testSchema()
	rec := randomRecord(rng, schema, 1<<20, func(i int) int64 { return int64(i + 1) })
	defer rec.Release()
	data, _ := writeFile(b, []arrow.RecordBatch{rec}, WriterOptions{})
	cols := make([]int, schema.NumFields())
	for i := range cols {
		cols[i] = i
	}
	ctx := context.Background()
	run := func(b *testing.B, src parquet.ReaderAtSeeker) {
		f, err := OpenFile(src, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		for b.Loop() {
			r, err := f.ReadRow(ctx, rng.Int64N(1<<20), cols)
			if err != nil {
				b.Fatal(err)
			}
			r.Release()
		}
	}
	b.Run("memory", func(b *testing.B) { run(b, bytes.NewReader(data)) })
	b.Run("local", func(b *testing.B) {
		s, err := Open(ctx, "file://"+b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		if err := s.Put(ctx, "f.parquet", data); err != nil {
			b.Fatal(err)
		}
		r, err := s.MappedReaderAt(ctx, "f.parquet")
		if err != nil {
			b.Fatal(err)
		}
		run(b, r)
	})
}
