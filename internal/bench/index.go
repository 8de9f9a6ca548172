package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/types"
)

// IndexConfig sizes the index benchmark.
type IndexConfig struct {
	Rows     int           // live keys loaded before timing
	Duration time.Duration // per timed figure
	Workers  int           // goroutines, each owning a bucket of keys
	Batch    int           // updates or lookups per batch
	Backends []string      // "pebble", "memory"
}

// DefaultIndexConfig runs 10M keys on both backends in under a minute.
func DefaultIndexConfig() IndexConfig {
	return IndexConfig{Rows: 10_000_000, Duration: 3 * time.Second, Workers: 4, Batch: 512, Backends: []string{"memory", "pebble"}}
}

const benchIndexID = 1

func defineBenchIndex(s *index.Store) error {
	return s.Define(index.Def{ID: benchIndexID, Name: "pk", Columns: []types.Type{types.Of(types.Int64)}, Unique: true})
}

// Index measures updates (Lookup + Tombstone + Put, the replayer's unit of
// work on a key) and lookups at uniformly random keys over Rows live keys.
func Index(ctx context.Context, r *Report, cfg IndexConfig) error {
	r.Set("rows", cfg.Rows)
	r.Set("workers", cfg.Workers)
	r.Set("batch", cfg.Batch)
	for _, backend := range cfg.Backends {
		if err := indexBackend(ctx, r, cfg, backend); err != nil {
			return fmt.Errorf("%s: %w", backend, err)
		}
	}
	return nil
}

