package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/retinadb/retina/internal/visibility"
)

// VisibilityConfig sizes the visibility benchmark.
type VisibilityConfig struct {
	TileSize   int     // tuples per tile
	Deletes    int     // deletes timed for deletes_per_sec
	DeleteRows int     // row-group size the deletes are spread over
	MemoryRows int     // row-group size for the memory figure
	DeletedPct float64 // share of MemoryRows deleted before GC
	BitmapRows int     // row-group size for the bitmap timings
	Seed       uint64
}

// DefaultVisibilityConfig finishes well under a minute on two cores.
func DefaultVisibilityConfig() VisibilityConfig {
	return VisibilityConfig{
		TileSize:   visibility.DefaultTileSize,
		Deletes:    10_000_000,
		DeleteRows: 40_960_000,
		MemoryRows: 16_777_216,
		DeletedPct: 1,
		BitmapRows: 4096 * 1024,
		Seed:       1,
	}
}

// Visibility measures Delete throughput, Bitmap latency per tile and memory
// per tuple after GC.
func Visibility(ctx context.Context, r *Report, cfg VisibilityConfig) error {
	if cfg.DeleteRows < cfg.Deletes {
		return fmt.Errorf("bench: %d deletes do not fit in %d rows", cfg.Deletes, cfg.DeleteRows)
	}
	r.Set("tile_size", cfg.TileSize)
	steps := []func(context.Context, *Report, VisibilityConfig) error{
		visibilityDeletes, visibilityBitmaps, visibilityMemory,
	}
	for _, step := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := step(ctx, r, cfg); err != nil {
			return err
		}
	}
	return nil
}

// TileRoundRobin maps the i-th delete to a different tile each time, so
// consecutive deletes never share a tile: deletes spread over many tiles.
func TileRoundRobin(i, rows, tileSize int) uint32 {
	tiles := rows / tileSize
	return uint32((i%tiles)*tileSize + i/tiles)
}

