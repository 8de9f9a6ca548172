package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/retinadb/retina/internal/bench"
)

func newBenchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench <name>",
		Short: "Run a named benchmark; the last line of output is one JSON object of figures",
	}
	cmd.AddCommand(
		benchSubcommand("visibility", "Tile visibility: delete throughput, bitmap latency, memory per tuple after GC",
			bench.DefaultVisibilityConfig(), visibilityFlags, bench.Visibility),
		benchSubcommand("txn", "Transaction service: begin/commit and query throughput in process and over gRPC, reservation latency",
			bench.DefaultTxnConfig(), txnFlags, bench.Txn),
		benchSubcommand("index", "Index service: updates and lookups at random keys, Pebble and memory backends",
			bench.DefaultIndexConfig(), indexFlags, bench.Index),
		benchSubcommand("lake", "Lake file format: write, projected read and visibility filter throughput on file://",
			bench.DefaultLakeConfig(), lakeFlags, bench.Lake),
		benchSubcommand("writebuffer", "Write buffer: rows appended per second with flush and combination running, buffer memory",
			bench.DefaultWriteBufferConfig(), writeBufferFlags, bench.WriteBuffer),
		benchSubcommand("replay", "Replayer: inserts and random updates per second with the memory and Pebble indexes",
			bench.DefaultReplayConfig(), replayFlags, bench.Replay),
		benchSubcommand("sink", "CDC sink: Debezium JSON decoding and file → sink → replayer throughput",
			bench.DefaultSinkConfig(), sinkFlags, bench.Sink),
		benchSubcommand("query", "Query path: visibility-filter overhead, 1% delta slowdown, scan rate vs DuckDB read_parquet",
			bench.DefaultQueryConfig(), queryFlags, bench.Query),
		benchSubcommand("e2e", "End to end on a HyBench-like workload: sustained rows/s, freshness at 100K rows/s, query slowdown under change",
			bench.DefaultE2EConfig(), e2eFlags, bench.E2E),
		benchSubcommand("iceberg", "Iceberg publication: the HyBench-like stream at 50K rows/s published every second; lag, CPU share, file counts, metadata per snapshot, iceberg-go scans equal Retina, ingest slowdown",
			bench.DefaultIcebergConfig(), icebergFlags, bench.Iceberg),
		benchSubcommand("soak", "Steady state: a long run at a steady rate with queries and a held read transaction; memory, lake vs live bytes, stale share, freshness and query latency over time",
			bench.DefaultSoakConfig(), soakFlags, bench.Soak),
		benchSubcommand("postgres", "PostgreSQL source: pgbench -i, the initial copy, pgbench at full speed with a kill and restart of Retina halfway; lag, invariant, tables equal",
			bench.DefaultPostgresConfig(), postgresFlags, bench.Postgres),
		benchSubcommand("mysql", "MySQL/MariaDB source: go-tpc TPC-C prepared on a private MariaDB, the initial copy, TPC-C at full speed with a kill and restart of Retina halfway; lag, consistency conditions in Retina snapshots, tables equal",
			bench.DefaultMySQLConfig(), mysqlFlags, bench.MySQL),
		benchSubcommand("crash", "Crash recovery: kill -9 retina serve again and again on a growing source; rows lost or doubled, invariants, restart time",
			bench.DefaultCrashConfig(), crashFlags, bench.Crash),
		benchSubcommand("skeena", "Skeena two-engine store: the cross-engine layer's overhead on memory-only and storage-only transactions, mixes of accesses across the engines (throughput, aborts, latency)",
			bench.DefaultSkeenaConfig(), skeenaFlags, bench.Skeena),
		benchSubcommand("tpcc", "TPC-C with go-tpc against the OLTP store under each table placement: tpmC and aborts; with HTAP, Retina's freshness and the share of its snapshots that keep TPC-C's consistency conditions",
			bench.DefaultTPCCConfig(), tpccFlags, bench.TPCC),
	)
	return cmd
}

