package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/retinadb/retina/internal/console"

	"github.com/retinadb/retina/internal/hybench"
	"github.com/retinadb/retina/internal/server"
)

// E2EConfig parameterises `retina bench e2e`: the demo's pipeline in
// three timed phases after the load.
type E2EConfig struct {
	SF   float64
	Seed uint64
	// AP phase (paper §6.3): queries on the static base data, then with a
	// DeltaPct change delta applied and APRate row changes/s streaming.
	DeltaPct float64
	APRate   int
	APReps   int
	// Freshness phase (§6.2): FreshRate row changes/s for FreshFor.
	FreshRate int
	FreshFor  time.Duration
	// Throughput phase: as fast as possible for SustainFor.
	SustainFor time.Duration
	// ConsoleFor is how long a client polls the console, at FreshRate,
	// for console_cpu_share.
	ConsoleFor time.Duration
	Logger     *slog.Logger
	Node       func(*server.NodeConfig)
}

// DefaultE2EConfig runs in under a minute on two cores.
func DefaultE2EConfig() E2EConfig {
	return E2EConfig{SF: 0.05, Seed: 1, DeltaPct: 1, APRate: 10_000, APReps: 5,
		FreshRate: 100_000, FreshFor: 10 * time.Second, SustainFor: 10 * time.Second, ConsoleFor: 10 * time.Second}
}

// E2EResult are the figures of one run.
type E2EResult struct {
	BaseRows           int
	LoadRowsPerSec     float64
	RowsPerSecSustain  float64
	FreshAchievedRate  float64
	FreshP50, FreshP99 time.Duration
	FreshSamples       int
	APSlowdown         float64
	APRatios           map[string]float64
	InvariantChecks    int
	InvariantFailures  int
	Failures           []string
	ProbeErrors        []string
	VisibilityBits     float64
	Tuples             uint64
	// ConsoleCPUShare is the share of the CPU the console took while a
	// client polled it every second in the freshness phase (-1: not
	// measured, the process was being profiled already).
	ConsoleCPUShare float64
}

