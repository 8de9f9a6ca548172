package query_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/decimal128"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/query"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// everyType is a table with a column of every type, NULLs allowed.
func everyType() []catalog.Column {
	cols := []catalog.Column{{Name: "id", Type: types.Of(types.Int64)}}
	for _, c := range []struct {
		name string
		typ  types.Type
	}{
		{"i8", types.Of(types.Int8)}, {"i16", types.Of(types.Int16)}, {"i32", types.Of(types.Int32)},
		{"i64", types.Of(types.Int64)}, {"f32", types.Of(types.Float32)}, {"f64", types.Of(types.Float64)},
		{"dec", types.DecimalOf(18, 3)}, {"dec38", types.DecimalOf(38, 10)}, {"s", types.Of(types.String)},
		{"b", types.Of(types.Bytes)}, {"ok", types.Of(types.Bool)}, {"d", types.Of(types.Date)},
		{"ts", types.Of(types.Timestamp)}, {"tstz", types.Of(types.TimestampTZ)},
	} {
		cols = append(cols, catalog.Column{Name: c.name, Type: c.typ, Nullable: true})
	}
	return cols
}

func everyTypeRow(rng *rand.Rand, id int64) []any {
	// in picks from [lo, hi], its ends a third of the time.
	in := func(lo, hi int64) int64 {
		if rng.IntN(3) == 0 {
			return []int64{lo, hi}[rng.IntN(2)]
		}
		return lo/2 + rng.Int64N(hi/2-lo/2)
	}
	row := []any{id,
		in(math.MinInt8, math.MaxInt8), in(math.MinInt16, math.MaxInt16), in(math.MinInt32, math.MaxInt32),
		in(math.MinInt64, math.MaxInt64), []float64{0, -1.5, 3.25}[rng.IntN(3)], rng.NormFloat64(),
		decimal128.FromI64(rng.Int64N(1e12) - 5e11), decimal128.FromI64(rng.Int64N(1e15)).Mul(decimal128.FromI64(1e10)),
		fmt.Sprintf("s%d-é", rng.IntN(100)), []byte{byte(rng.IntN(256)), 0, 1}, rng.IntN(2) == 0,
		types.DateDays(rng.Int32N(40000) - 20000), types.TimestampMicros(rng.Int64N(4e15) - 2e15), types.TimestampMicros(rng.Int64N(4e15)),
	}
	for c := 1; c < len(row); c++ {
		if rng.IntN(7) == 0 {
			row[c] = nil
		}
	}
	return row
}