// benchSubcommand makes `retina bench <name>`: flags fill a config, run
// fills a report, and the report's JSON is the last line printed.
func benchSubcommand[C any](name, short string, cfg C, flags func(*pflag.FlagSet, *C),
	run func(context.Context, *bench.Report, C) error) *cobra.Command {
	var cpuProfile, memProfile string
	cmd := &cobra.Command{
		Use:   name,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := bench.NewReport(cmd.OutOrStdout(), name)
			r.Printf("retina bench %s", name)
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			if err := run(cmd.Context(), r, cfg); err != nil {
				return err
			}
			if memProfile != "" {
				if err := writeAllocProfile(memProfile); err != nil {
					return err
				}
			}
			return r.Finish()
		},
	}
	flags(cmd.Flags(), &cfg)
	cmd.Flags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	cmd.Flags().StringVar(&memProfile, "memprofile", "", "write the run's allocations (and the heap at its end) to this file (go tool pprof -sample_index=alloc_space)")
	return cmd
}

func visibilityFlags(f *pflag.FlagSet, cfg *bench.VisibilityConfig) {
	f.IntVar(&cfg.TileSize, "tile-size", cfg.TileSize, "tuples per tile (power of two, 64..4096)")
	f.IntVar(&cfg.Deletes, "deletes", cfg.Deletes, "deletes timed for deletes_per_sec")
	f.IntVar(&cfg.DeleteRows, "delete-rows", cfg.DeleteRows, "row-group size the deletes spread over")
	f.IntVar(&cfg.MemoryRows, "memory-rows", cfg.MemoryRows, "row-group size for the memory figure")
	f.Float64Var(&cfg.DeletedPct, "deleted-pct", cfg.DeletedPct, "percent of tuples deleted for the memory figure")
	f.IntVar(&cfg.BitmapRows, "bitmap-rows", cfg.BitmapRows, "row-group size for the bitmap timings")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
}

func txnFlags(f *pflag.FlagSet, cfg *bench.TxnConfig) {
	f.IntVar(&cfg.Group, "group", cfg.Group, "timestamps per group begin")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "time per throughput figure")
	f.IntVar(&cfg.Workers, "workers", cfg.Workers, "goroutines for the in-process figures (0 = GOMAXPROCS)")
	f.IntVar(&cfg.RPCWorkers, "rpc-workers", cfg.RPCWorkers, "goroutines calling through the gRPC client")
	f.IntVar(&cfg.Reserves, "reserves", cfg.Reserves, "range reservations timed per store")
}

func indexFlags(f *pflag.FlagSet, cfg *bench.IndexConfig) {
	f.IntVar(&cfg.Rows, "rows", cfg.Rows, "live keys loaded before timing")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "time per figure")
	f.IntVar(&cfg.Workers, "workers", cfg.Workers, "goroutines, one bucket of keys each")
	f.IntVar(&cfg.Batch, "batch", cfg.Batch, "updates or lookups per batch")
	f.StringSliceVar(&cfg.Backends, "backends", cfg.Backends, "backends to measure (memory, pebble)")
}

func lakeFlags(f *pflag.FlagSet, cfg *bench.LakeConfig) {
	f.IntVar(&cfg.Rows, "rows", cfg.Rows, "rows written, read and filtered")
	f.Int64Var(&cfg.RowGroupRows, "row-group-rows", cfg.RowGroupRows, "rows per row group")
	f.Float64Var(&cfg.DeletedPct, "deleted-pct", cfg.DeletedPct, "percent of rows marked deleted for the filter figure")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
}

func writeBufferFlags(f *pflag.FlagSet, cfg *bench.WriteBufferConfig) {
	f.IntVar(&cfg.Rows, "rows", cfg.Rows, "rows appended")
	f.IntVar(&cfg.Batch, "batch", cfg.Batch, "rows per Append call")
	f.IntVar(&cfg.SteadyRate, "steady-rate", cfg.SteadyRate, "rows/s of the steady-state memory phase")
	f.DurationVar(&cfg.SteadyFor, "steady-for", cfg.SteadyFor, "length of the steady-state phase")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
}

