package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/skeena"
)

// SkeenaConfig sizes `retina bench skeena`.
type SkeenaConfig struct {
	Rows     int           // rows per table
	RowBytes int           // bytes per row
	Accesses int           // record accesses per transaction
	WritePct int           // share of accesses that update the row
	Workers  int           // concurrent transactions
	Duration time.Duration // per measured interval
	Rounds   int           // alternating rounds of engine-alone vs store for the overhead ratios
	Mixes    []int         // storage share of accesses (%), one throughput figure each
}

// DefaultSkeenaConfig runs in about a minute.
func DefaultSkeenaConfig() SkeenaConfig {
	return SkeenaConfig{Rows: 100_000, RowBytes: 100, Accesses: 10, WritePct: 20, Workers: 32,
		Duration: 2 * time.Second, Rounds: 3, Mixes: []int{0, 20, 40, 60, 80, 100}}
}

// Skeena runs the paper's microbenchmarks on the two-engine store: memory-
// only and storage-only transactions through the store against the same
// transactions on the engine alone (the cross-engine layer's overhead), then
// mixes of accesses split between the engines: throughput, abort rate and
// commit latency (acknowledged, i.e. durable) at each mix.
func Skeena(ctx context.Context, r *Report, cfg SkeenaConfig) error {
	if cfg.Rows < 1 || cfg.Accesses < 1 || cfg.Workers < 1 || cfg.Rounds < 1 || cfg.Duration <= 0 {
		return fmt.Errorf("bench skeena: rows, accesses, workers, rounds and duration must be positive")
	}
	dir, err := os.MkdirTemp("", "retina-bench-skeena-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s, err := skeena.Open(ctx, skeena.Options{Dir: dir, Logger: slog.New(slog.DiscardHandler), Tables: []skeena.Table{
		{TableSpec: engine.TableSpec{Name: "mem"}, Engine: skeena.Memory},
		{TableSpec: engine.TableSpec{Name: "disk"}, Engine: skeena.Storage},
	}})
	if err != nil {
		return err
	}
	defer s.Close()
	r.Set("rows_per_table", cfg.Rows)
	r.Set("accesses_per_txn", cfg.Accesses)
	r.Set("write_pct", cfg.WritePct)
	r.Set("workers", cfg.Workers)
	if err := loadSkeena(ctx, s, cfg); err != nil {
		return err
	}
	r.Printf("loaded %d rows of %d bytes into each engine", cfg.Rows, cfg.RowBytes)
	memEng, diskEng := s.Engines()

	// Overhead: alternate engine-alone and store runs; compare the sums.
	for _, side := range []struct {
		name, table string
		eng         engine.Engine
		pct         int
		figure      string
	}{
		{"memory", "mem", memEng, 0, "memory_overhead_ratio"},
		{"storage", "disk", diskEng, 100, "disk_overhead_ratio"},
	} {
		var alone, store float64
		for round := 0; round < cfg.Rounds; round++ {
			a, err := runSkeenaMix(ctx, cfg, func(rng *rand.Rand) skeenaTxn { return newAloneTxn(side.eng, side.table) }, side.pct)
			if err != nil {
				return err
			}
			b, err := runSkeenaMix(ctx, cfg, func(rng *rand.Rand) skeenaTxn { return storeTxn{s.Begin()} }, side.pct)
			if err != nil {
				return err
			}
			alone += a.tps
			store += b.tps
			r.Printf("%s-only round %d: engine alone %.0f txn/s, through the store %.0f txn/s", side.name, round+1, a.tps, b.tps)
		}
		ratio := alone / store
		r.Printf("%s: %s = %.3f (engine alone / store, throughput summed over %d rounds)", side.name, side.figure, ratio, cfg.Rounds)
		r.Set(side.name+"_alone_txn_per_sec", math.Round(alone/float64(cfg.Rounds)))
		r.Set(side.name+"_store_txn_per_sec", math.Round(store/float64(cfg.Rounds)))
		r.Set(side.figure, math.Round(ratio*1000)/1000)
	}

	for _, pct := range cfg.Mixes {
		res, err := runSkeenaMix(ctx, cfg, func(rng *rand.Rand) skeenaTxn { return storeTxn{s.Begin()} }, pct)
		if err != nil {
			return err
		}
		r.Printf("mix %3d%% storage: %.0f txn/s, abort rate %.2f%%, commit latency P50 %.2f ms P99 %.2f ms",
			pct, res.tps, res.abortPct, res.p50, res.p99)
		r.Set(fmt.Sprintf("mix%d_txn_per_sec", pct), math.Round(res.tps))
		r.Set(fmt.Sprintf("mix%d_abort_pct", pct), math.Round(res.abortPct*100)/100)
		r.Set(fmt.Sprintf("mix%d_p50_ms", pct), res.p50)
		r.Set(fmt.Sprintf("mix%d_p99_ms", pct), res.p99)
	}
	parts, points := s.CSRStats()
	r.Set("csr_parts", parts)
	r.Set("csr_points", points)
	return nil
}

