package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/retinadb/retina/internal/hybench"
	"github.com/retinadb/retina/internal/server"
)

// Config is `retina demo`.
type Config struct {
	DataDir  string        // "" = temporary
	OutDir   string        // report.json and freshness.svg ("" = none)
	SQLAddr  string        // "" = a free loopback port
	SF       float64       // HyBench-like scale factor
	Rate     int           // row changes per second, 0 = as fast as possible
	Duration time.Duration // of the change stream
	Seed     uint64
	// Out receives the status lines and the report; Interactive redraws
	// one status line in place (a terminal) instead of printing lines.
	Out         io.Writer
	Interactive bool
	Logger      *slog.Logger
	Node        func(*server.NodeConfig)
}

// DefaultConfig finishes in about a minute on two cores.
func DefaultConfig() Config {
	return Config{OutDir: "demo-report", SF: 0.1, Rate: 50_000, Duration: 40 * time.Second, Seed: 1, Out: io.Discard}
}

// Report is the demo's result, written as report.json.
type Report struct {
	ScaleFactor    float64 `json:"scale_factor"`
	BaseRows       int     `json:"base_rows"`
	LoadSeconds    float64 `json:"load_seconds"`
	LoadRowsPerSec float64 `json:"load_rows_per_sec"`

	TargetRowsPerSec int     `json:"target_rows_per_sec"`
	StreamSeconds    float64 `json:"stream_seconds"`
	Transactions     int     `json:"transactions"`
	RowsChanged      int     `json:"rows_changed"`
	RowsPerSec       float64 `json:"rows_per_sec"`
	// TargetPct is RowsPerSec as a share of the target (0 at full speed).
	TargetPct  float64 `json:"target_pct,omitempty"`
	UpdatesPct float64 `json:"updates_pct"`
	InsertsPct float64 `json:"inserts_pct"`
	DeletesPct float64 `json:"deletes_pct"`

	FreshnessSamples int     `json:"freshness_samples"`
	FreshnessP50ms   float64 `json:"freshness_p50_ms"`
	FreshnessP99ms   float64 `json:"freshness_p99_ms"`
	FreshnessMaxms   float64 `json:"freshness_max_ms"`

	Queries       []QueryReport `json:"queries"`
	APSlowdownGeo float64       `json:"ap_slowdown_geomean"`

	InvariantChecks   int      `json:"invariant_checks"`
	InvariantFailures int      `json:"invariant_failures"`
	Failures          []string `json:"failures,omitempty"`
	ProbeErrors       []string `json:"probe_errors,omitempty"`

	LiveRows               int64   `json:"live_rows"`
	VisibilityBytes        int64   `json:"visibility_bytes"`
	Tuples                 uint64  `json:"tuples"`
	VisibilityBitsPerTuple float64 `json:"visibility_bits_per_tuple"`
	PeakResidentBytes      int64   `json:"peak_resident_bytes"`

	samples []sample
}

// QueryReport compares one analytical query on static data and under change.
type QueryReport struct {
	Name          string  `json:"name"`
	StaticMs      float64 `json:"static_ms"`
	UnderChangeMs float64 `json:"under_change_ms"`
	Runs          int     `json:"runs_under_change"`
	Ratio         float64 `json:"ratio"`
}