func replayFlags(f *pflag.FlagSet, cfg *bench.ReplayConfig) {
	f.IntVar(&cfg.Rows, "rows", cfg.Rows, "rows inserted, then updated at random")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the update phase")
	f.IntVar(&cfg.Buckets, "buckets", cfg.Buckets, "parallel Apply streams")
	f.IntVar(&cfg.Batch, "batch", cfg.Batch, "operations per Apply call")
	f.StringSliceVar(&cfg.Backends, "backends", cfg.Backends, "index backends (memory, pebble)")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
}

func sinkFlags(f *pflag.FlagSet, cfg *bench.SinkConfig) {
	f.IntVar(&cfg.DecodeEvents, "decode-events", cfg.DecodeEvents, "events decoded for decode_events_per_sec")
	f.IntVar(&cfg.SinkRows, "rows", cfg.SinkRows, "rows streamed file → sink → replayer")
	f.IntVar(&cfg.TxnRows, "txn-rows", cfg.TxnRows, "rows per source transaction")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
}

func queryFlags(f *pflag.FlagSet, cfg *bench.QueryConfig) {
	f.IntVar(&cfg.Rows, "rows", cfg.Rows, "base rows")
	f.IntVar(&cfg.FileRows, "file-rows", cfg.FileRows, "rows per base file")
	f.Float64Var(&cfg.DeltaPct, "delta-pct", cfg.DeltaPct, "percent of rows updated after the load")
	f.IntVar(&cfg.Runs, "runs", cfg.Runs, "timed runs per figure (median reported)")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
	f.IntVar(&cfg.BlockCacheMiB, "block-cache-mib", cfg.BlockCacheMiB, "MiB of flushed write-buffer blocks kept decoded for scans (0: off)")
}

func e2eFlags(f *pflag.FlagSet, cfg *bench.E2EConfig) {
	f.Float64Var(&cfg.SF, "sf", cfg.SF, "HyBench-like scale factor of the base data")
	f.Float64Var(&cfg.DeltaPct, "delta-pct", cfg.DeltaPct, "percent of the base rows changed before the queries under change")
	f.IntVar(&cfg.APRate, "ap-rate", cfg.APRate, "row changes/s streaming while the queries run under change")
	f.IntVar(&cfg.APReps, "ap-reps", cfg.APReps, "runs per query (median) on static data and under change")
	f.IntVar(&cfg.FreshRate, "fresh-rate", cfg.FreshRate, "row changes/s during the freshness phase")
	f.DurationVar(&cfg.FreshFor, "fresh-for", cfg.FreshFor, "length of the freshness phase")
	f.DurationVar(&cfg.SustainFor, "sustain-for", cfg.SustainFor, "length of the full-speed phase timed for rows_per_sec_sustained")
	f.DurationVar(&cfg.ConsoleFor, "console-for", cfg.ConsoleFor, "length of the phase a client polls the console every second, for console_cpu_share")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
}

func icebergFlags(f *pflag.FlagSet, cfg *bench.IcebergConfig) {
	f.Float64Var(&cfg.SF, "sf", cfg.SF, "HyBench-like scale factor of the base data")
	f.IntVar(&cfg.Rate, "rate", cfg.Rate, "row changes/s while publishing")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the stream while publishing")
	f.DurationVar(&cfg.Interval, "interval", cfg.Interval, "publication interval")
	f.IntVar(&cfg.FormatVersion, "format-version", cfg.FormatVersion, "Iceberg format version (2 or 3)")
	f.DurationVar(&cfg.SustainFor, "sustain-for", cfg.SustainFor, "length of each full-speed phase (publication off, then on)")
	f.DurationVar(&cfg.CheckEvery, "check-every", cfg.CheckEvery, "how often the bank invariants are checked in the published snapshots")
	f.StringVar(&cfg.ProfilePath, "publish-profile", "", "write the CPU profile of the publishing phase here (pprof labels mark the publisher: retina=iceberg)")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
}

