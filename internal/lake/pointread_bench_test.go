package lake

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
)

// BenchmarkReadRow reads single rows of every column at random positions
// of a one-row-group file of 1M rows (the shape of a combined file), from
// memory: the decoding a point lookup pays.
func BenchmarkReadRow(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	schema := testSchema()
	rec := randomRecord(rng, schema, 1<<20, func(i int) int64 { return int64(i + 1) })
	defer rec.Release()
	data, _ := writeFile(b, []arrow.RecordBatch{rec}, WriterOptions{})
	f, err := OpenFile(bytes.NewReader(data), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	cols := make([]int, schema.NumFields())
	for i := range cols {
		cols[i] = i
	}
	ctx := context.Background()
	for b.Loop() {
		r, err := f.ReadRow(ctx, rng.Int64N(1<<20), cols)
		if err != nil {
			b.Fatal(err)
		}
		r.Release()
	}
}
