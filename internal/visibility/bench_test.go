package visibility_test

import (
	"testing"

	"github.com/retinadb/retina/internal/bench"
	"github.com/retinadb/retina/internal/visibility"
)

// BenchmarkDelete: consecutive deletes land in different tiles.
func BenchmarkDelete(b *testing.B) {
	const tiles = 1024
	rows := max(b.N, tiles*visibility.DefaultTileSize)
	rows = (rows + visibility.DefaultTileSize - 1) / visibility.DefaultTileSize * visibility.DefaultTileSize
	g, err := visibility.NewRowGroup(rows)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		if err := g.Delete(bench.TileRoundRobin(i, rows, visibility.DefaultTileSize), uint64(i+1)); err != nil {
			b.Fatal(err)
		}
	}
}

func benchmarkBitmap(b *testing.B, deleted, pending int) {
	const tiles = 256
	g, ts, err := bench.BitmapFixture(tiles*visibility.DefaultTileSize, visibility.DefaultTileSize, deleted, pending, 1)
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]uint64, g.BitmapWords())
	b.ResetTimer()
	for range b.N {
		if err := g.Bitmap(ts, dst); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tiles), "ns/tile")
}

func BenchmarkBitmapCleanSparse(b *testing.B) { benchmarkBitmap(b, 40, 0) }
func BenchmarkBitmapCleanDense(b *testing.B)  { benchmarkBitmap(b, 1024, 0) }
func BenchmarkBitmap64Pending(b *testing.B)   { benchmarkBitmap(b, 40, 64) }

func BenchmarkCollect(b *testing.B) {
	for range b.N {
		b.StopTimer()
		g, ts, err := bench.BitmapFixture(256*visibility.DefaultTileSize, visibility.DefaultTileSize, 0, 40, 1)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		g.Collect(ts)
	}
}
