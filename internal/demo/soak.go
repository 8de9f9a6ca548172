package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retinadb/retina/internal/hybench"
	"github.com/retinadb/retina/internal/server"
)

// SoakConfig is `retina bench soak`: the HyBench-like mix at a steady rate
// for a long time, with analytical queries running and one explicit read
// transaction held open in the middle, sampled at intervals.
type SoakConfig struct {
	SF          float64
	Seed        uint64
	Duration    time.Duration // of the change stream
	Rate        int           // row changes per second
	SampleEvery time.Duration
	HoldFor     time.Duration // the read transaction held open mid-run (0: none)
	FileBlocks  int           // write-buffer blocks per file (0: the server's default)
	// Growing lets the history tables grow as HyBench's mix does (25%
	// inserts, 5% deletes); by default they keep their base size, so the
	// figures compare like with like: a system in steady state.
	Growing bool
	OutDir  string // report.json and one SVG a series ("" = none)
	Logger  *slog.Logger
	Node    func(*server.NodeConfig)
}

// DefaultSoakConfig is the run: 10 minutes at 30K row changes/s.
func DefaultSoakConfig() SoakConfig {
	return SoakConfig{SF: 0.1, Seed: 1, Duration: 10 * time.Minute, Rate: 30_000, SampleEvery: 10 * time.Second,
		HoldFor: 2 * time.Minute, OutDir: "soak-report"}
}

// SoakSample is one sampling of the running server.
type SoakSample struct {
	AtS             float64 `json:"at_s"`
	RSSBytes        int64   `json:"rss_bytes"`
	HeapBytes       int64   `json:"heap_bytes"`
	VisibilityBytes int64   `json:"visibility_bytes"`
	BufferBytes     int64   `json:"write_buffer_bytes"`
	IndexVersions   int64   `json:"index_versions"`
	LakeBytes       int64   `json:"lake_bytes"`
	LiveBytes       int64   `json:"live_bytes"`
	Versions        int64   `json:"versions"`
	LiveVersions    int64   `json:"live_versions"`
	StaleShare      float64 `json:"stale_share"`
	FreshP50ms      float64 `json:"freshness_p50_ms"`
	FreshP99ms      float64 `json:"freshness_p99_ms"`
	APms            float64 `json:"ap_ms_median"`
	LWMLagS         float64 `json:"lwm_lag_s"`
	Committed       uint64  `json:"rows_committed"`
	GCRewrites      uint64  `json:"gc_rewrites"`
	GCDropped       uint64  `json:"gc_versions_dropped"`
	Files           int     `json:"files"`
	// ByTable splits the stored and stale versions by table.
	ByTable map[string]server.TableVersions `json:"by_table"`
}

// SoakResult is the run's samples and figures.
type SoakResult struct {
	Config  map[string]any `json:"config"`
	Samples []SoakSample   `json:"samples"`
	Figures map[string]any `json:"figures"`
	// HoldStartS and HoldEndS bound the held transaction (seconds into the
	// stream); LWMCatchupS is how long after it ended LWM passed it.
	HoldStartS  float64 `json:"hold_start_s"`
	HoldEndS    float64 `json:"hold_end_s"`
	LWMCatchupS float64 `json:"lwm_catchup_s"`
	// LWMFreedS is how long after the held transaction began LWM passed
	// its snapshot while it was still open (its visibility checkpoint); 0
	// when it never did.
	LWMFreedS              float64  `json:"lwm_freed_s"`
	RowsPerSec             float64  `json:"rows_per_sec"`
	InvariantChecks        int      `json:"invariant_checks"`
	InvariantFailures      []string `json:"invariant_failures,omitempty"`
	ProbeErrors            []string `json:"probe_errors,omitempty"`
	VisibilityBitsPerTuple float64  `json:"visibility_bits_per_tuple"`
}

type apSample struct {
	at   time.Duration
	name string
	d    time.Duration
}

type hwmAt struct {
	at  time.Time
	hwm uint64
}

