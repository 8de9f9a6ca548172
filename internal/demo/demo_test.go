package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDemoRunsAndReports(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SF, cfg.Rate, cfg.Duration = 0.002, 20_000, 3*time.Second
	cfg.OutDir = t.TempDir()
	var out bytes.Buffer
	cfg.Out = &out
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	// The base data and the end state are always checked; checks during
	// the stream come every second, as many as a loaded machine gets to
	// in three seconds, so they are not counted here.
	if rep.InvariantFailures != 0 || rep.InvariantChecks < 2 {
		t.Fatalf("invariants: %d of %d failed: %v", rep.InvariantFailures, rep.InvariantChecks, rep.Failures)
	}
	if rep.FreshnessSamples == 0 || rep.RowsChanged == 0 || rep.Transactions == 0 || rep.LiveRows == 0 {
		t.Fatalf("report: %+v", rep)
	}
	ran := 0
	for _, q := range rep.Queries {
		if q.StaticMs <= 0 {
			t.Fatalf("query %s has no static time", q.Name)
		}
		ran += q.Runs
	}
	if ran == 0 {
		t.Fatal("no analytical query ran under change")
	}
	if !strings.Contains(out.String(), "=== Retina demo report ===") || strings.Count(out.String(), "rows/s  fresh p50") < 2 {
		t.Fatalf("output:\n%s", out.String())
	}
	svg, err := os.ReadFile(filepath.Join(cfg.OutDir, "freshness.svg"))
	if err != nil || !bytes.Contains(svg, []byte("<svg")) {
		t.Fatalf("chart: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.OutDir, "report.json")); err != nil {
		t.Fatal(err)
	}
}

// TestInvariantCheckCatchesATornTransfer feeds a transaction that credits
// an account without debiting another: the balance check must report it.
func TestInvariantCheckCatchesATornTransfer(t *testing.T) {
	ctx := context.Background()
	p, err := startPipeline(ctx, pipelineConfig{SF: 0.001, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if err := p.load(ctx); err != nil {
		t.Fatal(err)
	}
	if failures, err := p.checkInvariants(ctx); err != nil || len(failures) != 0 {
		t.Fatalf("consistent data reported %v %v", failures, err)
	}
	// The generator's next transaction, minus its second event: a
	// transfer's or move's credit without its debit (or the reverse).
	buf, _ := p.gen.NextTxn(nil, time.Now())
	torn := firstEventOnly(strings.SplitAfter(string(buf), "\n"))
	if _, err := p.pw.Write([]byte(torn)); err != nil {
		t.Fatal(err)
	}
	p.written.Add(1)
	if err := p.waitCommitted(ctx); err != nil {
		t.Fatal(err)
	}
	failures, err := p.checkInvariants(ctx)
	if err != nil || len(failures) == 0 || !strings.Contains(failures[0], "total balance") {
		t.Fatalf("a torn transfer passed the check: %v %v", failures, err)
	}
}

// firstEventOnly keeps a transaction's BEGIN and first event and writes
// the END that matches them.
func firstEventOnly(lines []string) string {
	field := func(line, name string) string {
		v := line[strings.Index(line, `"`+name+`":"`)+len(name)+4:]
		return v[:strings.IndexByte(v, '"')]
	}
	return lines[0] + lines[1] + `{"status":"END","id":"` + field(lines[0], "id") + `","ts_ms":1,"event_count":1,` +
		`"data_collections":[{"data_collection":"hybench.` + field(lines[1], "table") + `","event_count":1}]}` + "\n"
}

// TestSoakRunsAndReports runs a short soak: samples, the held transaction
// and LWM catching up after it, the figures and one chart a series.
func TestSoakRunsAndReports(t *testing.T) {
	cfg := DefaultSoakConfig()
	cfg.SF, cfg.Rate, cfg.Duration, cfg.SampleEvery, cfg.HoldFor = 0.002, 5_000, 3*time.Second, 500*time.Millisecond, time.Second
	cfg.OutDir = t.TempDir()
	var lines []string
	res, err := RunSoak(t.Context(), cfg, func(f string, args ...any) { lines = append(lines, fmt.Sprintf(f, args...)) })
	if err != nil {
		t.Fatalf("%v\n%s", err, strings.Join(lines, "\n"))
	}
	if len(res.Samples) < 3 || len(res.InvariantFailures) != 0 || res.InvariantChecks == 0 {
		t.Fatalf("samples %d, invariants %d checked, failed %v", len(res.Samples), res.InvariantChecks, res.InvariantFailures)
	}
	if res.HoldEndS <= res.HoldStartS {
		t.Fatalf("the held transaction did not run: %+v", res)
	}
	for _, s := range res.Samples {
		if s.RSSBytes <= 0 || s.Versions <= 0 || s.IndexVersions <= 0 {
			t.Fatalf("a sample missing figures: %+v", s)
		}
	}
	for _, k := range []string{"rss_growth_ratio", "lake_to_live_bytes_max", "stale_share_max", "freshness_p99_ms_first_minute",
		"freshness_p99_ms_last_minute", "ap_latency_ratio_last_vs_first", "lwm_lag_max_s", "visibility_bits_per_tuple"} {
		if _, ok := res.Figures[k]; !ok {
			t.Fatalf("figure %s missing from %v", k, res.Figures)
		}
	}
	for _, f := range []string{"report.json", "rss.svg", "lake.svg", "stale.svg", "freshness.svg", "ap.svg", "lwm.svg", "index.svg", "visibility.svg"} {
		if _, err := os.Stat(filepath.Join(cfg.OutDir, f)); err != nil {
			t.Fatal(err)
		}
	}
}
