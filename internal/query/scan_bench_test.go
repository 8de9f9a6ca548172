package query_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/decimal128"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// BenchmarkScanWriteBuffer is an aggregate over rows in the write buffer
// (virtual files, read by retina_scan), with and without deletes among
// them.
func BenchmarkScanWriteBuffer(b *testing.B) {
	n := servertest.OpenNodeTuned(b, func(c *server.NodeConfig) { c.BlockRows, c.FileBlocks = 8192, 128 })
	ctx := context.Background()
	tb := servertest.CreateTable(b, n, "t", []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "amount", Type: types.DecimalOf(15, 2)},
		{Name: "kind", Type: types.Of(types.String)},
		{Name: "fee", Type: types.Of(types.Float64), Nullable: true},
		{Name: "flagged", Type: types.Of(types.Bool)},
	}, "id")
	const rows = 400_000
	for start := 0; start < rows; start += 10_000 {
		ops := make([]change.Op, 0, 10_000)
		for i := start; i < start+10_000; i++ {
			ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert,
				Row: []any{int64(i), decimal128.FromI64(int64(i % 100000)), fmt.Sprintf("k%d", i%4), float64(i%1000) / 10, i%10 == 0}})
		}
		apply(b, n, ops...)
	}
	s, err := n.Engine.NewSession(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const q = "SELECT kind, count(*), sum(amount), avg(fee) FROM t WHERE NOT flagged GROUP BY kind ORDER BY kind"
	b.Run("static", func(b *testing.B) {
		for b.Loop() {
			queryAll(b, s, q)
		}
	})
	var ops []change.Op
	for i := 0; i < rows; i += 100 { // 1% deleted
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{int64(i)}})
	}
	apply(b, n, ops...)
	b.Run("deletes", func(b *testing.B) {
		for b.Loop() {
			queryAll(b, s, q)
		}
	})
}