func soakFlags(f *pflag.FlagSet, cfg *bench.SoakConfig) {
	f.Float64Var(&cfg.SF, "sf", cfg.SF, "HyBench-like scale factor of the base data")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the change stream")
	f.IntVar(&cfg.Rate, "rate", cfg.Rate, "row changes/s")
	f.DurationVar(&cfg.SampleEvery, "sample-every", cfg.SampleEvery, "sampling interval")
	f.DurationVar(&cfg.HoldFor, "hold", cfg.HoldFor, "how long one explicit read transaction stays open mid-run (0: none)")
	f.StringVar(&cfg.OutDir, "out", cfg.OutDir, "directory for report.json and the SVG charts (empty: none)")
	f.IntVar(&cfg.FileBlocks, "file-blocks", cfg.FileBlocks, "write-buffer blocks per file (0: the server's default)")
	f.BoolVar(&cfg.Growing, "growing", cfg.Growing, "let the history tables grow as HyBench's mix does (default: they keep their base size, a steady state)")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
}

func postgresFlags(f *pflag.FlagSet, cfg *bench.PostgresConfig) {
	f.IntVar(&cfg.Scale, "scale", cfg.Scale, "pgbench scale factor (100,000 accounts each)")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the pgbench run")
	f.IntVar(&cfg.Clients, "clients", cfg.Clients, "pgbench connections")
	f.BoolVar(&cfg.Kill, "kill", cfg.Kill, "SIGKILL Retina halfway through the run and restart it")
	f.DurationVar(&cfg.Heartbeat, "heartbeat", cfg.Heartbeat, "how often a heartbeat row is committed (the lag samples)")
	f.DurationVar(&cfg.CheckEvery, "check-every", cfg.CheckEvery, "how often pgbench's invariant is checked in a Retina snapshot (0: only at the end)")
	f.DurationVar(&cfg.CheckpointInterval, "checkpoint-interval", cfg.CheckpointInterval, "Retina's checkpoint interval")
	f.StringVar(&cfg.Dir, "dir", "", "work directory to use and keep (data directory, Retina's log); default a temporary one")
}

func mysqlFlags(f *pflag.FlagSet, cfg *bench.MySQLConfig) {
	f.IntVar(&cfg.Warehouses, "warehouses", cfg.Warehouses, "TPC-C warehouses")
	f.IntVar(&cfg.Threads, "threads", cfg.Threads, "go-tpc threads")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the TPC-C run")
	f.BoolVar(&cfg.Kill, "kill", cfg.Kill, "SIGKILL Retina halfway through the run and restart it")
	f.DurationVar(&cfg.Heartbeat, "heartbeat", cfg.Heartbeat, "how often a heartbeat row is committed (the lag samples)")
	f.DurationVar(&cfg.CheckEvery, "check-every", cfg.CheckEvery, "how often TPC-C's consistency conditions are checked in a Retina snapshot (0: only at the end)")
	f.DurationVar(&cfg.CheckpointInterval, "checkpoint-interval", cfg.CheckpointInterval, "Retina's checkpoint interval")
	f.StringVar(&cfg.GoTPC, "go-tpc", "", "go-tpc binary (default: on PATH, in GOPATH/bin, or installed)")
	f.StringVar(&cfg.Dir, "dir", "", "work directory to use and keep (data directory, Retina's log); default a temporary one")
}