// Run runs the demo: load, baseline queries, the change stream with
// probes, then a clean stop. It returns the report even when an invariant
// failed; the error is for a pipeline that could not run.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	size := hybench.SizesFor(cfg.SF)
	fmt.Fprintf(out, "Retina demo: HyBench-like SF %g (%d base rows), %s of changes at %s\n",
		cfg.SF, size.Total(), cfg.Duration, rateText(cfg.Rate))
	p, err := startPipeline(ctx, pipelineConfig{DataDir: cfg.DataDir, SQLAddr: cfg.SQLAddr, SF: cfg.SF, Seed: cfg.Seed, Logger: cfg.Logger, Node: cfg.Node})
	if err != nil {
		return nil, err
	}
	defer p.close()
	host, port, _ := net.SplitHostPort(p.srv.SQLAddr())
	fmt.Fprintf(out, "SQL endpoint: psql -h %s -p %s (while the demo runs)\n", host, port)
	fmt.Fprintf(out, "Console: %s (while the demo runs)\n", p.srv.ConsoleURL())

	rep := &Report{ScaleFactor: cfg.SF, BaseRows: size.Total(), TargetRowsPerSec: cfg.Rate}
	peak := residentBytes()
	loadStart := time.Now()
	fmt.Fprintf(out, "[1/3] loading base data through the sink ...\n")
	if err := p.load(ctx); err != nil {
		return nil, err
	}
	rep.LoadSeconds = time.Since(loadStart).Seconds()
	rep.LoadRowsPerSec = float64(size.Total()) / rep.LoadSeconds
	fmt.Fprintf(out, "      %d rows in %.1f s (%.0f rows/s)\n", size.Total(), rep.LoadSeconds, rep.LoadRowsPerSec)

	pr := newProbes()
	failures, err := p.checkInvariants(ctx)
	if err != nil {
		return nil, err
	}
	pr.addCheck(failures)
	queries := hybench.AnalyticalQueries()
	fmt.Fprintf(out, "[2/3] timing %d analytical queries on the static base data ...\n", len(queries))
	static, err := p.baseline(ctx, queries, 3)
	if err != nil {
		return nil, err
	}

	fmt.Fprintf(out, "[3/3] streaming changes; probing freshness every 100 ms, invariants every second, queries round-robin\n")
	streamCtx, stopStream := context.WithTimeout(ctx, cfg.Duration)
	defer stopStream()
	start := time.Now()
	pr.start = start
	changesBefore := p.gen.Changes()
	var wg sync.WaitGroup
	var feedErr error
	wg.Go(func() {
		feedErr = p.feed(streamCtx, cfg.Rate)
		stopStream()
	})
	wg.Go(func() { p.runProbes(streamCtx, pr, 100*time.Millisecond, time.Second) })
	wg.Go(func() { p.runAP(streamCtx, pr, queries, pr.addAP) })
	peak = max(peak, p.status(streamCtx, out, cfg, pr, start))
	wg.Wait()
	rep.StreamSeconds = time.Since(start).Seconds()
	if feedErr != nil {
		return nil, feedErr
	}
	if err := p.srv.Failure(); err != nil {
		return nil, fmt.Errorf("demo: ingestion failed: %w", err)
	}

	// Everything written gets applied; then the final state is checked.
	p.pw.Close()
	if err := p.waitCommitted(ctx); err != nil {
		return nil, err
	}
	failures, err = p.checkInvariants(ctx)
	if err != nil {
		return nil, err
	}
	pr.addCheck(failures)
	live, err := p.liveRows(ctx)
	if err != nil {
		return nil, err
	}
	p.srv.Node.CollectVisibility(ctx)
	mem := p.srv.Node.Memory()
	peak = max(peak, residentBytes())

	ch := p.gen.Changes()
	ch.Rows -= changesBefore.Rows
	ch.Updates -= changesBefore.Updates
	ch.Inserts -= changesBefore.Inserts
	ch.Deletes -= changesBefore.Deletes
	rep.fill(ch, pr, queries, static, mem, peak)
	rep.Transactions = int(p.gen.Transactions())
	rep.LiveRows = live

	fmt.Fprintf(out, "stopping the server cleanly (flush, persist visibility and source position) ...\n")
	if err := p.close(); err != nil {
		return rep, fmt.Errorf("demo: shutdown: %w", err)
	}
	rep.Print(out)
	if cfg.OutDir != "" {
		if err := rep.Write(cfg.OutDir); err != nil {
			return rep, err
		}
		fmt.Fprintf(out, "\nwrote %s and %s\n", filepath.Join(cfg.OutDir, "report.json"), filepath.Join(cfg.OutDir, "freshness.svg"))
	}
	return rep, nil
}

