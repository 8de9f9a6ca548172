package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow/decimal128"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/types"
	"github.com/retinadb/retina/internal/writebuffer"
)

// transferColumns is a HyBench transfer-like table of ten columns.
func transferColumns() []catalog.Column {
	return []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "source_id", Type: types.Of(types.Int64)},
		{Name: "target_id", Type: types.Of(types.Int64)},
		{Name: "amount", Type: types.DecimalOf(15, 2)},
		{Name: "type", Type: types.Of(types.String)},
		{Name: "created", Type: types.Of(types.Timestamp)},
		{Name: "note", Type: types.Of(types.String), Nullable: true},
		{Name: "flagged", Type: types.Of(types.Bool)},
		{Name: "day", Type: types.Of(types.Date)},
		{Name: "fee", Type: types.Of(types.Float64), Nullable: true},
	}
}

var transferKinds = []string{"transfer", "payment", "refund", "salary", "loan"}

// transferRow makes one row with primary key id.
func transferRow(rng *rand.Rand, id int64) []any {
	var note any
	if rng.IntN(4) == 0 {
		note = transferKinds[rng.IntN(len(transferKinds))] + " note"
	}
	return []any{
		id, rng.Int64N(1_000_000), rng.Int64N(1_000_000),
		decimal128.FromI64(rng.Int64N(10_000_000)), transferKinds[rng.IntN(len(transferKinds))],
		types.TimestampMicros(1_700_000_000_000_000 + id*1000), note, rng.IntN(50) == 0,
		types.DateDays(19700 + id%365), rng.Float64() * 5,
	}
}

// WriteBufferConfig sizes the write-buffer benchmark.
type WriteBufferConfig struct {
	Rows       int           // rows appended as fast as possible
	Batch      int           // rows per Append call
	SteadyRate int           // rows/s of the steady-state memory phase
	SteadyFor  time.Duration // length of that phase
	Seed       uint64
}

// DefaultWriteBufferConfig appends 3M rows, then 50K rows/s for 4s.
func DefaultWriteBufferConfig() WriteBufferConfig {
	return WriteBufferConfig{Rows: 3_000_000, Batch: 256, SteadyRate: 50_000, SteadyFor: 4 * time.Second, Seed: 1}
}

// benchLake opens a file:// lake and a catalog in a temp dir; closing
// them and removing the dir is the returned func.
func benchLake(ctx context.Context) (dir string, store *lake.Store, cat *catalog.Catalog, closeAll func(), err error) {
	if dir, err = os.MkdirTemp("", "retina-bench-"); err != nil {
		return "", nil, nil, nil, err
	}
	quiet := slog.New(slog.DiscardHandler)
	if store, err = lake.Open(ctx, "file://"+dir+"/lake", lake.Options{Logger: quiet}); err != nil {
		os.RemoveAll(dir)
		return "", nil, nil, nil, err
	}
	if cat, err = catalog.Open(dir + "/catalog"); err != nil {
		store.Close()
		os.RemoveAll(dir)
		return "", nil, nil, nil, err
	}
	return dir, store, cat, func() { cat.Close(); store.Close(); os.RemoveAll(dir) }, nil
}

