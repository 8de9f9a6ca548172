package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/retinadb/retina/internal/cdc/mysql"
	"github.com/retinadb/retina/internal/cdc/postgres"
	"github.com/retinadb/retina/internal/console"
	"github.com/retinadb/retina/internal/sink"
	"github.com/retinadb/retina/internal/txn"
	"github.com/retinadb/retina/internal/writebuffer"
)

// handler serves /metrics (Prometheus text format), /healthz and the Go
// runtime's profiles under /debug/pprof/.
func (s *Server) handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.registerMetrics(reg)
	s.registerIcebergMetrics(reg)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.Failure(); err != nil {
			http.Error(w, "ingestion stopped: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// Profiles for diagnosing a running server, on the metrics address
	// (loopback unless configured otherwise).
	s.console.Register(mux, console.HandlerOptions{Users: s.consoleUsers})
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}

// sourceGauge returns what registers a gauge of one source's statistics,
// labelled with the source's name. A metric has one help text whatever
// the kind of source (the registry refuses two).
func sourceGauge[S any](reg *prometheus.Registry, src *source, stats func() S) func(name, help string, f func(S) float64) {
	labels := prometheus.Labels{"source": sourceName(src.uri)}
	return func(name, help string, f func(S) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "retina", Name: name, Help: help, ConstLabels: labels},
			func() float64 { return f(stats()) }))
	}
}

// copyFigures are the initial-copy figures of every database source.
type copyFigures struct{ rows, estimate, tables, tablesDone, reconnects int64 }

// copyGauges registers a database source's initial-copy gauges.
func copyGauges[S any](gauge func(name, help string, f func(S) float64), fig func(S) copyFigures) {
	gauge("source_snapshot_rows", "Rows of the initial copy delivered so far.", func(st S) float64 { return float64(fig(st).rows) })
	gauge("source_snapshot_rows_estimate", "Rows the server estimates the copied tables hold (for the copy's ETA).",
		func(st S) float64 { return float64(fig(st).estimate) })
	gauge("source_snapshot_tables", "Tables the initial copy covers.", func(st S) float64 { return float64(fig(st).tables) })
	gauge("source_snapshot_tables_done", "Tables the initial copy has finished.", func(st S) float64 { return float64(fig(st).tablesDone) })
	gauge("source_reconnects", "Replication sessions started again after a failure.", func(st S) float64 { return float64(fig(st).reconnects) })
}

// registerSourceMetrics adds the figures of each PostgreSQL source,
// labelled with its name.
func (s *Server) registerSourceMetrics(reg *prometheus.Registry) {
	for i, src := range s.sources {
		if src.pg == nil {
			continue
		}
		gauge := sourceGauge(reg, src, src.pg.Stats)
		applied := func(st postgres.Stats) uint64 {
			if off, ok := s.sink.Applied(i, src.pg.Stream()); ok {
				return uint64(off)
			}
			return st.Confirmed
		}
		gauge("source_lag_bytes", "WAL the server has written that Retina has not yet applied (server WAL end minus the applied position).", func(st postgres.Stats) float64 {
			return float64(st.ServerWALEnd - min(st.ServerWALEnd, applied(st)))
		})
		gauge("source_lag_seconds", "Now minus the commit time of the newest applied transaction while received transactions wait to be applied, else 0.", func(st postgres.Stats) float64 {
			if applied(st) >= st.Received {
				return 0
			}
			newest := s.IngestStats().LastSourceMS
			if newest == 0 {
				return 0
			}
			return max(0, float64(time.Now().UnixMilli()-newest)/1000)
		})
		gauge("source_slot_retained_bytes", "WAL the replication slot keeps on the server (current position minus restart_lsn; polled every 10 s).",
			func(st postgres.Stats) float64 { return float64(st.SlotRetainedBytes) })
		gauge("source_confirmed_lsn", "Flush LSN the slot was told: what a durable replay checkpoint covers.",
			func(st postgres.Stats) float64 { return float64(st.Confirmed) })
		copyGauges(gauge, func(st postgres.Stats) copyFigures {
			return copyFigures{st.SnapshotRows, st.SnapshotRowsEstimate, st.SnapshotTables, st.SnapshotTablesDone, st.Reconnects}
		})
	}
}

// registerMySQLMetrics adds the figures of each MySQL or MariaDB source,
// labelled with its name.
func (s *Server) registerMySQLMetrics(reg *prometheus.Registry) {
	for _, src := range s.sources {
		if src.my == nil {
			continue
		}
		gauge := sourceGauge(reg, src, src.my.Stats)
		gauge("source_lag_seconds", "Now minus the commit time of the newest applied transaction while received transactions wait to be applied, else 0.", func(st mysql.Stats) float64 {
			newest := s.IngestStats().LastSourceMS
			if newest == 0 || st.LastCommit.UnixMilli() <= newest {
				return 0
			}
			return max(0, float64(time.Now().UnixMilli()-newest)/1000)
		})
		gauge("source_transactions", "Source transactions received from the binlog since the start.", func(st mysql.Stats) float64 { return float64(st.Transactions) })
		copyGauges(gauge, func(st mysql.Stats) copyFigures {
			return copyFigures{st.SnapshotRows, st.SnapshotRowsEstimate, st.SnapshotTables, st.SnapshotTablesDone, st.Reconnects}
		})
	}
}

