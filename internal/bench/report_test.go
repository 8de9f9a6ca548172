package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestReportLastLineIsOrderedJSON(t *testing.T) {
	var out bytes.Buffer
	r := NewReport(&out, "demo")
	r.Printf("working %d", 1)
	r.Set("b_figure", 2.5)
	r.Set("a_figure", 7)
	r.Set("b_figure", 3.5) // replaced in place, not appended
	if err := r.Finish(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if lines[0] != "working 1" {
		t.Fatalf("first line %q", lines[0])
	}
	last := lines[len(lines)-1]
	var got map[string]any
	if err := json.Unmarshal([]byte(last), &got); err != nil {
		t.Fatalf("last line is not JSON: %q: %v", last, err)
	}
	if got["benchmark"] != "demo" || got["b_figure"] != 3.5 || got["a_figure"] != 7.0 {
		t.Fatalf("figures: %v", got)
	}
	if strings.Index(last, `"b_figure"`) > strings.Index(last, `"a_figure"`) {
		t.Fatalf("keys not in the order set: %s", last)
	}
}

func TestVisibilityBenchSmall(t *testing.T) {
	cfg := DefaultVisibilityConfig()
	cfg.Deletes, cfg.DeleteRows, cfg.MemoryRows, cfg.BitmapRows = 20_000, 40_960, 409_600, 40_960
	var out bytes.Buffer
	r := NewReport(&out, "visibility")
	if err := Visibility(t.Context(), r, cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"deletes_per_sec", "bitmap_ns_per_tile_clean", "bitmap_ns_per_tile_64pending", "bits_per_tuple_after_gc", "tile_size"} {
		v, ok := r.Get(k)
		if !ok {
			t.Fatalf("figure %s missing:\n%s", k, out.String())
		}
		if f, isFloat := v.(float64); isFloat && f <= 0 {
			t.Fatalf("figure %s = %v", k, v)
		}
	}
}

func TestTxnBenchSmall(t *testing.T) {
	cfg := DefaultTxnConfig()
	cfg.Duration, cfg.Reserves, cfg.RPCWorkers = 200*time.Millisecond, 5, 8
	var out bytes.Buffer
	r := NewReport(&out, "txn")
	if err := Txn(t.Context(), r, cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"inproc_begin_commit_per_sec", "inproc_query_begin_end_per_sec", "grpc_begin_commit_per_sec", "etcd_reserve_ms"} {
		v, ok := r.Get(k)
		if f, isFloat := v.(float64); !ok || !isFloat || f <= 0 {
			t.Fatalf("figure %s = %v:\n%s", k, v, out.String())
		}
	}
}

func TestIndexBenchSmall(t *testing.T) {
	cfg := DefaultIndexConfig()
	cfg.Rows, cfg.Duration, cfg.Batch = 20_000, 200*time.Millisecond, 64
	var out bytes.Buffer
	r := NewReport(&out, "index")
	if err := Index(t.Context(), r, cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"pebble_updates_per_sec", "memory_updates_per_sec", "pebble_lookups_per_sec", "memory_lookups_per_sec", "memory_bytes_per_key"} {
		v, ok := r.Get(k)
		if f, isFloat := v.(float64); !ok || !isFloat || f <= 0 {
			t.Fatalf("figure %s = %v:\n%s", k, v, out.String())
		}
	}
}

func TestLakeBenchSmall(t *testing.T) {
	cfg := DefaultLakeConfig()
	cfg.Rows, cfg.RowGroupRows = 30_000, 8192
	var out bytes.Buffer
	r := NewReport(&out, "lake")
	if err := Lake(t.Context(), r, cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"write_rows_per_sec", "read_rows_per_sec", "filter_rows_per_sec"} {
		v, ok := r.Get(k)
		if f, isFloat := v.(float64); !ok || !isFloat || f <= 0 {
			t.Fatalf("figure %s = %v:\n%s", k, v, out.String())
		}
	}
}

func TestWriteBufferAndReplayBenchSmall(t *testing.T) {
	var out bytes.Buffer
	r := NewReport(&out, "writebuffer")
	wb := DefaultWriteBufferConfig()
	wb.Rows, wb.SteadyFor = 20_000, 300*time.Millisecond
	if err := WriteBuffer(t.Context(), r, wb); err != nil {
		t.Fatal(err)
	}
	rp := DefaultReplayConfig()
	rp.Rows, rp.Duration = 20_000, 300*time.Millisecond
	if err := Replay(t.Context(), r, rp); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"writebuffer_inserts_per_sec", "replay_inserts_per_sec_memory", "replay_updates_per_sec_pebble"} {
		v, ok := r.Get(k)
		if f, isFloat := v.(float64); !ok || !isFloat || f <= 0 {
			t.Fatalf("figure %s = %v:\n%s", k, v, out.String())
		}
	}
	if v, _ := r.Get("buffer_bytes_per_table"); v.(int64) <= 0 {
		t.Fatalf("buffer_bytes_per_table = %v", v)
	}
}

func TestSinkBenchSmall(t *testing.T) {
	cfg := DefaultSinkConfig()
	cfg.DecodeEvents, cfg.SinkRows = 20_000, 5_000
	var out bytes.Buffer
	r := NewReport(&out, "sink")
	if err := Sink(t.Context(), r, cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"decode_events_per_sec", "sink_rows_per_sec"} {
		if v, ok := r.Get(k); !ok || v.(float64) <= 0 {
			t.Fatalf("figure %s = %v", k, v)
		}
	}
}

func TestQueryBenchSmall(t *testing.T) {
	cfg := DefaultQueryConfig()
	cfg.Rows, cfg.FileRows, cfg.Runs = 40_000, 16_384, 1
	var out bytes.Buffer
	r := NewReport(&out, "query")
	if err := Query(t.Context(), r, cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"vfor_overhead_ratio", "delta_slowdown_ratio", "scan_rows_per_sec", "vs_duckdb_native_ratio",
		"vs_duckdb_native_ratio_static", "point_lookup_ms", "selective_scan_ms"} {
		if v, ok := r.Get(k); !ok || v.(float64) <= 0 {
			t.Fatalf("figure %s = %v:\n%s", k, v, out.String())
		}
	}
}

func TestE2EBenchSmall(t *testing.T) {
	cfg := DefaultE2EConfig()
	cfg.SF, cfg.APReps, cfg.FreshFor, cfg.SustainFor, cfg.FreshRate = 0.002, 1, time.Second, time.Second, 20_000
	var out bytes.Buffer
	r := NewReport(&out, "e2e")
	if err := E2E(t.Context(), r, cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"rows_per_sec_sustained", "ap_slowdown_ratio", "visibility_bits_per_tuple"} {
		if v, ok := r.Get(k); !ok || v.(float64) <= 0 {
			t.Fatalf("figure %s = %v:\n%s", k, v, out.String())
		}
	}
	// Freshness may well be 0: a probe's snapshot can hold a transaction
	// the stream stamped after the probe started.
	if v, ok := r.Get("freshness_p99_ms"); !ok || v.(float64) < 0 {
		t.Fatalf("figure freshness_p99_ms = %v:\n%s", v, out.String())
	}
	if v, _ := r.Get("freshness_samples"); v.(int) == 0 {
		t.Fatalf("no freshness samples:\n%s", out.String())
	}
	if v, _ := r.Get("invariant_failures"); v != 0 {
		t.Fatalf("invariant failures: %v\n%s", v, out.String())
	}
	if v, _ := r.Get("invariant_checks"); v.(int) < 2 {
		t.Fatalf("only %v invariant checks", v)
	}
}