// RunSoak runs the soak; logf receives progress lines.
func RunSoak(ctx context.Context, cfg SoakConfig, logf func(format string, args ...any)) (*SoakResult, error) {
	if cfg.SampleEvery <= 0 || cfg.Duration <= 0 || cfg.Rate <= 0 {
		return nil, fmt.Errorf("soak: duration, rate and sample interval must be positive")
	}
	if cfg.HoldFor >= cfg.Duration {
		return nil, fmt.Errorf("soak: the held transaction (%s) must be shorter than the run (%s)", cfg.HoldFor, cfg.Duration)
	}
	node := cfg.Node
	if cfg.FileBlocks > 0 {
		node = func(nc *server.NodeConfig) {
			nc.FileBlocks = cfg.FileBlocks
			if cfg.Node != nil {
				cfg.Node(nc)
			}
		}
	}
	p, err := startPipeline(ctx, pipelineConfig{SF: cfg.SF, Seed: cfg.Seed, Retain: !cfg.Growing, Logger: cfg.Logger, Node: node})
	if err != nil {
		return nil, err
	}
	defer p.close()
	logf("loading %d base rows (SF %g) ...", hybench.SizesFor(cfg.SF).Total(), cfg.SF)
	if err := p.load(ctx); err != nil {
		return nil, err
	}
	history := "kept at their base size"
	if cfg.Growing {
		history = "growing"
	}
	logf("streaming %d row changes/s for %s (history tables %s); sampling every %s; a read transaction held %s mid-run",
		cfg.Rate, cfg.Duration, history, cfg.SampleEvery, cfg.HoldFor)

	srvNode := p.srv.Node
	pr := newProbes()
	res := &SoakResult{Config: map[string]any{"sf": cfg.SF, "rate": cfg.Rate, "duration_s": cfg.Duration.Seconds(),
		"sample_every_s": cfg.SampleEvery.Seconds(), "hold_s": cfg.HoldFor.Seconds(), "growing": cfg.Growing}}
	streamCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	var (
		wg      sync.WaitGroup
		feedErr error
		apMu    sync.Mutex
		ap      []apSample
		hwmMu   sync.Mutex
		hwms    []hwmAt
		holdErr error
	)
	queries := hybench.AnalyticalQueries()
	committedBefore := p.srv.IngestStats().Committed
	wg.Go(func() {
		feedErr = p.feed(streamCtx, cfg.Rate)
		stop()
	})
	wg.Go(func() { p.runProbes(streamCtx, pr, 100*time.Millisecond, 5*time.Second) })
	wg.Go(func() {
		p.runAP(streamCtx, pr, queries, func(name string, d time.Duration) {
			apMu.Lock()
			ap = append(ap, apSample{at: pr.sinceStart(), name: name, d: d})
			apMu.Unlock()
		})
	})
	// HWM once a second, to turn LWM into an age: how long ago HWM passed it.
	wg.Go(func() {
		every(streamCtx, time.Second, func() {
			if w, err := srvNode.Txn.Watermarks(streamCtx); err == nil {
				hwmMu.Lock()
				hwms = append(hwms, hwmAt{time.Now(), w.HWM})
				hwmMu.Unlock()
			}
		})
	})
	lwmLag := func(lwm uint64) float64 {
		hwmMu.Lock()
		defer hwmMu.Unlock()
		for _, h := range hwms {
			if h.hwm > lwm+1 {
				return time.Since(h.at).Seconds()
			}
		}
		return 0
	}
	if cfg.HoldFor > 0 {
		wg.Go(func() {
			holdErr = p.holdTransaction(streamCtx, cfg, pr, res)
		})
	}
	var samples []SoakSample
	every(streamCtx, cfg.SampleEvery, func() {
		s, err := sampleSoak(streamCtx, p, pr, cfg.SampleEvery, lwmLag, func(since time.Duration) []apSample {
			apMu.Lock()
			defer apMu.Unlock()
			var out []apSample
			for _, a := range ap {
				if a.at >= since {
					out = append(out, a)
				}
			}
			return out
		})
		if err != nil {
			if streamCtx.Err() == nil {
				pr.addErr(err)
			}
			return
		}
		s.Committed -= committedBefore
		samples = append(samples, s)
		logf("%5.0fs  rss %4d MiB  heap %4d MiB  vis %5.1f MiB  index %8d versions  lake/live %.2f  stale %.2f (%d files, %d rewrites)  fresh P99 %6.1f ms  AP %6.1f ms  LWM lag %5.1fs",
			s.AtS, s.RSSBytes>>20, s.HeapBytes>>20, float64(s.VisibilityBytes)/(1<<20), s.IndexVersions,
			ratio(s.LakeBytes, s.LiveBytes), s.StaleShare, s.Files, s.GCRewrites, s.FreshP99ms, s.APms, s.LWMLagS)
	})
	wg.Wait()
	streamed := pr.sinceStart()
	if feedErr != nil {
		return nil, feedErr
	}
	if holdErr != nil {
		return nil, holdErr
	}
	if err := p.srv.Failure(); err != nil {
		return nil, fmt.Errorf("soak: ingestion failed: %w", err)
	}
	res.RowsPerSec = float64(p.srv.IngestStats().Committed-committedBefore) / streamed.Seconds()
	p.pw.Close()
	if err := p.waitCommitted(ctx); err != nil {
		return nil, err
	}
	failures, err := p.checkInvariants(ctx)
	if err != nil {
		return nil, err
	}
	pr.addCheck(failures)
	srvNode.CollectVisibility(ctx)
	if mem := srvNode.Memory(); mem.Tuples > 0 {
		res.VisibilityBitsPerTuple = float64(mem.VisibilityBytes*8) / float64(mem.Tuples)
	}
	res.Samples = samples
	pr.mu.Lock()
	res.InvariantChecks, res.InvariantFailures, res.ProbeErrors = pr.checks, pr.failures, pr.errs
	pr.mu.Unlock()
	res.Figures = soakFigures(res, pr, ap, streamed)
	if err := p.close(); err != nil {
		return res, fmt.Errorf("soak: shutdown: %w", err)
	}
	if cfg.OutDir != "" {
		if err := res.write(cfg.OutDir); err != nil {
			return res, err
		}
		logf("wrote %s and one SVG chart a series", filepath.Join(cfg.OutDir, "report.json"))
	}
	return res, nil
}

