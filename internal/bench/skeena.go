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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/skeena"
)

// SkeenaConfig sizes `retina bench skeena`.
type SkeenaConfig struct {
	Rows        int           // rows per table
	RowBytes    int           // bytes per row
	Accesses    int           // record accesses per transaction
	WritePct    int           // share of accesses that update the row
	Workers     int           // concurrent transactions
	Duration    time.Duration // per overhead slice
	MixDuration time.Duration // per mix figure
	Rounds      int           // slices (engine alone and store side by side) for the overhead ratios
	Mixes       []int         // storage share of accesses (%), one throughput figure each
	// Dir is where the store's data directory is made. Empty: a tmpfs
	// (/dev/shm) when there is one, as the paper does to expose the layer's
	// overhead rather than the device's; else the system temp directory.
	Dir string
}

// DefaultSkeenaConfig runs in about seventy seconds.
func DefaultSkeenaConfig() SkeenaConfig {
	return SkeenaConfig{Rows: 100_000, RowBytes: 100, Accesses: 10, WritePct: 20, Workers: 32,
		Duration: 500 * time.Millisecond, Rounds: 48, MixDuration: 2 * time.Second, Mixes: []int{0, 20, 40, 60, 80, 100}}
}

// Skeena runs the paper's microbenchmarks on the two-engine store: memory-
// only and storage-only transactions through the store against the same
// transactions on the engine alone (the cross-engine layer's overhead), then
// mixes of accesses split between the engines: throughput, abort rate and
// commit latency (acknowledged, i.e. durable) at each mix.
func Skeena(ctx context.Context, r *Report, cfg SkeenaConfig) error {
	if cfg.Rows < 1 || cfg.Accesses < 1 || cfg.Workers < 2 || cfg.Rounds < 1 || cfg.Duration <= 0 || cfg.MixDuration <= 0 {
		return fmt.Errorf("bench skeena: rows, accesses, rounds and durations must be positive and workers at least 2")
	}
	parent, onTmpfs := cfg.Dir, false
	if parent == "" {
		parent, onTmpfs = defaultSkeenaDir()
	}
	dir, err := os.MkdirTemp(parent, "retina-bench-skeena-")
	if err != nil {
		return fmt.Errorf("bench skeena: make a data directory under %s: %w (choose another with --dir)", parent, err)
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
	r.Set("data_on_tmpfs", onTmpfs)
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
		// Both variants run at the same time, half the workers each, so
		// the shared machine's noise hits them alike; the figure is the
		// median over the slices of engine-alone throughput over store
		// throughput.
		var alone, store float64
		var ratios []float64
		var seen []string
		for round := 0; round < cfg.Rounds; round++ {
			aloneV := func(*rand.Rand) skeenaTxn { return newAloneTxn(side.eng, side.table) }
			storeV := func(*rand.Rand) skeenaTxn { return storeTxn{s.Begin()} }
			// Start order alternates: the first goroutines started get a
			// head start.
			variants := []func(*rand.Rand) skeenaTxn{aloneV, storeV}
			if round%2 == 1 {
				variants[0], variants[1] = storeV, aloneV
			}
			res, err := runSkeenaVariants(ctx, cfg, side.pct, variants...)
			if err != nil {
				return err
			}
			a, b := res[0], res[1]
			if round%2 == 1 {
				a, b = b, a
			}
			alone += a.tps
			store += b.tps
			ratios = append(ratios, a.tps/b.tps)
			seen = append(seen, fmt.Sprintf("%.1f/%.1f", a.tps/1000, b.tps/1000))
		}
		r.Printf("%s-only slices, K txn/s alone/store: %s", side.name, strings.Join(seen, " "))
		ratio := median(ratios)
		r.Printf("%s-only: engine alone %.0f txn/s, through the store %.0f txn/s (%d workers each, %d slices of %v); %s = %.3f",
			side.name, alone/float64(cfg.Rounds), store/float64(cfg.Rounds), max(cfg.Workers/2, 1), cfg.Rounds, cfg.Duration, side.figure, ratio)
		r.Set(side.name+"_alone_txn_per_sec", math.Round(alone/float64(cfg.Rounds)))
		r.Set(side.name+"_store_txn_per_sec", math.Round(store/float64(cfg.Rounds)))
		r.Set(side.figure, math.Round(ratio*1000)/1000)
	}

	for _, pct := range cfg.Mixes {
		mcfg := cfg
		mcfg.Duration = cfg.MixDuration
		mix, err := runSkeenaVariants(ctx, mcfg, pct, func(*rand.Rand) skeenaTxn { return storeTxn{s.Begin()} })
		if err != nil {
			return err
		}
		res := mix[0]
		r.Printf("mix %3d%% storage: %.0f txn/s, abort rate %.2f%%, commit latency P50 %.3f ms P99 %.3f ms",
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

// runSkeenaVariants runs transactions of cfg.Accesses accesses, pct% of
// them to the storage table, for cfg.Duration, splitting cfg.Workers
// goroutines evenly among the variants, which run at the same time.
func runSkeenaVariants(ctx context.Context, cfg SkeenaConfig, pct int, variants ...func(*rand.Rand) skeenaTxn) ([]mixResult, error) {
	type tally struct {
		commits, aborts atomic.Int64
		mu              sync.Mutex
		lat             []time.Duration
	}
	tallies := make([]tally, len(variants))
	var errMu sync.Mutex
	var firstErr error
	deadline := time.Now().Add(cfg.Duration)
	per := max(cfg.Workers/len(variants), 1)
	var wg sync.WaitGroup
	for v, begin := range variants {
		for w := 0; w < per; w++ {
			wg.Add(1)
			go func(t *tally, begin func(*rand.Rand) skeenaTxn, seed int64) {
				defer wg.Done()
				rng := rand.New(rand.NewSource(seed))
				row := make([]byte, cfg.RowBytes)
				var mine []time.Duration
				defer func() {
					t.mu.Lock()
					t.lat = append(t.lat, mine...)
					t.mu.Unlock()
				}()
				for time.Now().Before(deadline) && ctx.Err() == nil {
					start := time.Now()
					tx := begin(rng)
					err := runSkeenaTxn(ctx, cfg, tx, rng, row, pct)
					if err != nil {
						tx.rollback()
						if engine.Retryable(err) {
							t.aborts.Add(1)
							continue
						}
						errMu.Lock()
						firstErr = errors.Join(firstErr, err)
						errMu.Unlock()
						return
					}
					t.commits.Add(1)
					mine = append(mine, time.Since(start))
				}
			}(&tallies[v], begin, rand.Int63())
		}
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	out := make([]mixResult, len(variants))
	for i := range tallies {
		t := &tallies[i]
		slices.Sort(t.lat)
		c, a := t.commits.Load(), t.aborts.Load()
		out[i] = mixResult{tps: float64(c) / cfg.Duration.Seconds(), p50: latencyMS(t.lat, 50), p99: latencyMS(t.lat, 99)}
		if c+a > 0 {
			out[i].abortPct = 100 * float64(a) / float64(c+a)
		}
	}
	return out, nil
}

// runSkeenaTxn reads cfg.Accesses random rows, updating cfg.WritePct% of
// them, and commits.
func runSkeenaTxn(ctx context.Context, cfg SkeenaConfig, tx skeenaTxn, rng *rand.Rand, row []byte, pct int) error {
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
}

// latencyMS is the q-th percentile of sorted latencies in milliseconds,
// to the microsecond.
func latencyMS(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := max(int(math.Ceil(q/100*float64(len(sorted))))-1, 0)
	return float64(sorted[i].Microseconds()) / 1000
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// defaultSkeenaDir prefers a writable tmpfs.
func defaultSkeenaDir() (string, bool) {
	const shm = "/dev/shm"
	if st, err := os.Stat(shm); err == nil && st.IsDir() {
		if f, err := os.CreateTemp(shm, "retina-probe-"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return shm, true
		}
	}
	return os.TempDir(), false
}