func indexBackend(ctx context.Context, r *Report, cfg IndexConfig, backend string) error {
	dir, err := os.MkdirTemp("", "retina-bench-index-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.DiscardHandler)
	// As the server runs it (no write-ahead log: a crash rebuilds the index
	// from the files), or with every batch fsynced in the log.
	open := func(asServer bool) (*index.Store, error) {
		s, err := index.Open(index.Config{Backend: backend, Dir: dir, NoWAL: asServer, Logger: quiet})
		if err != nil {
			return nil, err
		}
		return s, defineBenchIndex(s)
	}
	heapBefore := heapInUse()
	s, err := open(true)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := loadKeys(ctx, s, cfg.Rows); err != nil {
		s.Close()
		return err
	}
	if err := s.Sync(); err != nil {
		s.Close()
		return err
	}
	r.Printf("%s: loaded %d keys in %.1fs", backend, cfg.Rows, time.Since(start).Seconds())
	if backend == "memory" {
		perKey := float64(heapInUse()-heapBefore) / float64(cfg.Rows)
		r.Printf("memory: %.1f bytes per live key (heap)", perKey)
		r.Set("memory_bytes_per_key", math.Round(perKey*10)/10)
	}
	defer func() { s.Close() }()

	clock := newBenchClock(cfg.Workers)
	clock.next.Store(1) // the load wrote at 1
	// As the server does on every sink tick (Node.Collect), the horizon
	// follows the low watermark. Without it the memory backend would keep
	// every version of a key until a purge, which the server never lets
	// it do.
	stopHorizon := followHorizon(s, clock, time.Second)
	defer stopHorizon()

	// An update as the replayer does it: one checked Replace per key, which
	// looks the key up and writes the new version in one step.
	muts := make([][]index.Mutation, cfg.Workers)
	updates := func() (float64, error) {
		return runBuckets(ctx, cfg, clock, func(w int, rng *rand.Rand, ts uint64, keys []index.Key, _ []index.Found) (int, error) {
			if err := fillKeys(s, rng, w, cfg, keys); err != nil {
				return 0, err
			}
			ms := muts[w][:0]
			for _, k := range keys {
				ms = append(ms, index.Mutation{Key: k, TS: ts, Kind: index.Replace, RowID: ts})
			}
			muts[w] = ms
			failed, err := s.Mutate(ctx, ms)
			if failed > 0 {
				return 0, fmt.Errorf("%d updates of live keys failed: %v", failed, firstErr(ms))
			}
			return len(keys), err
		})
	}
	ups, err := updates()
	if err != nil {
		return err
	}
	r.Printf("%s: %.0fK updates/s (checked replace: lookup + new version in one call, %d goroutines, batches of %d)", backend, ups/1e3, cfg.Workers, cfg.Batch)
	r.Set(backend+"_updates_per_sec", math.Round(ups))

	// The same work as three separate calls: LookupBatch, then a batch of
	// tombstones and puts.
	ups3, err := runBuckets(ctx, cfg, clock, func(w int, rng *rand.Rand, ts uint64, keys []index.Key, found []index.Found) (int, error) {
		if err := fillKeys(s, rng, w, cfg, keys); err != nil {
			return 0, err
		}
		if err := s.LookupBatch(ctx, keys, ts, found); err != nil {
			return 0, err
		}
		var b index.Batch
		for i, k := range keys {
			if !found[i].OK {
				return 0, fmt.Errorf("key %x not found at %d", k.Bytes(), ts)
			}
			b.Tombstone(k, ts, 0)
			b.Put(k, ts, ts)
		}
		return len(keys), s.Apply(ctx, &b)
	})
	if err != nil {
		return err
	}
	r.Printf("%s: %.0fK updates/s as LookupBatch + Apply(tombstone, put)", backend, ups3/1e3)
	r.Set(backend+"_updates_per_sec_3calls", math.Round(ups3))

	lookups, err := runBuckets(ctx, cfg, clock, func(w int, rng *rand.Rand, ts uint64, keys []index.Key, found []index.Found) (int, error) {
		if err := fillKeys(s, rng, w, cfg, keys); err != nil {
			return 0, err
		}
		return len(keys), s.LookupBatch(ctx, keys, ts, found)
	})
	if err != nil {
		return err
	}
	r.Printf("%s: %.0fK lookups/s", backend, lookups/1e3)
	r.Set(backend+"_lookups_per_sec", math.Round(lookups))
	if backend == "pebble" {
		// The server runs Pebble without a log (a crash rebuilds the index
		// from the replay checkpoint's files); this is what a synced log
		// would cost.
		if err := s.Close(); err != nil {
			return err
		}
		if s, err = open(false); err != nil {
			return err
		}
		synced, err := updates()
		if err != nil {
			return err
		}
		r.Printf("pebble: %.0fK updates/s with every batch fsynced", synced/1e3)
		r.Set("pebble_synced_updates_per_sec", math.Round(synced))
	}
	return nil
}

// loadKeys puts keys 0..rows-1 at timestamp 1, row id = key.
func loadKeys(ctx context.Context, s *index.Store, rows int) error {
	var b index.Batch
	for i := range rows {
		k, err := s.Key(benchIndexID, int64(i))
		if err != nil {
			return err
		}
		b.Put(k, 1, uint64(i))
		if b.Len() == 10_000 || i == rows-1 {
			if err := s.Apply(ctx, &b); err != nil {
				return err
			}
			b.Reset()
		}
	}
	return nil
}

// fillKeys draws uniformly random keys of worker w's bucket (key % workers).
func fillKeys(s *index.Store, rng *rand.Rand, w int, cfg IndexConfig, keys []index.Key) error {
	for i := range keys {
		k := rng.IntN(cfg.Rows/cfg.Workers)*cfg.Workers + w
		var err error
		if keys[i], err = s.AppendKey(keys[i].Bytes(), benchIndexID, int64(k)); err != nil {
			return err
		}
	}
	return nil
}

// runBuckets runs one goroutine per bucket for cfg.Duration; each batch takes
// the next timestamp from clock, as mirror transactions do. It returns units
// per second.
func runBuckets(ctx context.Context, cfg IndexConfig, clock *benchClock, batch func(w int, rng *rand.Rand, ts uint64, keys []index.Key, found []index.Found) (int, error)) (float64, error) {
	type worker struct {
		rng   *rand.Rand
		keys  []index.Key
		found []index.Found
	}
	ws := make([]worker, cfg.Workers)
	for w := range ws {
		ws[w] = worker{rng: rand.New(rand.NewPCG(uint64(w), 77)), keys: make([]index.Key, cfg.Batch), found: make([]index.Found, cfg.Batch)}
	}
	return runWorkers(ctx, cfg.Workers, cfg.Duration, func(_ context.Context, w int) (int, error) {
		st := &ws[w]
		defer clock.end(w)
		return batch(w, st.rng, clock.begin(w), st.keys, st.found)
	})
}

// benchClock hands out the batches' timestamps, as mirror transactions
// get theirs, and knows their low watermark.
type benchClock struct {
	next     atomic.Uint64
	inFlight []atomic.Uint64 // per worker: its batch's timestamp, 0 when idle
}

func newBenchClock(workers int) *benchClock {
	return &benchClock{inFlight: make([]atomic.Uint64, workers)}
}

// begin takes worker w's next timestamp. The worker claims a timestamp no
// greater than it before taking it, so lwm never passes it.
func (c *benchClock) begin(w int) uint64 {
	c.inFlight[w].Store(c.next.Load() + 1)
	ts := c.next.Add(1)
	c.inFlight[w].Store(ts)
	return ts
}

func (c *benchClock) end(w int) { c.inFlight[w].Store(0) }

// lwm is the newest timestamp at and below which every batch is done.
func (c *benchClock) lwm() uint64 {
	l := c.next.Load()
	for i := range c.inFlight {
		if ts := c.inFlight[i].Load(); ts != 0 {
			l = min(l, ts-1)
		}
	}
	return l
}

// followHorizon sets the index horizon to the clock's low watermark every
// tick until the returned stop is called.
func followHorizon(s *index.Store, clock *benchClock, tick time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				s.SetHorizon(clock.lwm())
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func firstErr(ms []index.Mutation) error {
	for _, m := range ms {
		if m.Err != nil {
			return m.Err
		}
	}
	return nil
}