// holdTransaction opens a read transaction in the middle of the run,
// keeps it HoldFor, ends it, and measures how long LWM takes to pass it.
func (p *pipeline) holdTransaction(ctx context.Context, cfg SoakConfig, pr *probes, res *SoakResult) error {
	wait := (cfg.Duration - cfg.HoldFor) / 2
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(wait):
	}
	// Once begun, the transaction is opened, read, read again and ended
	// even if the run's deadline passes meanwhile: a loaded machine (the
	// race detector, a shared host) stretches each step; only the hold
	// itself ends with the run.
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(opCtx, "postgres://retina@"+p.srv.SQLAddr()+"/retina?sslmode=disable")
	if err != nil {
		return fmt.Errorf("soak: held transaction: %w", err)
	}
	defer conn.Close(opCtx)
	if _, err := conn.Exec(opCtx, "BEGIN"); err != nil {
		return fmt.Errorf("soak: held transaction: %w", err)
	}
	// What the transaction reads must not change while it is held, even
	// after a visibility checkpoint lets LWM and GC move past it.
	const read = "SELECT retina_snapshot(), (SELECT count(*) FROM " + hybench.Transfer + "), (SELECT sum(balance)::VARCHAR FROM " + hybench.SavingAccount + ")"
	var (
		held          uint64
		rows, rows2   int64
		saved, saved2 string
	)
	if err := conn.QueryRow(opCtx, read).Scan(&held, &rows, &saved); err != nil {
		return fmt.Errorf("soak: held transaction: %w", err)
	}
	start := time.Now()
	res.HoldStartS = pr.sinceStart().Seconds()