// TestNativeScanMatchesGoScan checks the native path (DuckDB reading the
// regular files, deletes removed by position) against retina_scan over
// every file, at the same snapshots: regular files with and without
// deletes, virtual files, mixed, and transactions that keep reading an old
// snapshot, checkpointed or not, while rows they see are deleted and files
// are combined.
func TestNativeScanMatchesGoScan(t *testing.T) {
	n := servertest.OpenNodeTuned(t, func(c *server.NodeConfig) { c.Lake = "" }) // file:// under the data dir
	ctx := context.Background()
	tb := servertest.CreateTable(t, n, "every", everyType(), "id")
	rng := rand.New(rand.NewPCG(7, 7))
	live := map[int64][]any{}
	nextID := int64(0)
	const columns = "id, i8, i16, i32, i64, f32, f64, dec, dec38, s, b, ok, d, ts, tstz"
	queries := []string{
		"SELECT " + columns + " FROM %s ORDER BY id",
		"SELECT count(*), sum(i64::HUGEINT), sum(dec), min(s), max(ts), count(b) FROM %s",
		"SELECT ok, count(*), round(avg(f64), 9), sum(i16) FROM %s WHERE i32 > 0 GROUP BY ok ORDER BY ok",
	}
	// compare runs each query through the view (native and rest) and
	// through retina_scan alone, in one transaction: the same snapshot.
	compare := func(s *query.Session, round int) [][]any {
		t.Helper()
		var first [][]any
		for i, q := range queries {
			got := queryAll(t, s, fmt.Sprintf(q, "every"))
			want := queryAll(t, s, fmt.Sprintf(q, "retina_scan('every')"))
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("round %d: %s\n view        %v\n retina_scan %v", round, fmt.Sprintf(q, "every"), got, want)
			}
			if i == 0 {
				first = got
			}
		}
		return first
	}
	type held struct {
		s    *query.Session
		rows [][]any
	}
	var open []held
	// A statement prepared once reads each execution's snapshot: DuckDB
	// binds read_parquet's file list again every time.
	prepSession, err := n.Engine.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer prepSession.Close()
	const counted = "SELECT count(*), sum(i32), min(id), max(id) FROM every"
	prepared, err := prepSession.Prepare(ctx, counted)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 30 {
		var ops []change.Op
		for range 1 + rng.IntN(120) {
			ids := slices.Collect(func(yield func(int64) bool) {
				for id := range live {
					if !yield(id) {
						return
					}
				}
			})
			switch k := rng.IntN(10); {
			case k < 5 || len(ids) == 0:
				r := everyTypeRow(rng, nextID)
				live[nextID] = r
				nextID++
				ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: r})
			case k < 8:
				id := ids[rng.IntN(len(ids))]
				r := everyTypeRow(rng, id)
				live[id] = r
				ops = append(ops, change.Op{Table: tb.ID, Kind: change.Update, Row: r})
			default:
				id := ids[rng.IntN(len(ids))]
				delete(live, id)
				ops = append(ops, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{id}})
			}
			if len(ops) > 40 { // one mirror transaction touches a key once
				apply(t, n, ops...)
				ops = nil
			}
		}
		if len(ops) > 0 {
			apply(t, n, ops...)
		}
		if rng.IntN(3) == 0 {
			// Every virtual file becomes regular: the native path's files.
			for _, rp := range n.Replayers {
				if err := rp.Finish(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		res, err := prepSession.Execute(ctx, prepared, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := resultRows(t, res), queryAll(t, prepSession, strings.Replace(counted, "every", "retina_scan('every')", 1)); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("round %d: the prepared statement read %v, retina_scan %v", round, got, want)
		}
		s, err := n.Engine.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		queryAll(t, s, "BEGIN")
		rows := compare(s, round)
		if len(rows) != len(live) {
			t.Fatalf("round %d: %d rows, the model has %d", round, len(rows), len(live))
		}
		open = append(open, held{s, rows})
		if round%4 == 3 {
			// Checkpointed views read their own deleted bitmaps.
			if _, err := n.Engine.CheckpointOldViews(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
		// Older snapshots read the same rows as when they began, though
		// rows they see were deleted or moved to regular files since.
		for i, h := range open {
			if got := compare(h.s, round); fmt.Sprint(got) != fmt.Sprint(h.rows) {
				t.Fatalf("round %d: the transaction begun in round %d now reads %d rows, had %d", round, i, len(got), len(h.rows))
			}
		}
		if len(open) > 3 {
			queryAll(t, open[0].s, "COMMIT")
			open[0].s.Close()
			open = open[1:]
		}
	}
	for _, h := range open {
		h.s.Close()
	}
	if n.Engine.Stats().NativeFiles == 0 {
		t.Fatal("no file was read natively")
	}
}

// TestMostlyDeletedFilesSkipTheNativeReader: a regular file with few rows
// deleted at the snapshot is read by DuckDB's reader (its deleted rows
// anti-joined); once most of its rows are deleted it is read by the Go
// scan instead, and both answer the same rows.
func TestMostlyDeletedFilesSkipTheNativeReader(t *testing.T) {
	n := servertest.OpenNodeTuned(t, func(c *server.NodeConfig) { c.Lake = "" }) // file:// under the data dir
	ctx := context.Background()
	tb := servertest.CreateTable(t, n, "acct", []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "balance", Type: types.Of(types.Int64)},
	}, "id")
	var ops []change.Op
	for id := range int64(200) {
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{id, id * 10}})
	}
	apply(t, n, ops...)
	for _, rp := range n.Replayers {
		if err := rp.Finish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s, err := n.Engine.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// check reads the table through its view and through retina_scan
	// alone, and reports how many files the view read natively.
	check := func(wantRows int64) uint64 {
		t.Helper()
		before := n.Engine.Stats().NativeFiles
		got := queryAll(t, s, "SELECT count(*), sum(balance) FROM acct")
		native := n.Engine.Stats().NativeFiles - before
		want := queryAll(t, s, "SELECT count(*), sum(balance) FROM retina_scan('acct')")
		if fmt.Sprint(got) != fmt.Sprint(want) || got[0][0] != wantRows {
			t.Fatalf("view %v, retina_scan %v, want %d rows", got, want, wantRows)
		}
		return native
	}
	del := func(from, to int64) {
		t.Helper()
		var ops []change.Op
		for id := from; id < to; id++ {
			ops = append(ops, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{id}})
		}
		apply(t, n, ops...)
	}
	if native := check(200); native == 0 {
		t.Fatal("no file was read natively")
	}
	del(0, 40) // a fifth of the rows
	if native := check(160); native == 0 {
		t.Fatal("a file with a fifth of its rows deleted was not read natively")
	}
	del(40, 150) // three quarters
	if native := check(50); native != 0 {
		t.Fatalf("%d mostly deleted files were read natively", native)
	}
}
