package bench

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	_ "github.com/duckdb/duckdb-go/v2" // the native read_parquet reference

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/query"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/writebuffer"
)

// QueryConfig sizes the query benchmark.
type QueryConfig struct {
	Rows     int     // base rows, loaded as regular files
	FileRows int     // rows per file (one row group each)
	DeltaPct float64 // share of rows updated after the load
	Runs     int     // timed runs per figure (the median is reported)
	Seed     uint64
	// BlockCacheMiB keeps flushed write-buffer blocks (the delta's new
	// versions) decoded for scans (0: off, as the server's default).
	BlockCacheMiB int
}

// DefaultQueryConfig loads 10M rows and updates 1%.
func DefaultQueryConfig() QueryConfig {
	return QueryConfig{Rows: 10_000_000, FileRows: 1 << 20, DeltaPct: 1, Runs: 5, Seed: 1, BlockCacheMiB: 64}
}

const benchQuery = `SELECT type, count(*) AS n, sum(amount) AS total, avg(fee) AS fee FROM transfer WHERE NOT flagged GROUP BY type ORDER BY type`

// Query measures a scan+aggregate through the SQL engine on a large table:
// with and without the visibility filter, before and after a 1% delta,
// and DuckDB's own read_parquet over the same files as a reference.
func Query(ctx context.Context, r *Report, cfg QueryConfig) error {
	dir, err := os.MkdirTemp("", "retina-bench-query-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.DiscardHandler)
	n, err := server.OpenNode(ctx, server.NodeConfig{DataDir: dir, Replayers: 1, BlockCacheBytes: int64(cfg.BlockCacheMiB) << 20, Logger: quiet})
	if err != nil {
		return err
	}
	defer n.Close(context.Background())
	tb, err := n.Catalog.CreateTable(ctx, "transfer", catalog.Schema{Columns: transferColumns(), PrimaryKey: []string{"id"}})
	if err != nil {
		return err
	}
	r.Set("rows", cfg.Rows)
	r.Set("query", benchQuery)

	start := time.Now()
	files, err := loadBase(ctx, n, tb, cfg)
	if err != nil {
		return err
	}
	r.Printf("load: %d rows in %d files written, registered and adopted in %.1fs", cfg.Rows, len(files), time.Since(start).Seconds())
	load, err := n.Txn.BeginMirror(ctx, 1) // the load is transaction 1
	if err != nil {
		return err
	}
	if err := n.Txn.CommitMirror(ctx, load.First); err != nil {
		return err
	}
	sess, err := n.Engine.NewSession(ctx)
	if err != nil {
		return err
	}
	defer sess.Close()
	once := func() (time.Duration, error) {
		t0 := time.Now()
		res, err := sess.Run(ctx, benchQuery)
		if err != nil {
			return 0, err
		}
		for res.Next() {
			if _, err := res.Values(); err != nil {
				res.Close()
				return 0, err
			}
		}
		err = res.Err()
		res.Close()
		return time.Since(t0), err
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	var staticRuns []time.Duration
	for range cfg.Runs {
		d, err := once()
		if err != nil {
			return err
		}
		staticRuns = append(staticRuns, d)
	}
	static := median(staticRuns)
	r.Printf("static base data: median %.0f ms", ms(static))

	deletedRows, err := applyDelta(ctx, n, tb, files, cfg)
	deleted := len(deletedRows)
	if err != nil {
		return err
	}
	r.Printf("delta: %d rows updated (old versions deleted in visibility, new versions in the write buffer)", deleted)
	// The delta's flush runs in the background; timing during it would
	// charge its CPU to the first figure measured.
	for _, rp := range n.Replayers {
		if err := rp.Flush(ctx); err != nil {
			return err
		}
	}
	// With and without the visibility check alternate, so a noisy spell on
	// this shared machine hits both figures alike.
	var visRuns, noVisRuns []time.Duration
	cacheBefore := cacheStats(n)
	for range cfg.Runs {
		for _, noVis := range []bool{false, true} {
			n.Scanner.NoVisibility = noVis
			d, err := once()
			n.Scanner.NoVisibility = false
			if err != nil {
				return err
			}
			if noVis {
				noVisRuns = append(noVisRuns, d)
			} else {
				visRuns = append(visRuns, d)
			}
		}
	}
	withVis, noVis := median(visRuns), median(noVisRuns)
	cacheAfter := cacheStats(n)
	native, err := nativeLatency(ctx, strings.TrimPrefix(n.Config.Lake, "file://"), files, cfg.Runs)
	if err != nil {
		return err
	}
	positional, err := nativePositional(ctx, strings.TrimPrefix(n.Config.Lake, "file://"), files, deletedRows, cfg)
	if err != nil {
		return err
	}
	point, err := pointLookups(ctx, sess, cfg)
	if err != nil {
		return err
	}
	selective, err := selectiveScans(ctx, sess, cfg)
	if err != nil {
		return err
	}
	r.Printf("with 1%% delta: median %.0f ms with visibility filtering, %.0f ms without it", ms(withVis), ms(noVis))
	r.Printf("point lookup (id = $1): median %.1f ms; 1%% range of id: median %.0f ms", ms(point), ms(selective))
	r.Printf("DuckDB read_parquet over the same files: median %.0f ms", ms(native))
	r.Printf("the same with the delta as a positional filter (anti-join on file row numbers) and as many new rows: median %.0f ms", ms(positional))
	r.Set("static_ms", math.Round(ms(static)))
	r.Set("delta_ms", math.Round(ms(withVis)))
	r.Set("delta_no_visibility_ms", math.Round(ms(noVis)))
	r.Set("native_read_parquet_ms", math.Round(ms(native)))
	r.Set("native_positional_ms", math.Round(ms(positional)))
	r.Set("native_positional_ratio", math.Round(float64(positional)/float64(native)*1000)/1000)
	r.Set("vfor_overhead_ratio", math.Round(float64(withVis)/float64(noVis)*1000)/1000)
	r.Set("delta_slowdown_ratio", math.Round(float64(withVis)/float64(static)*1000)/1000)
	r.Set("scan_rows_per_sec", math.Round(float64(cfg.Rows)/withVis.Seconds()))
	r.Set("vs_duckdb_native_ratio", math.Round(float64(withVis)/float64(native)*1000)/1000)
	r.Set("vs_duckdb_native_ratio_static", math.Round(float64(static)/float64(native)*1000)/1000)
	r.Set("point_lookup_ms", math.Round(ms(point)*100)/100)
	r.Set("block_cache_mib", cfg.BlockCacheMiB)
	if looked := (cacheAfter.Hits + cacheAfter.Misses) - (cacheBefore.Hits + cacheBefore.Misses); looked > 0 {
		// Of the flushed blocks the runs with the delta read.
		ratio := float64(cacheAfter.Hits-cacheBefore.Hits) / float64(looked)
		r.Printf("block cache: %.0f%% of %d flushed-block reads hit", ratio*100, looked)
		r.Set("block_cache_hit_ratio", math.Round(ratio*1000)/1000)
	}
	r.Set("selective_scan_ms", math.Round(ms(selective)*10)/10)
	return nil
}

// cacheStats are the node's block cache figures (zero without one).
func cacheStats(n *server.Node) writebuffer.CacheStats {
	if n.BlockCache == nil {
		return writebuffer.CacheStats{}
	}
	return n.BlockCache.Stats()
}

// timedQuery runs a prepared statement with args and reads every row.
func timedQuery(ctx context.Context, sess *query.Session, st *query.Statement, args ...any) (time.Duration, int, error) {
	t0 := time.Now()
	res, err := sess.Execute(ctx, st, args)
	if err != nil {
		return 0, 0, err
	}
	defer res.Close()
	n := 0
	for res.Next() {
		n++
	}
	return time.Since(t0), n, res.Err()
}

// pointLookups is the median time of SELECT * … WHERE id = $1 at random
// ids (the primary key), prepared once.
func pointLookups(ctx context.Context, sess *query.Session, cfg QueryConfig) (time.Duration, error) {
	st, err := sess.Prepare(ctx, "SELECT * FROM transfer WHERE id = $1")
	if err != nil {
		return 0, err
	}
	defer st.Close()
	rng := rand.New(rand.NewPCG(cfg.Seed, 7))
	var times []time.Duration
	found, runs := 0, max(cfg.Runs*4, 20)
	for range runs {
		d, n, err := timedQuery(ctx, sess, st, int64(rng.IntN(cfg.Rows)))
		if err != nil {
			return 0, err
		}
		if n > 1 {
			return 0, fmt.Errorf("point lookup: %d rows for one key", n)
		}
		found += n // 0 for the 1% of ids the delta deleted
		times = append(times, d)
	}
	if found < runs*3/4 {
		return 0, fmt.Errorf("point lookup: %d of %d keys found; the base rows are there", found, runs)
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

// selectiveScans is the median time of an aggregate over 1% of the rows,
// a range of id (the load writes ids in order, so the range is clustered).
func selectiveScans(ctx context.Context, sess *query.Session, cfg QueryConfig) (time.Duration, error) {
	st, err := sess.Prepare(ctx, "SELECT count(*), sum(amount) FROM transfer WHERE id >= $1 AND id < $2")
	if err != nil {
		return 0, err
	}
	defer st.Close()
	rng := rand.New(rand.NewPCG(cfg.Seed, 8))
	span := max(cfg.Rows/100, 1)
	var times []time.Duration
	for range cfg.Runs {
		lo := int64(rng.IntN(max(cfg.Rows-span, 1)))
		d, _, err := timedQuery(ctx, sess, st, lo, lo+int64(span))
		if err != nil {
			return 0, err
		}
		times = append(times, d)
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// loadBase writes the base rows as regular files (two writers at a time),
// registers them and gives replayer 0 their visibility.
func loadBase(ctx context.Context, n *server.Node, tb *catalog.Table, cfg QueryConfig) ([]*catalog.File, error) {
	nfiles := (cfg.Rows + cfg.FileRows - 1) / cfg.FileRows
	first, err := n.Catalog.AllocateFileIDs(ctx, nfiles)
	if err != nil {
		return nil, err
	}
	files := make([]*catalog.File, nfiles)
	errs := make([]error, nfiles)
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for i := range nfiles {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			id := first + uint64(i)
			lo, hi := i*cfg.FileRows, min((i+1)*cfg.FileRows, cfg.Rows)
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
			files[i], errs[i] = writeBaseFile(ctx, n, tb, id, lo, hi, rng)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, err
		}
		if err := n.Replayers[0].AdoptFile(ctx, files[i], nil); err != nil {
			return nil, err
		}
	}
	return files, indexBase(ctx, n, tb, files, cfg)
}

// indexBase puts the base rows' keys in the primary index at the load's
// timestamp (1), as replaying them would have: row id = id's file and
// offset.
func indexBase(ctx context.Context, n *server.Node, tb *catalog.Table, files []*catalog.File, cfg QueryConfig) error {
	if _, err := n.Replayers[0].Buffer(tb.ID); err != nil { // defines the table's indexes
		return err
	}
	var b index.Batch
	for id := range cfg.Rows {
		k, err := n.Index.Key(tb.PrimaryIndexID, int64(id))
		if err != nil {
			return err
		}
		b.Put(k, 1, replay.RowID(files[id/cfg.FileRows].ID, uint32(id%cfg.FileRows)))
		if b.Len() == 10_000 || id == cfg.Rows-1 {
			if err := n.Index.Apply(ctx, &b); err != nil {
				return err
			}
			b.Reset()
		}
	}
	return nil
}

func writeBaseFile(ctx context.Context, n *server.Node, tb *catalog.Table, id uint64, lo, hi int, rng *rand.Rand) (*catalog.File, error) {
	schema := lake.FileSchema(TransferSchema())
	var buf bytes.Buffer
	w, err := lake.NewFileWriter(&buf, schema, lake.WriterOptions{RowGroupRows: int64(hi - lo)})
	if err != nil {
		return nil, err
	}
	for _, rec := range transferRecordsRange(rng, lo, hi, func(int) int64 { return 1 }) {
		err = w.Write(rec)
		rec.Release()
		if err != nil {
			return nil, err
		}
	}
	groups, err := w.Close()
	if err != nil {
		return nil, err
	}
	key := writebuffer.RegularKey(tb.ID, id)
	if err := n.Lake.Put(ctx, key, buf.Bytes()); err != nil {
		return nil, err
	}
	return n.Catalog.RegisterFile(ctx, catalog.File{ID: id, TableID: tb.ID, Key: key, State: catalog.Regular, Replayer: 0, RowGroups: groups})
}

// applyDelta updates DeltaPct of the rows: each old version gets a delete
// timestamp in its file's visibility and the new version goes through the
// replayer into the write buffer, all in one mirror transaction.
func applyDelta(ctx context.Context, n *server.Node, tb *catalog.Table, files []*catalog.File, cfg QueryConfig) ([]int, error) {
	rng := rand.New(rand.NewPCG(cfg.Seed, 99))
	k := int(float64(cfg.Rows) * cfg.DeltaPct / 100)
	rg, err := n.Txn.BeginMirror(ctx, 1)
	if err != nil {
		return nil, err
	}
	ts := rg.First
	seen := map[int]bool{}
	var ops []change.Op
	for len(seen) < k {
		row := rng.IntN(cfg.Rows)
		if seen[row] {
			continue
		}
		seen[row] = true
		f := files[row/cfg.FileRows]
		vis, ok := n.Replayers[0].FileVisibility(f.ID)
		if !ok {
			return nil, fmt.Errorf("no visibility for file %d", f.ID)
		}
		if err := vis.Delete(uint32(row%cfg.FileRows), ts); err != nil {
			return nil, err
		}
		ops = append(ops, change.Op{TS: ts, Table: tb.ID, Kind: change.Insert, Row: transferRow(rng, int64(cfg.Rows+len(ops)))})
	}
	for i := 0; i < len(ops); i += 4096 {
		if err := n.Replayers[0].Apply(ctx, replay.Batch{Bucket: 0, Buckets: 1, Ops: ops[i:min(i+4096, len(ops))], Stable: ts}); err != nil {
			return nil, err
		}
	}
	if err := n.Txn.CommitMirror(ctx, ts); err != nil {
		return nil, err
	}
	rows := slices.Collect(maps.Keys(seen))
	slices.Sort(rows)
	return rows, nil
}

// nativePositional measures, in a plain DuckDB, what Retina's native path
// (query/native.go) does: DuckDB's read_parquet of each base file with its
// row numbers, the create_ts filter pushed down, the delta's deleted rows
// removed by an anti-join on (file, row number), and as many new rows as
// the delta inserted (here copies of base rows: the same size and types)
// added. The floor of that path, not a result: the figure for Retina's
// own path is delta_ms.
func nativePositional(ctx context.Context, lakeDir string, files []*catalog.File, deleted []int, cfg QueryConfig) (time.Duration, error) {
	db, err := sql.Open("duckdb", "")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var keys strings.Builder
	for i, row := range deleted {
		if i > 0 {
			keys.WriteByte(',')
		}
		// file index << 32 | row within the file
		fmt.Fprintf(&keys, "%d", int64(row/cfg.FileRows)<<32|int64(row%cfg.FileRows))
	}
	setup := []string{
		"CREATE TABLE deleted AS SELECT unnest([" + keys.String() + "]::BIGINT[]) AS pos",
		fmt.Sprintf("CREATE TABLE delta AS SELECT * EXCLUDE (%s) FROM read_parquet('%s') LIMIT %d", lake.CreateTSColumn, filepath.Join(lakeDir, files[0].Key), len(deleted)),
	}
	for _, q := range setup {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return 0, fmt.Errorf("%s: %w", q[:40], err)
		}
	}
	var scans []string
	for i, f := range files {
		scans = append(scans, fmt.Sprintf("SELECT * EXCLUDE (%s, file_row_number), (%d::BIGINT << 32) + file_row_number AS pos FROM read_parquet('%s', file_row_number = true) WHERE %s <= %d",
			lake.CreateTSColumn, i, filepath.Join(lakeDir, f.Key), lake.CreateTSColumn, math.MaxInt64))
	}
	base := "SELECT * EXCLUDE (pos) FROM (" + strings.Join(scans, " UNION ALL ") + ") b ANTI JOIN deleted d ON b.pos = d.pos"
	from := "(" + base + " UNION ALL SELECT * FROM delta)"
	// Every deleted row is filtered out, not just some: as many rows as
	// the base had.
	var count, kept int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+from).Scan(&count); err != nil {
		return 0, err
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM ("+base+")").Scan(&kept); err != nil {
		return 0, err
	}
	if count != cfg.Rows || kept != cfg.Rows-len(deleted) {
		return 0, fmt.Errorf("positional filter: %d rows with the delta, %d base rows kept; want %d and %d", count, kept, cfg.Rows, cfg.Rows-len(deleted))
	}
	q := strings.Replace(benchQuery, "FROM transfer", "FROM "+from, 1)
	return medianLatency(ctx, db, q, cfg.Runs)
}

// nativeLatency runs the same query with DuckDB's own Parquet reader over
// the base files (the delta is not in them: a reference, not a rival).
func nativeLatency(ctx context.Context, lakeDir string, files []*catalog.File, runs int) (time.Duration, error) {
	db, err := sql.Open("duckdb", "")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = "'" + filepath.Join(lakeDir, f.Key) + "'"
	}
	q := strings.Replace(benchQuery, "FROM transfer", "FROM read_parquet(["+strings.Join(paths, ",")+"])", 1)
	return medianLatency(ctx, db, q, runs)
}

// medianLatency is the median time of runs executions of q, every row read.
func medianLatency(ctx context.Context, db *sql.DB, q string, runs int) (time.Duration, error) {
	var times []time.Duration
	for range runs {
		t0 := time.Now()
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			return 0, err
		}
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return 0, err
		}
		times = append(times, time.Since(t0))
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}
