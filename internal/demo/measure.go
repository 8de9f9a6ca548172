package demo

import (
	"context"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/retinadb/retina/internal/hybench"
)

// sample is one freshness probe.
type sample struct {
	At        time.Duration // since the stream started
	Freshness time.Duration
}

// probes collects freshness samples and invariant results; the probe
// goroutines write, the display and the report read.
type probes struct {
	start    time.Time // sample times are relative to it
	mu       sync.Mutex
	fresh    []sample
	checks   int
	failures []string
	errs     []string
	ap       map[string][]time.Duration // query → latencies under change
}

func newProbes() *probes { return &probes{start: time.Now(), ap: map[string][]time.Duration{}} }

func (p *probes) sinceStart() time.Duration { return time.Since(p.start) }

func (p *probes) addFresh(s sample) {
	p.mu.Lock()
	p.fresh = append(p.fresh, s)
	p.mu.Unlock()
}

func (p *probes) addCheck(failures []string) {
	p.mu.Lock()
	p.checks++
	p.failures = append(p.failures, failures...)
	p.mu.Unlock()
}

func (p *probes) addErr(err error) {
	p.mu.Lock()
	if len(p.errs) < 20 {
		p.errs = append(p.errs, err.Error())
	}
	p.mu.Unlock()
}

func (p *probes) addAP(name string, d time.Duration) {
	p.mu.Lock()
	p.ap[name] = append(p.ap[name], d)
	p.mu.Unlock()
}

// freshSince returns the freshness values of samples taken at or after t.
func (p *probes) freshSince(t time.Duration) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Duration
	for _, s := range p.fresh {
		if s.At >= t {
			out = append(out, s.Freshness)
		}
	}
	return out
}

// percentile is the nearest-rank percentile (0 < q ≤ 100) of ds.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(q / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

func median(ds []time.Duration) time.Duration { return percentile(ds, 50) }

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e4) / 100 }

// geomean of positive ratios; 0 for none.
func geomean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += math.Log(x)
	}
	return math.Exp(sum / float64(len(xs)))
}

// runProbes checks the invariants every checkEvery and, unless interval is
// 0, probes freshness every interval, until ctx ends.
func (p *pipeline) runProbes(ctx context.Context, pr *probes, interval, checkEvery time.Duration) {
	var wg sync.WaitGroup
	if interval > 0 {
		wg.Go(func() {
			every(ctx, interval, func() {
				f, err := p.freshness(ctx)
				if err == nil {
					pr.addFresh(sample{At: pr.sinceStart(), Freshness: f})
				} else if ctx.Err() == nil {
					pr.addErr(err)
				}
			})
		})
	}
	wg.Go(func() {
		every(ctx, checkEvery, func() {
			failures, err := p.checkInvariants(ctx)
			if err == nil {
				pr.addCheck(failures)
			} else if ctx.Err() == nil {
				pr.addErr(err)
			}
		})
	})
	wg.Wait()
}

// every calls f each interval until ctx ends.
func every(ctx context.Context, interval time.Duration, f func()) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			f()
		}
	}
}

// runAP runs the analytical queries round-robin until ctx ends and hands
// each latency to record.
func (p *pipeline) runAP(ctx context.Context, pr *probes, queries []hybench.Query, record func(name string, d time.Duration)) {
	for i := 0; ctx.Err() == nil; i++ {
		q := queries[i%len(queries)]
		d, err := p.timeQuery(ctx, q)
		if err != nil {
			if ctx.Err() == nil {
				pr.addErr(err)
			}
			continue
		}
		record(q.Name, d)
	}
}

// baseline times each query reps times on the data as it stands (after a
// warm-up run) and returns the medians.
func (p *pipeline) baseline(ctx context.Context, queries []hybench.Query, reps int) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, q := range queries {
		if _, err := p.timeQuery(ctx, q); err != nil {
			return nil, err
		}
		var ds []time.Duration
		for range reps {
			d, err := p.timeQuery(ctx, q)
			if err != nil {
				return nil, err
			}
			ds = append(ds, d)
		}
		out[q.Name] = median(ds)
	}
	return out, nil
}

// residentBytes is the process's resident memory (Go heap, DuckDB and
// everything else), or the Go runtime's view where /proc is missing.
func residentBytes() int64 {
	if data, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(data)); len(f) > 1 {
			if pages, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return pages * int64(os.Getpagesize())
			}
		}
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.Sys - m.HeapReleased)
}