func visibilityDeletes(ctx context.Context, r *Report, cfg VisibilityConfig) error {
	run := func() (time.Duration, error) {
		g, err := visibility.NewRowGroup(cfg.DeleteRows, visibility.WithTileSize(cfg.TileSize))
		if err != nil {
			return 0, err
		}
		start := time.Now()
		for i := range cfg.Deletes {
			if err := g.Delete(TileRoundRobin(i, cfg.DeleteRows, cfg.TileSize), uint64(i+1)); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	// The first pass grows the heap from the OS; a replayer runs on a warm heap.
	if _, err := run(); err != nil {
		return err
	}
	runtime.GC()
	if err := ctx.Err(); err != nil {
		return err
	}
	el, err := run()
	if err != nil {
		return err
	}
	rate := float64(cfg.Deletes) / el.Seconds()
	r.Printf("Delete: %d deletes over %d tiles (consecutive deletes in different tiles), 1 goroutine, warm heap: %.1f M/s, %.1f ns each",
		cfg.Deletes, cfg.DeleteRows/cfg.TileSize, rate/1e6, float64(el.Nanoseconds())/float64(cfg.Deletes))
	r.Set("deletes_per_sec", math.Round(rate))
	runtime.GC()
	return nil
}

// timeBitmaps returns the mean Bitmap time per tile at snapshot ts.
func timeBitmaps(g *visibility.RowGroup, ts uint64) (float64, error) {
	dst := make([]uint64, g.BitmapWords())
	tiles := (g.Rows() + g.TileSize() - 1) / g.TileSize()
	iters := 0
	start := time.Now()
	for time.Since(start) < 700*time.Millisecond {
		if err := g.Bitmap(ts, dst); err != nil {
			return 0, err
		}
		iters++
	}
	return float64(time.Since(start).Nanoseconds()) / float64(iters*tiles), nil
}

// BitmapFixture builds a row group where every tile has deletedPerTile
// deletes folded into its base by GC and then pendingPerTile more deletes in
// its chain. It returns the row group and the last timestamp used.
func BitmapFixture(rows, tileSize, deletedPerTile, pendingPerTile int, seed uint64) (*visibility.RowGroup, uint64, error) {
	if deletedPerTile+pendingPerTile > tileSize {
		return nil, 0, fmt.Errorf("bench: %d+%d deletes do not fit a tile of %d", deletedPerTile, pendingPerTile, tileSize)
	}
	g, err := visibility.NewRowGroup(rows, visibility.WithTileSize(tileSize))
	if err != nil {
		return nil, 0, err
	}
	perm := rand.New(rand.NewPCG(seed, 2)).Perm(tileSize)
	tiles := rows / tileSize
	ts := uint64(0)
	for pass, offs := range [][]int{perm[:deletedPerTile], perm[deletedPerTile : deletedPerTile+pendingPerTile]} {
		for t := range tiles {
			for _, off := range offs {
				ts++
				if err := g.Delete(uint32(t*tileSize+off), ts); err != nil {
					return nil, 0, err
				}
			}
		}
		if pass == 0 {
			g.Collect(ts)
		}
	}
	return g, ts, nil
}

func visibilityBitmaps(_ context.Context, r *Report, cfg VisibilityConfig) error {
	tiles := cfg.BitmapRows / cfg.TileSize
	figures := []struct {
		key              string
		deleted, pending int
		what             string
	}{
		{"bitmap_ns_per_tile_clean", cfg.TileSize / 100, 0, "1% deleted, collected (sparse base), no pending entries"},
		{"bitmap_ns_per_tile_clean_dense", cfg.TileSize / 4, 0, "25% deleted, collected (dense base), no pending entries"},
		{"bitmap_ns_per_tile_64pending", cfg.TileSize / 100, 64, "1% deleted and collected, plus 64 pending entries"},
	}
	for _, f := range figures {
		g, ts, err := BitmapFixture(cfg.BitmapRows, cfg.TileSize, f.deleted, f.pending, cfg.Seed)
		if err != nil {
			return err
		}
		ns, err := timeBitmaps(g, ts)
		if err != nil {
			return err
		}
		r.Printf("Bitmap over %d tiles, %s: %.1f ns per tile", tiles, f.what, ns)
		r.Set(f.key, math.Round(ns*10)/10)
	}
	return nil
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func visibilityMemory(_ context.Context, r *Report, cfg VisibilityConfig) error {
	rows := cfg.MemoryRows
	n := int(float64(rows) * cfg.DeletedPct / 100)
	rng := rand.New(rand.NewPCG(cfg.Seed, 3))
	// Distinct random offsets, applied with shuffled timestamps.
	offsets := make(map[uint32]struct{}, n)
	list := make([]uint32, 0, n)
	for len(list) < n {
		o := uint32(rng.IntN(rows))
		if _, dup := offsets[o]; !dup {
			offsets[o] = struct{}{}
			list = append(list, o)
		}
	}
	offsets = nil
	tsOrder := rng.Perm(n)
	before := heapInUse()
	g, err := visibility.NewRowGroup(rows, visibility.WithTileSize(cfg.TileSize))
	if err != nil {
		return err
	}
	for i, o := range list {
		if err := g.Delete(o, uint64(tsOrder[i]+1)); err != nil {
			return err
		}
	}
	pending := g.MemoryBytes()
	st := g.Collect(uint64(n))
	accounted := g.MemoryBytes()
	after := heapInUse()
	runtime.KeepAlive(g)
	runtime.KeepAlive(list) // allocated before the baseline: must not be freed inside it
	runtime.KeepAlive(tsOrder)
	heapBits := float64(after-before) * 8 / float64(rows)
	r.Printf("Memory: %d tuples, %d deleted (%.2f%%); before GC %.2f bits/tuple; after GC %.3f bits/tuple measured on the heap (%.3f accounted by MemoryBytes); GC folded %d entries, retired %d filters",
		rows, n, cfg.DeletedPct, float64(pending)*8/float64(rows), heapBits, float64(accounted)*8/float64(rows), st.Folded, st.RetiredFilters)
	r.Set("bits_per_tuple_after_gc", math.Round(heapBits*1000)/1000)
	r.Set("bits_per_tuple_after_gc_accounted", math.Round(float64(accounted)*8/float64(rows)*1000)/1000)
	return nil
}