// RunE2E runs the phases; logf receives progress lines.
func RunE2E(ctx context.Context, cfg E2EConfig, logf func(format string, args ...any)) (*E2EResult, error) {
	p, err := startPipeline(ctx, pipelineConfig{SF: cfg.SF, Seed: cfg.Seed, Logger: cfg.Logger, Node: cfg.Node})
	if err != nil {
		return nil, err
	}
	defer p.close()
	res := &E2EResult{BaseRows: p.gen.Sizes().Total(), APRatios: map[string]float64{}}
	start := time.Now()
	if err := p.load(ctx); err != nil {
		return nil, err
	}
	res.LoadRowsPerSec = float64(res.BaseRows) / time.Since(start).Seconds()
	logf("load: %d rows at %.0f rows/s", res.BaseRows, res.LoadRowsPerSec)

	pr := newProbes()
	check := func() error {
		failures, err := p.checkInvariants(ctx)
		if err != nil {
			return err
		}
		pr.addCheck(failures)
		return nil
	}
	if err := check(); err != nil {
		return nil, err
	}
	queries := hybench.AnalyticalQueries()
	static, err := p.baseline(ctx, queries, cfg.APReps)
	if err != nil {
		return nil, err
	}

	// The delta: DeltaPct of the base rows changed, as fast as it goes.
	deltaRows := int64(float64(res.BaseRows) * cfg.DeltaPct / 100)
	for p.gen.Changes().Rows < int(deltaRows) {
		buf, st := p.gen.NextTxn(nil, time.Now())
		if _, err := p.pw.Write(buf); err != nil {
			return nil, err
		}
		p.written.Add(int64(st.Rows))
	}
	if err := p.waitCommitted(ctx); err != nil {
		return nil, err
	}

	// AP under change: each query APReps times, the stream running.
	under := map[string][]time.Duration{}
	err = p.withStream(ctx, cfg.APRate, pr, false, func(ctx context.Context) error {
		for range cfg.APReps {
			for _, q := range queries {
				d, err := p.timeQuery(ctx, q)
				if err != nil {
					return err
				}
				under[q.Name] = append(under[q.Name], d)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var ratios []float64
	for _, q := range queries {
		r := float64(median(under[q.Name])) / float64(static[q.Name])
		res.APRatios[q.Name] = round2(r)
		ratios = append(ratios, r)
	}
	res.APSlowdown = geomean(ratios)
	logf("AP: geometric-mean slowdown %.3f with a %.1f%% delta and %d rows/s streaming %v", res.APSlowdown, cfg.DeltaPct, cfg.APRate, res.APRatios)

	// Freshness at FreshRate.
	freshFrom := pr.sinceStart()
	before := p.srv.IngestStats().Committed
	t0 := time.Now()
	if err := p.withStream(ctx, cfg.FreshRate, pr, true, sleepFor(cfg.FreshFor)); err != nil {
		return nil, err
	}
	res.FreshAchievedRate = float64(p.srv.IngestStats().Committed-before) / time.Since(t0).Seconds()
	fresh := pr.freshSince(freshFrom)
	res.FreshSamples = len(fresh)
	res.FreshP50, res.FreshP99 = percentile(fresh, 50), percentile(fresh, 99)
	logf("freshness at %d rows/s (achieved %.0f): P50 %.1f ms, P99 %.1f ms over %d probes",
		cfg.FreshRate, res.FreshAchievedRate, ms(res.FreshP50), ms(res.FreshP99), len(fresh))

	// The console's cost: a client polls it every second, as its page
	// does, while the stream runs; a CPU profile tells the console's share.
	var prof bytes.Buffer
	profiling := pprof.StartCPUProfile(&prof) == nil
	err = p.withStream(ctx, cfg.FreshRate, pr, false, func(ctx context.Context) error {
		pollCtx, stopPoll := context.WithCancel(ctx)
		defer stopPoll()
		var polls sync.WaitGroup
		polls.Go(func() { pollConsole(pollCtx, p.srv.ConsoleURL()) })
		err := sleepFor(cfg.ConsoleFor)(ctx)
		stopPoll()
		polls.Wait()
		return err
	})
	if profiling {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return nil, err
	}
	res.ConsoleCPUShare = -1
	if profiling {
		if res.ConsoleCPUShare, err = labelledShare(prof.Bytes(), console.CPULabelKey, console.CPULabel); err != nil {
			return nil, err
		}
		logf("console: %.4f of the CPU with a client polling every second", res.ConsoleCPUShare)
	}

	// Sustained throughput: the first second warms the pipeline up.
	var from, to uint64
	var tFrom, tTo time.Time
	err = p.withStream(ctx, 0, pr, false, func(ctx context.Context) error {
		if err := sleepFor(time.Second)(ctx); err != nil {
			return err
		}
		from, tFrom = p.srv.IngestStats().Committed, time.Now()
		if err := sleepFor(cfg.SustainFor)(ctx); err != nil {
			return err
		}
		to, tTo = p.srv.IngestStats().Committed, time.Now()
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.RowsPerSecSustain = float64(to-from) / tTo.Sub(tFrom).Seconds()
	logf("sustained: %.0f rows/s", res.RowsPerSecSustain)

	if err := p.waitCommitted(ctx); err != nil {
		return nil, err
	}
	if err := check(); err != nil {
		return nil, err
	}
	p.srv.Node.CollectVisibility(ctx)
	mem := p.srv.Node.Memory()
	res.Tuples = mem.Tuples
	if mem.Tuples > 0 {
		res.VisibilityBits = float64(mem.VisibilityBytes) * 8 / float64(mem.Tuples)
	}
	pr.mu.Lock()
	res.InvariantChecks, res.InvariantFailures, res.Failures, res.ProbeErrors = pr.checks, len(pr.failures), pr.failures, pr.errs
	pr.mu.Unlock()
	return res, p.close()
}

// pollConsole loads the console's page and assets, then polls
// /api/status every second as the page does, until ctx ends.
func pollConsole(ctx context.Context, url string) {
	get := func(u string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, a := range []string{"", "assets/console.js", "assets/console.css"} {
		get(url + a)
	}
	last := int64(0)
	for ctx.Err() == nil {
		get(url + "api/status?since=" + strconv.FormatInt(last, 10))
		last = time.Now().Unix() - 1
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// withStream runs body while the stream feeds at rate, with invariant
// checks every second and, if probe, freshness probes every 100 ms.
func (p *pipeline) withStream(ctx context.Context, rate int, pr *probes, probe bool, body func(context.Context) error) error {
	streamCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	var feedErr error
	wg.Go(func() { feedErr = p.feed(streamCtx, rate) })
	interval := time.Duration(0) // invariant checks only
	if probe {
		interval = 100 * time.Millisecond
	}
	wg.Go(func() { p.runProbes(streamCtx, pr, interval, time.Second) })
	err := body(streamCtx)
	stop()
	wg.Wait()
	if err == nil {
		err = feedErr
	}
	if err == nil {
		if ferr := p.srv.Failure(); ferr != nil {
			err = fmt.Errorf("ingestion failed: %w", ferr)
		}
	}
	return err
}

func sleepFor(d time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
}