// WriteBuffer measures rows appended per second into one table's buffer
// while its blocks are flushed to file:// and combined in the background.
func WriteBuffer(ctx context.Context, r *Report, cfg WriteBufferConfig) error {
	_, store, cat, closeAll, err := benchLake(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	cols := transferColumns()
	tb, err := cat.CreateTable(ctx, "transfer", catalog.Schema{Columns: cols, PrimaryKey: []string{"id"}})
	if err != nil {
		return err
	}
	wcols := make([]writebuffer.Column, len(cols))
	for i, c := range cols {
		wcols[i] = writebuffer.Column{Name: c.Name, Type: c.Type, Nullable: c.Nullable}
	}
	// No block cache, as the server runs by default (--block-cache-mib 0):
	// combinations read their blocks back from the lake. As in the server,
	// half the cores may combine at once (one here).
	buf, err := writebuffer.New(writebuffer.Config{TableID: tb.ID, Columns: wcols, Catalog: cat, Lake: store, Logger: slog.New(slog.DiscardHandler),
		Combines: writebuffer.NewCombineLimit(runtime.GOMAXPROCS(0) / 2)})
	if err != nil {
		return err
	}
	// The rows come from a pool of 64Ki made before timing, appended over
	// and over: the pipeline hands the buffer rows it decoded a moment
	// before. Making all of them up front (a gigabyte of boxed values for
	// the default 3M) measured the cache misses and heap of the input as
	// much as the buffer: 1.35-1.38M rows/s against 2.04-2.32M from the
	// pool, same code, same hour.
	rng := rand.New(rand.NewPCG(cfg.Seed, 6))
	rows := make([][]any, min(cfg.Rows, 1<<16))
	for i := range rows {
		rows[i] = transferRow(rng, int64(i))
	}
	ts := uint64(0)
	start := time.Now()
	for done := 0; done < cfg.Rows; {
		at := done % len(rows)
		n := min(cfg.Batch, cfg.Rows-done, len(rows)-at)
		ts++
		if _, err := buf.Append(ctx, ts, rows[at:at+n]); err != nil {
			return err
		}
		done += n
	}
	rate := float64(cfg.Rows) / time.Since(start).Seconds()
	r.Printf("append: %d rows of 10 columns in batches of %d, 1 goroutine, with flush (Parquet to file://) and combination sharing the 2 cores: %.2f M rows/s",
		cfg.Rows, cfg.Batch, rate/1e6)
	r.Set("writebuffer_inserts_per_sec", math.Round(rate))
	if err := buf.Flush(ctx); err != nil {
		return err
	}

	// Steady state: a paced stream, memory sampled every 10ms.
	var sum, peak int64
	samples := 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	perTick := max(cfg.SteadyRate/100, 1)
	end := time.Now().Add(cfg.SteadyFor)
	next := 0
	for time.Now().Before(end) {
		<-tick.C
		ts++
		batch := rows[next%len(rows) : min(next%len(rows)+perTick, len(rows))]
		next += len(batch)
		if _, err := buf.Append(ctx, ts, batch); err != nil {
			return err
		}
		m := buf.Stats().MemoryBytes
		sum, peak, samples = sum+m, max(peak, m), samples+1
	}
	if err := buf.Close(ctx); err != nil {
		return err
	}
	st := buf.Stats()
	r.Printf("steady state at %d rows/s for %s: buffer memory mean %.2f MB, peak %.2f MB; %d blocks flushed, %d files combined in all",
		cfg.SteadyRate, cfg.SteadyFor, float64(sum)/float64(samples)/1e6, float64(peak)/1e6, st.Flushed, st.Combined)
	r.Set("buffer_bytes_per_table", sum/int64(samples))
	r.Set("buffer_bytes_per_table_peak", peak)
	return nil
}

// ReplayConfig sizes the replay benchmark.
type ReplayConfig struct {
	Rows     int           // rows inserted (timed), then updated at random
	Duration time.Duration // update phase
	Buckets  int           // parallel Apply streams
	Batch    int           // ops per Apply call (one transaction each)
	Backends []string
	Seed     uint64
}

// DefaultReplayConfig inserts 1M rows per backend, then updates for 4s.
func DefaultReplayConfig() ReplayConfig {
	return ReplayConfig{Rows: 1_000_000, Duration: 4 * time.Second, Buckets: 4, Batch: 128, Backends: []string{"memory", "pebble"}, Seed: 1}
}

// Replay measures replayed inserts and updates (of uniformly random existing
// keys) through the replayer: write buffer, primary index, visibility.
func Replay(ctx context.Context, r *Report, cfg ReplayConfig) error {
	r.Set("rows", cfg.Rows)
	r.Set("buckets", cfg.Buckets)
	for _, backend := range cfg.Backends {
		if err := replayBackend(ctx, r, cfg, backend); err != nil {
			return fmt.Errorf("%s: %w", backend, err)
		}
	}
	return nil
}

func replayBackend(ctx context.Context, r *Report, cfg ReplayConfig, backend string) error {
	dir, store, cat, closeAll, err := benchLake(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	quiet := slog.New(slog.DiscardHandler)
	idx, err := index.Open(index.Config{Backend: backend, Dir: dir + "/index", Logger: quiet})
	if err != nil {
		return err
	}
	defer idx.Close()
	tb, err := cat.CreateTable(ctx, "transfer", catalog.Schema{Columns: transferColumns(), PrimaryKey: []string{"id"}})
	if err != nil {
		return err
	}
	rp, err := replay.New(replay.Config{ID: 1, Catalog: cat, Index: idx, Lake: store, Logger: quiet})
	if err != nil {
		return err
	}
	defer rp.Close(context.Background())
	var clock atomic.Uint64 // mirror-transaction timestamps
	perBucket := cfg.Rows / cfg.Buckets

	// Inserts: each bucket inserts its keys (id % buckets == bucket).
	ins, err := runReplay(ctx, cfg.Buckets, 0, func(b int, rng *rand.Rand, n int) ([]change.Op, bool) {
		if n >= perBucket {
			return nil, false
		}
		ts := clock.Add(1)
		ops := make([]change.Op, 0, cfg.Batch)
		for i := n; i < min(n+cfg.Batch, perBucket); i++ {
			ops = append(ops, change.Op{TS: ts, Table: tb.ID, Kind: change.Insert, Row: transferRow(rng, int64(i*cfg.Buckets+b))})
		}
		return ops, true
	}, rp)
	if err != nil {
		return err
	}
	r.Printf("%s index: %.0fK inserts/s (%d buckets, %d ops per Apply)", backend, ins/1e3, cfg.Buckets, cfg.Batch)
	r.Set("replay_inserts_per_sec_"+backend, math.Round(ins))

	ups, err := runReplay(ctx, cfg.Buckets, cfg.Duration, func(b int, rng *rand.Rand, _ int) ([]change.Op, bool) {
		ts := clock.Add(1)
		ops := make([]change.Op, cfg.Batch)
		for i := range ops {
			id := int64(rng.IntN(perBucket)*cfg.Buckets + b)
			ops[i] = change.Op{TS: ts, Table: tb.ID, Kind: change.Update, Row: transferRow(rng, id)}
		}
		return ops, true
	}, rp)
	if err != nil {
		return err
	}
	r.Printf("%s index: %.0fK updates/s at uniformly random keys of %d rows", backend, ups/1e3, cfg.Rows)
	r.Set("replay_updates_per_sec_"+backend, math.Round(ups))
	return nil
}

// runReplay runs one goroutine per bucket; next returns the bucket's next
// batch (n = ops it applied so far) or false when done. With d > 0 it stops
// after d. It returns ops per second.
func runReplay(ctx context.Context, buckets int, d time.Duration, next func(b int, rng *rand.Rand, n int) ([]change.Op, bool), rp *replay.Replayer) (float64, error) {
	runCtx := ctx
	if d > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, buckets)
	start := time.Now()
	for b := range buckets {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(b), 9))
			n := 0
			for runCtx.Err() == nil {
				ops, ok := next(b, rng, n)
				if !ok {
					return
				}
				// Every earlier batch counts as committed: its undo records go.
				batch := replay.Batch{Bucket: b, Buckets: buckets, Ops: ops, Stable: ops[0].TS}
				if err := rp.Apply(ctx, batch); err != nil {
					errc <- err
					return
				}
				n += len(ops)
				total.Add(int64(len(ops)))
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return 0, err
	}
	return float64(total.Load()) / el.Seconds(), nil
}