func (s *Server) registerMetrics(reg *prometheus.Registry) {
	s.registerSourceMetrics(reg)
	s.registerMySQLMetrics(reg)
	watermark := func(pick func(w txn.Watermarks) float64) func() float64 {
		return func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			w, err := s.Node.Txn.Watermarks(ctx)
			if err != nil {
				return 0
			}
			return pick(w)
		}
	}
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "retina", Name: name, Help: help}, f))
	}
	counter := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "retina", Name: name, Help: help}, f))
	}
	gauge("hwm", "High watermark: every timestamp below it is committed or abandoned.", watermark(func(w txn.Watermarks) float64 { return float64(w.HWM) }))
	gauge("lwm", "Low watermark: every query snapshot below it has ended.", watermark(func(w txn.Watermarks) float64 { return float64(w.LWM) }))
	gauge("next_timestamp", "Next mirror timestamp to be handed out.", watermark(func(w txn.Watermarks) float64 { return float64(w.Next) }))
	gauge("hwm_lag", "Timestamps handed out but not yet visible (next - hwm).", watermark(func(w txn.Watermarks) float64 { return float64(w.Next - w.HWM) }))
	gauge("running_queries", "Queries holding a snapshot.", watermark(func(w txn.Watermarks) float64 { return float64(w.Running) }))

	sinks := func(pick func(st sink.Stats) float64) func() float64 {
		return func() float64 { return pick(s.IngestStats()) }
	}
	counter("source_messages_total", "Source messages read.", sinks(func(st sink.Stats) float64 { return float64(st.Messages) }))
	counter("transactions_applied_total", "Source transactions replayed as mirror transactions.", sinks(func(st sink.Stats) float64 { return float64(st.Transactions) }))
	counter("rows_applied_total", "Row operations handed to the replayers.", sinks(func(st sink.Stats) float64 { return float64(st.Ops) }))
	counter("rows_committed_total", "Row changes of committed transactions, visible to queries (rate() of it is rows/s).", sinks(func(st sink.Stats) float64 { return float64(st.Committed) }))
	counter("duplicates_dropped_total", "Redelivered transactions dropped.", sinks(func(st sink.Stats) float64 { return float64(st.Duplicates) }))
	counter("dead_lettered_total", "Messages set aside under the dead-letter policy.", sinks(func(st sink.Stats) float64 { return float64(st.DeadLettered) }))
	gauge("replay_lag_seconds", "Now minus the source commit time of the newest applied transaction (0 before the first).", func() float64 {
		newest := s.IngestStats().LastSourceMS
		if newest == 0 {
			return 0
		}
		return max(0, float64(time.Now().UnixMilli()-newest)/1000)
	})

	purges := s.Node.Purges()
	counter("index_purges_total", "Index purges run (each drops the versions no running query can see).", func() float64 { return float64(purges.Runs.Load()) })
	counter("index_purged_versions_total", "Index versions dropped by purges.", func() float64 { return float64(purges.Versions.Load()) })
	counter("index_purge_errors_total", "Index purges that failed (the next one retries).", func() float64 { return float64(purges.Errors.Load()) })
	counter("index_purge_seconds_total", "Time spent purging the index.", func() float64 { return float64(purges.Nanos.Load()) / 1e9 })

	gc := s.Node.GCStats()
	counter("storage_gc_rewrites_total", "Storage GC rewrites switched in (each replaces one or more files).", func() float64 { return float64(gc.Rewrites.Load()) })
	counter("storage_gc_files_rewritten_total", "Files storage GC replaced.", func() float64 { return float64(gc.FilesRewritten.Load()) })
	counter("storage_gc_files_dropped_total", "Replaced files whose objects were deleted (no query could read them any more).", func() float64 { return float64(gc.FilesDropped.Load()) })
	counter("storage_gc_versions_dropped_total", "Stale row versions storage GC left behind.", func() float64 { return float64(gc.VersionsDropped.Load()) })
	counter("storage_gc_bytes_reclaimed_total", "Bytes of lake objects storage GC deleted.", func() float64 { return float64(gc.BytesReclaimed.Load()) })
	counter("storage_gc_early_seals_total", "Virtual files sealed before they were full because their versions went stale while they filled.", func() float64 { return float64(gc.EarlySeals.Load()) })
	counter("storage_gc_errors_total", "Storage GC rounds that failed (the next one tries again).", func() float64 { return float64(gc.Errors.Load()) })

	cacheStats := func(f func(writebuffer.CacheStats) float64) func() float64 {
		return func() float64 {
			if s.Node.BlockCache == nil {
				return 0
			}
			return f(s.Node.BlockCache.Stats())
		}
	}
	gauge("block_cache_bytes", "Flushed write-buffer blocks kept decoded in memory for scans.", cacheStats(func(st writebuffer.CacheStats) float64 { return float64(st.Bytes) }))
	counter("block_cache_hits_total", "Flushed blocks a scan read from the block cache.", cacheStats(func(st writebuffer.CacheStats) float64 { return float64(st.Hits) }))
	counter("block_cache_misses_total", "Flushed blocks a scan read from the lake (evicted or never cached).", cacheStats(func(st writebuffer.CacheStats) float64 { return float64(st.Misses) }))

	gauge("combinations_waiting", "Full virtual files waiting for a combination slot (half the cores combine at most); a backlog that keeps growing means files fill faster than they are combined.", func() float64 { return float64(s.Node.Combines.Waiting()) })

	readers := s.Node.Readers()
	counter("visibility_checkpoints_total", "Long-running queries and read transactions whose visibility was checkpointed so they stopped holding LWM.", func() float64 { return float64(readers.Checkpoints.Load()) })
	counter("visibility_checkpoint_errors_total", "Visibility checkpoints that failed (retried).", func() float64 { return float64(readers.Errors.Load()) })
	gauge("visibility_checkpoint_bytes", "Deleted bitmaps held by checkpointed readers.", func() float64 { return float64(readers.FrozenBytes.Load()) })

	counter("checkpoints_total", "Replay checkpoints written (a crash redoes what came after the last one from the sources).",
		sinks(func(st sink.Stats) float64 { return float64(st.Checkpoints) }))
	counter("checkpoint_errors_total", "Replay checkpoints that failed (the one before stays current).",
		sinks(func(st sink.Stats) float64 { return float64(st.CheckpointErrors) }))
	gauge("checkpoint_age_seconds", "Seconds since the last replay checkpoint became durable (since the start before the first one).", func() float64 {
		last := s.IngestStats().LastCheckpoint
		if last.IsZero() {
			last = s.started
		}
		return time.Since(last).Seconds()
	})
	gauge("checkpoint_duration_seconds", "How long the last replay checkpoint took, from seal to durable.",
		sinks(func(st sink.Stats) float64 { return st.CheckpointDuration.Seconds() }))
	gauge("recovery_seconds", "How long the start's restore from the last checkpoint took.", func() float64 { return s.Node.Recovery.Duration.Seconds() })
	gauge("recovered_checkpoint_ts", "Timestamp of the checkpoint the start restored (0: none).", func() float64 { return float64(s.Node.Recovery.Checkpoint) })
	counter("redone_transactions_total", "Transactions redone after a crash: the last process had committed them after its last checkpoint.",
		sinks(func(st sink.Stats) float64 { return float64(st.Redone) }))
	gauge("redoing", "1 while the sources are not yet past where the last process stopped (after a crash), else 0.", sinks(func(st sink.Stats) float64 {
		if st.Redoing {
			return 1
		}
		return 0
	}))
	gauge("redo_seconds", "How long the redo after a crash took, from the pipeline's start (0 while it runs or when there was none).",
		sinks(func(st sink.Stats) float64 { return st.RedoTook.Seconds() }))
	gauge("committed_offset", "Highest source offset of a committed transaction (with one stream: how far the source is applied).",
		sinks(func(st sink.Stats) float64 { return float64(st.CommittedOffset) }))

	buffers := func(pick func(st writebuffer.Stats) float64) func() float64 {
		return func() float64 {
			var v float64
			for _, rp := range s.Node.Replayers {
				v += pick(rp.BufferStats())
			}
			return v
		}
	}
	gauge("visibility_bytes", "Memory held by visibility (delete timestamps and bitmaps).", func() float64 {
		var n int64
		for _, rp := range s.Node.Replayers {
			n += rp.VisibilityBytes()
		}
		return float64(n)
	})
	gauge("write_buffer_bytes", "Memory held by write-buffer blocks.", buffers(func(st writebuffer.Stats) float64 { return float64(st.MemoryBytes) }))
	gauge("write_buffer_unflushed_bytes", "Write-buffer bytes not yet durable in the lake.", buffers(func(st writebuffer.Stats) float64 { return float64(st.UnflushedBytes) }))
	gauge("virtual_files", "Files still made of write-buffer blocks.", buffers(func(st writebuffer.Stats) float64 { return float64(st.VirtualFiles) }))
	counter("blocks_flushed_total", "Write-buffer blocks uploaded to the lake.", buffers(func(st writebuffer.Stats) float64 { return float64(st.Flushed) }))
	counter("files_combined_total", "Virtual files combined into regular files.", buffers(func(st writebuffer.Stats) float64 { return float64(st.Combined) }))
	counter("flush_errors_total", "Failed block uploads or combinations (retried).", buffers(func(st writebuffer.Stats) float64 { return float64(st.FlushErrors) }))
	gauge("pipeline_failed", "1 when a source stopped with an error (see /healthz).", func() float64 {
		if s.Failure() != nil {
			return 1
		}
		return 0
	})
}