hold:
	for freed := false; time.Since(start) < cfg.HoldFor; {
		if !freed {
			if w, err := p.srv.Node.Txn.Watermarks(ctx); err == nil && w.LWM > held {
				freed = true
				res.LWMFreedS = time.Since(start).Seconds()
			}
		}
		select {
		case <-ctx.Done():
			break hold // the run ended: stop holding early
		case <-time.After(100 * time.Millisecond):
		}
	}
	ctx = opCtx
	var snap2 uint64
	if err := conn.QueryRow(ctx, read).Scan(&snap2, &rows2, &saved2); err != nil {
		return fmt.Errorf("soak: held transaction, second read: %w", err)
	}
	if snap2 != held || rows2 != rows || saved2 != saved {
		pr.addCheck([]string{fmt.Sprintf("held transaction: read snapshot %d: %d transfers, savings %s; %s later snapshot %d: %d transfers, savings %s",
			held, rows, saved, cfg.HoldFor, snap2, rows2, saved2)})
	} else {
		pr.addCheck(nil)
	}
	w, err := p.srv.Node.Txn.Watermarks(ctx)
	if err != nil {
		return err
	}
	// Whatever ends the transaction (COMMIT here, or the server ending an
	// idle session), LWM must pass the HWM of that moment.
	conn.Exec(ctx, "COMMIT")
	ended := time.Now()
	res.HoldEndS = pr.sinceStart().Seconds()
	for {
		now, err := p.srv.Node.Txn.Watermarks(ctx)
		if err != nil {
			return nil // the run ended first
		}
		if now.LWM >= w.HWM-1 {
			res.LWMCatchupS = time.Since(ended).Seconds()
			return nil
		}
		select {
		case <-ctx.Done():
			res.LWMCatchupS = time.Since(ended).Seconds()
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func sampleSoak(ctx context.Context, p *pipeline, pr *probes, window time.Duration, lwmLag func(uint64) float64,
	apSince func(time.Duration) []apSample) (SoakSample, error) {
	node := p.srv.Node
	at := pr.sinceStart()
	var s SoakSample
	s.AtS = math.Round(at.Seconds()*10) / 10
	s.RSSBytes = residentBytes()
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	s.HeapBytes = int64(ms0.HeapAlloc)
	mem := node.Memory()
	s.VisibilityBytes, s.BufferBytes = mem.VisibilityBytes, mem.WriteBufferBytes
	var err error
	if s.IndexVersions, err = node.Index.Versions(); err != nil {
		return s, err
	}
	w, err := node.Txn.Watermarks(ctx)
	if err != nil {
		return s, err
	}
	st, err := node.Storage(ctx, w.HWM-1)
	if err != nil {
		return s, err
	}
	s.LakeBytes, s.LiveBytes, s.Versions, s.LiveVersions = st.LakeBytes, st.LiveBytes, st.Versions, st.Versions-st.Stale
	s.ByTable = st.ByTable
	if st.Versions > 0 {
		s.StaleShare = round3(float64(st.Stale) / float64(st.Versions))
	}
	fresh := pr.freshSince(at - window)
	s.FreshP50ms, s.FreshP99ms = ms(percentile(fresh, 50)), ms(percentile(fresh, 99))
	var aps []time.Duration
	for _, a := range apSince(at - window) {
		aps = append(aps, a.d)
	}
	s.APms = ms(median(aps))
	s.LWMLagS = math.Round(lwmLag(w.LWM)*10) / 10
	s.Committed = p.srv.IngestStats().Committed
	gc := node.GCStats()
	s.GCRewrites, s.GCDropped, s.Files = gc.Rewrites.Load(), gc.VersionsDropped.Load(), st.Files
	return s, nil
}

// soakFigures reduces the samples to the figures the issue names. Its
// "minutes" are a fifth of the run when the run is shorter than 5 minutes.
func soakFigures(res *SoakResult, pr *probes, ap []apSample, streamed time.Duration) map[string]any {
	minute := min(time.Minute, streamed/5)
	in := func(s SoakSample, from, to time.Duration) bool {
		at := time.Duration(s.AtS * float64(time.Second))
		return at >= from && at <= to
	}
	mean := func(from, to time.Duration, f func(SoakSample) float64) float64 {
		var sum float64
		var n int
		for _, s := range res.Samples {
			if in(s, from, to) {
				sum += f(s)
				n++
			}
		}
		if n == 0 {
			return 0
		}
		return sum / float64(n)
	}
	second, last := [2]time.Duration{minute, 2 * minute}, [2]time.Duration{streamed - minute, streamed}
	rss := func(s SoakSample) float64 { return float64(s.RSSBytes) }
	live := func(s SoakSample) float64 { return float64(s.LiveVersions) }
	growth := 0.0
	if r2 := mean(second[0], second[1], rss); r2 > 0 {
		growth = mean(last[0], last[1], rss) / r2
		if l2 := mean(second[0], second[1], live); l2 > 0 {
			growth /= max(1, mean(last[0], last[1], live)/l2)
		}
	}
	liveGrowth := 0.0 // AP latency follows the live data, which the mix grows
	if l1 := mean(0, minute, live); l1 > 0 {
		liveGrowth = mean(last[0], last[1], live) / l1
	}
	var lakeLive, stale, lag float64
	for _, s := range res.Samples {
		if s.LiveBytes > 0 {
			lakeLive = max(lakeLive, float64(s.LakeBytes)/float64(s.LiveBytes))
		}
		stale = max(stale, s.StaleShare)
		lag = max(lag, s.LWMLagS)
	}
	freshIn := func(from, to time.Duration) float64 {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		var ds []time.Duration
		for _, s := range pr.fresh {
			if s.At >= from && s.At <= to {
				ds = append(ds, s.Freshness)
			}
		}
		return ms(percentile(ds, 99))
	}
	apIn := func(from, to time.Duration) map[string]time.Duration {
		by := map[string][]time.Duration{}
		for _, a := range ap {
			if a.at >= from && a.at <= to {
				by[a.name] = append(by[a.name], a.d)
			}
		}
		out := map[string]time.Duration{}
		for k, v := range by {
			out[k] = median(v)
		}
		return out
	}
	first, final := apIn(0, minute), apIn(last[0], last[1])
	var ratios []float64
	byQuery := map[string]float64{}
	for name, d := range first {
		if e, ok := final[name]; ok && d > 0 {
			ratios = append(ratios, float64(e)/float64(d))
			byQuery[name] = round3(float64(e) / float64(d))
		}
	}
	return map[string]any{
		"rows_per_sec":                   math.Round(res.RowsPerSec),
		"rss_growth_ratio":               round3(growth),
		"lake_to_live_bytes_max":         round3(lakeLive),
		"stale_share_max":                round3(stale),
		"freshness_p99_ms_first_minute":  freshIn(0, minute),
		"freshness_p99_ms_last_minute":   freshIn(last[0], last[1]),
		"ap_latency_ratio_last_vs_first": round3(geomean(ratios)),
		"ap_latency_ratio_by_query":      byQuery,
		"live_rows_ratio_last_vs_first":  round3(liveGrowth),
		"lwm_lag_max_s":                  lag,
		"lwm_catchup_s":                  math.Round(res.LWMCatchupS*10) / 10,
		"lwm_freed_while_held_s":         math.Round(res.LWMFreedS*10) / 10,
		"visibility_bits_per_tuple":      round3(res.VisibilityBitsPerTuple),
		"samples":                        len(res.Samples),
		"invariant_checks":               res.InvariantChecks,
		"invariant_failures":             len(res.InvariantFailures),
	}
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func (res *SoakResult) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("soak: report directory: %w", err)
	}
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), data, 0o644); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	return writeSoakCharts(dir, res)
}