func (rep *Report) fill(ch hybench.TxnStats, pr *probes, queries []hybench.Query, static map[string]time.Duration, mem server.Memory, peak int64) {
	rep.RowsChanged = ch.Rows
	rep.RowsPerSec = float64(ch.Rows) / rep.StreamSeconds
	if rep.TargetRowsPerSec > 0 {
		rep.TargetPct = math.Round(rep.RowsPerSec/float64(rep.TargetRowsPerSec)*1000) / 10
	}
	if ch.Rows > 0 {
		rep.UpdatesPct = pct(ch.Updates, ch.Rows)
		rep.InsertsPct = pct(ch.Inserts, ch.Rows)
		rep.DeletesPct = pct(ch.Deletes, ch.Rows)
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	var fresh []time.Duration
	for _, s := range pr.fresh {
		fresh = append(fresh, s.Freshness)
	}
	rep.samples = pr.fresh
	rep.FreshnessSamples = len(fresh)
	rep.FreshnessP50ms = ms(percentile(fresh, 50))
	rep.FreshnessP99ms = ms(percentile(fresh, 99))
	rep.FreshnessMaxms = ms(percentile(fresh, 100))
	var ratios []float64
	for _, q := range queries {
		qr := QueryReport{Name: q.Name, StaticMs: ms(static[q.Name]), Runs: len(pr.ap[q.Name])}
		if qr.Runs > 0 {
			qr.UnderChangeMs = ms(median(pr.ap[q.Name]))
			if static[q.Name] > 0 {
				qr.Ratio = round2(float64(median(pr.ap[q.Name])) / float64(static[q.Name]))
				ratios = append(ratios, float64(median(pr.ap[q.Name]))/float64(static[q.Name]))
			}
		}
		rep.Queries = append(rep.Queries, qr)
	}
	rep.APSlowdownGeo = round2(geomean(ratios))
	rep.InvariantChecks = pr.checks
	rep.InvariantFailures = len(pr.failures)
	rep.Failures = pr.failures
	rep.ProbeErrors = pr.errs
	rep.VisibilityBytes = mem.VisibilityBytes
	rep.Tuples = mem.Tuples
	if mem.Tuples > 0 {
		rep.VisibilityBitsPerTuple = round2(float64(mem.VisibilityBytes) * 8 / float64(mem.Tuples))
	}
	rep.PeakResidentBytes = peak
}

func pct(n, of int) float64 { return round2(100 * float64(n) / float64(of)) }

func round2(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }

func rateText(rate int) string {
	if rate <= 0 {
		return "full speed"
	}
	return fmt.Sprintf("%d rows/s", rate)
}

// status prints one status line per second until ctx ends and returns the
// peak resident memory it saw.
func (p *pipeline) status(ctx context.Context, out io.Writer, cfg Config, pr *probes, start time.Time) int64 {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var peak int64
	lastRows, lastAt := p.srv.IngestStats().Committed, time.Now()
	for {
		select {
		case <-ctx.Done():
			if cfg.Interactive {
				fmt.Fprintln(out)
			}
			return peak
		case <-tick.C:
		}
		st := p.srv.IngestStats()
		now := time.Now()
		rate := float64(st.Committed-lastRows) / now.Sub(lastAt).Seconds()
		lastRows, lastAt = st.Committed, now
		elapsed := time.Since(start)
		recent := pr.freshSince(elapsed - 10*time.Second)
		lag := time.Duration(0)
		if st.LastSourceMS > 0 {
			lag = max(0, now.Sub(time.UnixMilli(st.LastSourceMS)))
		}
		var hwmLag uint64
		if w, err := p.srv.Node.Txn.Watermarks(ctx); err == nil {
			hwmLag = w.Next - w.HWM
		}
		rss := residentBytes()
		peak = max(peak, rss)
		pr.mu.Lock()
		checks, failed := pr.checks, len(pr.failures)
		pr.mu.Unlock()
		line := fmt.Sprintf("%4.0fs  %7.0f rows/s  fresh p50 %6.1f ms p99 %6.1f ms  replay lag %4d ms  hwm lag %3d  mem %4d MiB  checks %d ok %d failed",
			elapsed.Seconds(), rate, ms(percentile(recent, 50)), ms(percentile(recent, 99)), lag.Milliseconds(), hwmLag, rss>>20, checks-failed, failed)
		if cfg.Interactive {
			frac := min(1, elapsed.Seconds()/cfg.Duration.Seconds())
			bar := strings.Repeat("█", int(frac*20)) + strings.Repeat("·", 20-int(frac*20))
			fmt.Fprintf(out, "\r\x1b[K%s %s", bar, line)
		} else {
			fmt.Fprintln(out, line)
		}
	}
}

// Print writes the human-readable report.
func (rep *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\n=== Retina demo report ===\n")
	fmt.Fprintf(w, "base data      SF %g, %d rows loaded in %.1f s (%.0f rows/s)\n", rep.ScaleFactor, rep.BaseRows, rep.LoadSeconds, rep.LoadRowsPerSec)
	reached := "full speed"
	if rep.TargetRowsPerSec > 0 {
		reached = fmt.Sprintf("%.1f%% of the %s target", rep.TargetPct, rateText(rep.TargetRowsPerSec))
	}
	fmt.Fprintf(w, "change stream  %d transactions, %d row changes in %.1f s: %.0f rows/s, %s\n",
		rep.Transactions, rep.RowsChanged, rep.StreamSeconds, rep.RowsPerSec, reached)
	fmt.Fprintf(w, "               mix: %.1f%% updates, %.1f%% inserts, %.1f%% deletes\n", rep.UpdatesPct, rep.InsertsPct, rep.DeletesPct)
	fmt.Fprintf(w, "freshness      P50 %.1f ms, P99 %.1f ms, max %.1f ms over %d probes\n", rep.FreshnessP50ms, rep.FreshnessP99ms, rep.FreshnessMaxms, rep.FreshnessSamples)
	fmt.Fprintf(w, "AP queries     %-18s %10s %14s %6s %6s\n", "query", "static ms", "under change", "runs", "ratio")
	for _, q := range rep.Queries {
		fmt.Fprintf(w, "               %-18s %10.1f %14.1f %6d %6.2f\n", q.Name, q.StaticMs, q.UnderChangeMs, q.Runs, q.Ratio)
	}
	fmt.Fprintf(w, "               geometric-mean slowdown under change: %.2f\n", rep.APSlowdownGeo)
	fmt.Fprintf(w, "invariants     %d checks, %d passed, %d failed\n", rep.InvariantChecks, rep.InvariantChecks-rep.InvariantFailures, rep.InvariantFailures)
	for _, f := range rep.Failures {
		fmt.Fprintf(w, "               FAILED: %s\n", f)
	}
	for _, e := range rep.ProbeErrors {
		fmt.Fprintf(w, "               probe error: %s\n", e)
	}
	fmt.Fprintf(w, "visibility     %d bytes for %d tuples: %.2f bits/tuple\n", rep.VisibilityBytes, rep.Tuples, rep.VisibilityBitsPerTuple)
	if rep.Tuples > 0 {
		fmt.Fprintf(w, "storage        %d live rows in %d stored versions: %.0f%% are stale versions the scans filter out\n",
			rep.LiveRows, rep.Tuples, 100*(1-float64(rep.LiveRows)/float64(rep.Tuples)))
	}
	fmt.Fprintf(w, "memory         peak resident %d MiB\n", rep.PeakResidentBytes>>20)
}

// Write saves report.json and freshness.svg in dir.
func (rep *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	return writeChart(filepath.Join(dir, "freshness.svg"), rep)
}