func crashFlags(f *pflag.FlagSet, cfg *bench.CrashConfig) {
	f.IntVar(&cfg.Trials, "trials", cfg.Trials, "kills and restarts")
	f.StringVar(&cfg.Index, "index", cfg.Index, "index backend of the servers: memory or pebble")
	f.Float64Var(&cfg.SF, "sf", cfg.SF, "HyBench-like scale factor of the base data")
	f.IntVar(&cfg.TxnRate, "txn-rate", cfg.TxnRate, "change transactions/s appended to the source while the trials run")
	f.DurationVar(&cfg.MinUp, "min-up", cfg.MinUp, "shortest time a server serves before its kill")
	f.DurationVar(&cfg.MaxUp, "max-up", cfg.MaxUp, "longest time a server serves before its kill")
	f.Float64Var(&cfg.FailpointShare, "failpoint-share", cfg.FailpointShare, "share of the trials that also arm a failpoint (kill inside a flush, combination, checkpoint or restore)")
	f.DurationVar(&cfg.CheckpointInterval, "checkpoint-interval", cfg.CheckpointInterval, "the servers' checkpoint interval")
	f.Float64Var(&cfg.GCStaleShare, "gc-stale-share", cfg.GCStaleShare, "the servers' storage_gc_stale_share (low, so rewrites happen during the trials)")
	f.StringVar(&cfg.Dir, "dir", "", "work directory to use and keep (source, data directory, servers' log); default a temporary one")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
}

// writeAllocProfile writes the heap profile, whose alloc_space and
// alloc_objects samples cover the whole run.
func writeAllocProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("memory profile %s: %w", path, err)
	}
	return f.Close()
}

func skeenaFlags(f *pflag.FlagSet, cfg *bench.SkeenaConfig) {
	f.IntVar(&cfg.Rows, "rows", cfg.Rows, "rows per table (one table per engine)")
	f.IntVar(&cfg.RowBytes, "row-bytes", cfg.RowBytes, "bytes per row")
	f.IntVar(&cfg.Accesses, "accesses", cfg.Accesses, "record accesses per transaction")
	f.IntVar(&cfg.WritePct, "write-pct", cfg.WritePct, "share of accesses that also update the row (%)")
	f.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent transactions")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of each overhead slice")
	f.DurationVar(&cfg.MixDuration, "mix-duration", cfg.MixDuration, "length of each mix figure's run")
	f.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "slices, engine alone and store side by side, for the overhead ratios")
	f.IntSliceVar(&cfg.Mixes, "mixes", cfg.Mixes, "storage share of accesses (%) for the mix figures")
	f.StringVar(&cfg.Dir, "dir", cfg.Dir, "where to make the data directory (default: a tmpfs if there is one, as the paper does to expose the layer's overhead; a disk path measures the device too)")
}

func tpccFlags(f *pflag.FlagSet, cfg *bench.TPCCConfig) {
	f.IntVar(&cfg.Warehouses, "warehouses", cfg.Warehouses, "TPC-C warehouses")
	f.IntVar(&cfg.Threads, "threads", cfg.Threads, "go-tpc threads (terminals)")
	f.DurationVar(&cfg.Duration, "time", cfg.Duration, "length of each placement's tpcc run")
	f.StringSliceVar(&cfg.Placements, "placements", cfg.Placements, "placements to run: all-memory, all-storage, new-order-opt, payment-opt")
	f.BoolVar(&cfg.HTAP, "htap", cfg.HTAP, "run the store inside retina serve, replicating into Retina, and sample Retina's snapshots")
	f.DurationVar(&cfg.SampleEvery, "sample-every", cfg.SampleEvery, "how often a Retina snapshot is checked (with --htap)")
	f.BoolVar(&cfg.Check, "check", cfg.Check, "run go-tpc check --check-all after prepare and check after the run (minutes each)")
	f.StringVar(&cfg.GoTPC, "go-tpc", cfg.GoTPC, "go-tpc binary (default: on PATH, else go install github.com/pingcap/go-tpc/cmd/go-tpc@"+bench.GoTPCVersion+")")
	f.StringVar(&cfg.Dir, "dir", cfg.Dir, "where to make the data directories (default: the system temp directory)")
	f.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "run the placements this many times, interleaved, and report each one's median tpmC and abort rate (checks in the first round only)")
	f.StringVar(&cfg.KillPlacement, "kill", cfg.KillPlacement, "also run retina serve --mysql-addr as a child under this placement, kill -9 it halfway through a TPC-C run, restart it, and check the store (with --check) and Retina against it")
}