func skeenaKey(i int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(i)) }

func loadSkeena(ctx context.Context, s *skeena.Store, cfg SkeenaConfig) error {
	row := make([]byte, cfg.RowBytes)
	const batch = 1000
	for lo := 0; lo < cfg.Rows; lo += batch {
		tx := s.Begin()
		for i := lo; i < min(lo+batch, cfg.Rows); i++ {
			for _, t := range []string{"mem", "disk"} {
				if err := tx.Put(ctx, t, skeenaKey(i), row); err != nil {
					tx.Rollback()
					return err
				}
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("bench skeena: load rows %d..%d: %w", lo, lo+batch, err)
		}
	}
	return nil
}

// skeenaTxn is one transaction either through the store or on one engine.
type skeenaTxn interface {
	get(ctx context.Context, table string, key []byte) ([]byte, error)
	put(ctx context.Context, table string, key, row []byte) error
	commit(ctx context.Context) error
	rollback()
}

type storeTxn struct{ tx *skeena.Tx }

func (t storeTxn) get(ctx context.Context, table string, key []byte) ([]byte, error) {
	v, _, err := t.tx.Get(ctx, table, key)
	return v, err
}
func (t storeTxn) put(ctx context.Context, table string, key, row []byte) error {
	return t.tx.Put(ctx, table, key, row)
}
func (t storeTxn) commit(ctx context.Context) error { return t.tx.Commit(ctx) }
func (t storeTxn) rollback()                        { t.tx.Rollback() }

// aloneTxn runs on one engine without the store: begin at its latest
// snapshot, commit, wait for its own log (what the store acknowledges).
type aloneTxn struct {
	eng   engine.Engine
	tx    engine.Tx
	table string
}

func newAloneTxn(e engine.Engine, table string) skeenaTxn {
	return &aloneTxn{eng: e, tx: e.Begin(e.LatestSnapshot(), engine.SnapshotIsolation), table: table}
}

func (t *aloneTxn) get(_ context.Context, table string, key []byte) ([]byte, error) {
	v, _, err := t.tx.Get(table, key)
	return v, err
}
func (t *aloneTxn) put(_ context.Context, table string, key, row []byte) error {
	return t.tx.Put(table, key, row)
}
func (t *aloneTxn) commit(ctx context.Context) error {
	cts, err := t.tx.PreCommit()
	if err != nil {
		return err
	}
	if err := t.tx.PostCommit(nil); err != nil {
		return err
	}
	return t.eng.WaitDurable(ctx, max(cts, t.tx.Snapshot()))
}
func (t *aloneTxn) rollback() { t.tx.Abort() }

type mixResult struct {
	tps, abortPct float64
	p50, p99      float64
}

// runSkeenaMix runs transactions of cfg.Accesses accesses, pct% of them to
// the storage table, from cfg.Workers goroutines for cfg.Duration.
func runSkeenaMix(ctx context.Context, cfg SkeenaConfig, begin func(*rand.Rand) skeenaTxn, pct int) (mixResult, error) {
	var commits, aborts atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	deadline := time.Now().Add(cfg.Duration)
	var wg sync.WaitGroup
	for w := 0; w < cfg.Workers; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			row := make([]byte, cfg.RowBytes)
			var mine []time.Duration
			for time.Now().Before(deadline) && ctx.Err() == nil {
				start := time.Now()
				tx := begin(rng)
				err := func() error {
					for a := 0; a < cfg.Accesses; a++ {
						table := "mem"
						if rng.Intn(100) < pct {
							table = "disk"
						}
						key := skeenaKey(rng.Intn(cfg.Rows))
						if _, err := tx.get(ctx, table, key); err != nil {
							return err
						}
						if rng.Intn(100) < cfg.WritePct {
							rng.Read(row[:8])
							if err := tx.put(ctx, table, key, row); err != nil {
								return err
							}
						}
					}
					return tx.commit(ctx)
				}()
				if err != nil {
					tx.rollback()
					if engine.Retryable(err) {
						aborts.Add(1)
						continue
					}
					mu.Lock()
					firstErr = errors.Join(firstErr, err)
					mu.Unlock()
					return
				}
				commits.Add(1)
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}(rand.Int63())
	}
	wg.Wait()
	if firstErr != nil {
		return mixResult{}, firstErr
	}
	slices.Sort(lat)
	c, a := commits.Load(), aborts.Load()
	res := mixResult{tps: float64(c) / cfg.Duration.Seconds(), p50: durationPercentileMS(lat, 50), p99: durationPercentileMS(lat, 99)}
	if c+a > 0 {
		res.abortPct = 100 * float64(a) / float64(c+a)
	}
	return res, nil
}
