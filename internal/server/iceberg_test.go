package server_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/decimal128"
	icerest "github.com/apache/iceberg-go/catalog/rest"
	icetable "github.com/apache/iceberg-go/table"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/iceberg/rest"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// Every type a Retina column can have, in the table the Iceberg tests
// publish; "extra" is added half-way through a history.
var icebergColumns = []catalog.Column{
	{Name: "id", Type: types.Of(types.Int64)},
	{Name: "i8", Type: types.Of(types.Int8), Nullable: true},
	{Name: "i16", Type: types.Of(types.Int16), Nullable: true},
	{Name: "i32", Type: types.Of(types.Int32), Nullable: true},
	{Name: "f32", Type: types.Of(types.Float32), Nullable: true},
	{Name: "f64", Type: types.Of(types.Float64), Nullable: true},
	{Name: "amount", Type: types.DecimalOf(12, 2), Nullable: true},
	{Name: "name", Type: types.Of(types.String), Nullable: true},
	{Name: "blob", Type: types.Of(types.Bytes), Nullable: true},
	{Name: "flag", Type: types.Of(types.Bool), Nullable: true},
	{Name: "day", Type: types.Of(types.Date), Nullable: true},
	{Name: "at", Type: types.Of(types.Timestamp), Nullable: true},
	{Name: "attz", Type: types.Of(types.TimestampTZ), Nullable: true},
}

// icebergRow is a random row of the table (NULLs now and then), with
// width columns.
func icebergRow(rng *rand.Rand, id int64, width int) []any {
	row := []any{id, int64(rng.IntN(255) - 128), int64(rng.IntN(65535) - 32768), int64(rng.Int32()), float64(float32(rng.NormFloat64() * 100)),
		rng.NormFloat64() * 1e6, decimal128.FromI64(rng.Int64N(1e10) - 5e9), fmt.Sprintf("name %d é%d", id, rng.IntN(1000)),
		[]byte{byte(rng.IntN(256)), 0, byte(id)}, rng.IntN(2) == 0, types.DateDays(rng.IntN(40000) - 10000),
		types.TimestampMicros(rng.Int64N(4e15) - 1e15), types.TimestampMicros(rng.Int64N(4e15))}
	for i := 1; i < len(row); i++ {
		if rng.IntN(10) == 0 {
			row[i] = nil
		}
	}
	if width > len(row) {
		var extra any = fmt.Sprintf("extra %d", rng.IntN(100))
		if rng.IntN(4) == 0 {
			extra = nil
		}
		row = append(row, extra)
	}
	return row
}

// TestIcebergSnapshotsEqualSQL: through a random history of inserts,
// updates, deletes, primary-key changes, truncates, an added column and
// storage-GC rewrites, every Iceberg snapshot Retina publishes reads, with
// Apache iceberg-go through the REST catalog, exactly what Retina's SQL
// returns at the snapshot's timestamp (time travel); both format versions.
func TestIcebergSnapshotsEqualSQL(t *testing.T) {
	for _, version := range []int{2, 3} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			h := openIcebergNode(t, version)
			rng := rand.New(rand.NewPCG(uint64(version), 42))
			tb := servertest.CreateTable(t, h.n, "everything", icebergColumns, "id")
			model := map[int64][]any{}
			nextID, width := int64(0), len(icebergColumns)
			var published []publishedAt
			for step := range 14 {
				if step == 7 {
					var err error
					if tb, err = h.n.Catalog.AddColumn(h.ctx, tb.ID, catalog.Column{Name: "extra", Type: types.Of(types.String), Nullable: true}); err != nil {
						t.Fatal(err)
					}
					width++
				}
				for range 1 + rng.IntN(3) {
					var ops []change.Op
					if step == 10 && len(ops) == 0 {
						ops = append(ops, change.Op{Table: tb.ID, Kind: change.Truncate})
						clear(model)
					}
					n := 3 + rng.IntN(12) // small steps leave earlier pieces as they are
					if step%3 == 0 {
						n = 150 + rng.IntN(100)
					}
					for range n {
						ids := slicesKeys(model)
						switch k := rng.IntN(10); {
						case k < 5 || len(ids) == 0:
							row := icebergRow(rng, nextID, width)
							nextID++
							ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: row})
							model[row[0].(int64)] = row
						case k < 8:
							id := ids[rng.IntN(len(ids))]
							row := icebergRow(rng, id, width)
							ops = append(ops, change.Op{Table: tb.ID, Kind: change.Update, Row: row})
							model[id] = row
						case k < 9:
							id := ids[rng.IntN(len(ids))]
							ops = append(ops, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{id}})
							delete(model, id)
						default: // a new primary key
							id := ids[rng.IntN(len(ids))]
							row := icebergRow(rng, nextID, width)
							nextID++
							ops = append(ops, change.Op{Table: tb.ID, Kind: change.Update, Key: []any{id}, Row: row})
							delete(model, id)
							model[row[0].(int64)] = row
						}
					}
					servertest.Apply(t, h.n, ops...)
				}
				if step%4 == 3 {
					if err := h.n.StorageGCRound(h.ctx); err != nil {
						t.Fatal(err)
					}
				}
				p := h.publish(t)
				published = append(published, p)
				h.compare(t, p, tb.Name, fmt.Sprintf("step %d", step))
			}
			// The snapshots still listed read as they did.
			md := h.loadTable(t, tb.Name).Metadata()
			checked := 0
			for _, p := range published {
				if md.SnapshotByID(p.id) != nil {
					h.compare(t, p, tb.Name, fmt.Sprintf("publication %d again", p.id))
					checked++
				}
			}
			if checked < 2 {
				t.Fatalf("only %d of %d snapshots are still listed", checked, len(published))
			}
		})
	}
}

// TestIcebergKeepsWhatRetainedSnapshotsName: storage GC replaces a file
// an earlier snapshot names; its catalog entry goes, its object stays while
// the snapshot is retained (the snapshot still reads exactly what Retina
// read at its timestamp), and goes with the snapshot.
func TestIcebergKeepsWhatRetainedSnapshotsName(t *testing.T) {
	ctx := context.Background()
	h := openIcebergNodeWith(t, 3, 3*time.Second, 0)
	tb := servertest.CreateTable(t, h.n, "account", []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)}, {Name: "balance", Type: types.Of(types.Int64)},
	}, "id")
	var ops []change.Op
	for id := range int64(1100) { // two regular files of 512 rows and a filling one
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{id, id * 10}})
	}
	servertest.Apply(t, h.n, ops...)
	regular := waitRegular(t, h.n, tb.ID, 2)
	old := regular[0]
	first := h.publish(t)

	ops = ops[:0]
	for id := range int64(460) { // most of the first file
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{id}})
	}
	servertest.Apply(t, h.n, ops...)
	if err := h.n.StorageGCRound(ctx); err != nil {
		t.Fatal(err)
	}
	h.publish(t) // its checkpoint switches the rewrite in
	// LWM passes the switch once something commits after it.
	servertest.Apply(t, h.n, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(5001), int64(1)}})
	if err := h.n.StorageGCRound(ctx); err != nil { // drops the replaced file
		t.Fatal(err)
	}
	if f, ok := h.n.Catalog.Snapshot().File(old.ID); ok {
		t.Fatalf("storage GC did not drop file %d (%s)", old.ID, f.State)
	}
	if _, err := h.n.Lake.Size(ctx, old.Key); err != nil {
		t.Fatalf("the object of file %d, which a retained snapshot names, is gone: %v", old.ID, err)
	}
	at, err := h.loadTable(t, tb.Name).Scan(icetable.WithSnapshotID(first.id)).ToArrowTable(ctx)
	if err != nil {
		t.Fatalf("scan the first snapshot after storage GC: %v", err)
	}
	var want []string
	for id := range int64(1100) {
		want = append(want, fmt.Sprintf("%d|%d", id, id*10))
	}
	slices.Sort(want)
	got := arrowRows(t, at)
	at.Release()
	if !slices.Equal(got, want) {
		t.Fatalf("the first snapshot reads %d rows after storage GC, want %d:\n%s", len(got), len(want), firstDiff(got, want))
	}

	time.Sleep(3 * time.Second) // past the retention
	servertest.Apply(t, h.n, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(5000), int64(1)}})
	h.publish(t)
	if md := h.loadTable(t, tb.Name).Metadata(); md.SnapshotByID(first.id) != nil {
		t.Fatalf("snapshot %d is still listed past the retention", first.id)
	}
	if _, err := h.n.Lake.Size(ctx, old.Key); !errors.Is(err, lake.ErrNotFound) {
		t.Fatalf("the object of file %d outlived the last snapshot naming it: %v", old.ID, err)
	}
}

func slicesKeys(m map[int64][]any) []int64 {
	out := make([]int64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// icebergNode is a node that publishes, with time travel on, a REST
// catalog and an iceberg-go client of it.
type icebergNode struct {
	n   *server.Node
	ctx context.Context
	cat *icerest.Catalog
}

type publishedAt struct {
	id int64
	ts uint64
}

func openIcebergNode(t *testing.T, version int) *icebergNode {
	t.Helper()
	return openIcebergNodeWith(t, version, 10*time.Minute, 15*time.Minute)
}

// openIcebergNodeWith opens a node with a snapshot retention and a
// time-travel history (0: none; LWM then follows the queries and storage
// GC can rewrite).
func openIcebergNodeWith(t *testing.T, version int, retention, history time.Duration) *icebergNode {
	t.Helper()
	dir := t.TempDir()
	n := servertest.OpenNodeTuned(t, func(c *server.NodeConfig) {
		c.DataDir, c.Lake = filepath.Join(dir, "data"), "file://"+filepath.Join(dir, "lake")
		c.BlockRows, c.FileBlocks = 32, 16
		c.QueryHistory = history
		c.StorageGC = server.StorageGCConfig{StaleShare: 0.2}
		c.Iceberg = server.IcebergConfig{Interval: time.Second, FormatVersion: version, Retention: retention}
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := n.Engine.TickHistory(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	go n.RunHistory(ctx)
	go n.Iceberg.Run(ctx)
	srv := httptest.NewServer(rest.New(n.Iceberg, rest.Options{NoUsers: true}))
	t.Cleanup(srv.Close)
	cat, err := icerest.NewCatalog(ctx, "retina", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &icebergNode{n: n, ctx: ctx, cat: cat}
}

// publish takes a replay checkpoint and waits until the publisher made it
// current.
func (h *icebergNode) publish(t *testing.T) publishedAt {
	t.Helper()
	w, err := h.n.Txn.Watermarks(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkpointNow(h.n); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		id, ts := h.n.Iceberg.Current()
		if ts == w.HWM-1 {
			return publishedAt{id, ts}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the checkpoint at %d was not published in 30s (current: publication %d at %d; stats %+v)", w.HWM-1, id, ts, h.n.Iceberg.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *icebergNode) loadTable(t *testing.T, name string) *icetable.Table {
	t.Helper()
	tbl, err := h.cat.LoadTable(h.ctx, icetable.Identifier{"public", name})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// compare reads the table's snapshot p with iceberg-go and Retina's SQL at
// p's timestamp.
func (h *icebergNode) compare(t *testing.T, p publishedAt, name, when string) {
	t.Helper()
	tbl := h.loadTable(t, name)
	snap := tbl.Metadata().SnapshotByID(p.id)
	if snap == nil {
		t.Fatalf("%s: table %s has no snapshot %d", when, name, p.id)
	}
	if got := snap.Summary.Properties["retina.snapshot-ts"]; got != fmt.Sprint(p.ts) {
		t.Fatalf("%s: snapshot %d says retina.snapshot-ts %s, want %d", when, p.id, got, p.ts)
	}
	at, err := tbl.Scan(icetable.WithSnapshotID(p.id)).ToArrowTable(h.ctx)
	if err != nil {
		t.Fatalf("%s: iceberg-go scan of snapshot %d: %v", when, p.id, err)
	}
	defer at.Release()
	schema := tbl.Metadata().SnapshotByID(p.id).SchemaID
	var cols []string
	for _, f := range at.Schema().Fields() {
		cols = append(cols, f.Name)
	}
	got := arrowRows(t, at)
	want := sqlRowsAt(t, h.n, p.ts, name, cols)
	if !slices.Equal(got, want) {
		t.Fatalf("%s: snapshot %d (schema %v) has %d rows, Retina's SQL at %d has %d:\n%s", when, p.id, *schema, len(got), p.ts, len(want), firstDiff(got, want))
	}
}

func firstDiff(got, want []string) string {
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return fmt.Sprintf("row %d:\n iceberg: %s\n     sql: %s", i, g, w)
		}
	}
	return ""
}

// arrowRows renders every row of an iceberg-go scan, sorted.
func arrowRows(t *testing.T, at arrow.Table) []string {
	t.Helper()
	var out []string
	tr := array.NewTableReader(at, 1024)
	defer tr.Release()
	for tr.Next() {
		rec := tr.RecordBatch()
		for i := range int(rec.NumRows()) {
			var cells []string
			for c := range int(rec.NumCols()) {
				cells = append(cells, arrowCell(t, rec.Column(c), i))
			}
			out = append(out, strings.Join(cells, "|"))
		}
	}
	slices.Sort(out)
	return out
}

func arrowCell(t *testing.T, a arrow.Array, i int) string {
	if a.IsNull(i) {
		return "NULL"
	}
	switch a := a.(type) {
	case *array.Int32:
		return fmt.Sprint(a.Value(i))
	case *array.Int64:
		return fmt.Sprint(a.Value(i))
	case *array.Float32:
		return fmt.Sprint(float64(a.Value(i)))
	case *array.Float64:
		return fmt.Sprint(a.Value(i))
	case *array.Decimal128:
		return a.Value(i).ToString(a.DataType().(*arrow.Decimal128Type).Scale)
	case *array.String:
		return a.Value(i)
	case *array.Binary:
		return fmt.Sprintf("%X", a.Value(i))
	case *array.Boolean:
		return fmt.Sprint(a.Value(i))
	case *array.Date32:
		return a.Value(i).ToTime().Format("2006-01-02")
	case *array.Timestamp:
		return fmt.Sprint(int64(a.Value(i)))
	}
	t.Fatalf("unexpected Arrow type %s", a.DataType())
	return ""
}

// sqlRowsAt renders the table's rows over SQL at snapshot ts (time
// travel), sorted, each column as arrowCell renders it.
func sqlRowsAt(t *testing.T, n *server.Node, ts uint64, name string, cols []string) []string {
	t.Helper()
	ctx := context.Background()
	sess, err := n.Engine.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	run := func(sql string) [][]any {
		res, err := sess.Run(ctx, sql)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		defer res.Close()
		var out [][]any
		for res.Next() {
			v, err := res.Values()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, slices.Clone(v))
		}
		if err := res.Err(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return out
	}
	run(fmt.Sprintf("SET retina.as_of = '%d'", ts))
	var exprs []string
	for _, c := range cols {
		q := `"` + c + `"`
		switch c {
		case "amount", "day":
			exprs = append(exprs, "CAST("+q+" AS VARCHAR)")
		case "blob":
			exprs = append(exprs, "upper(hex(blob))")
		case "at", "attz":
			exprs = append(exprs, "epoch_us("+q+")")
		default:
			exprs = append(exprs, q)
		}
	}
	var out []string
	for _, v := range run("SELECT " + strings.Join(exprs, ", ") + " FROM " + name) {
		cells := make([]string, len(v))
		for i, c := range v {
			switch c := c.(type) {
			case nil:
				cells[i] = "NULL"
			case float32:
				cells[i] = fmt.Sprint(float64(c))
			default:
				cells[i] = fmt.Sprint(c)
			}
		}
		out = append(out, strings.Join(cells, "|"))
	}
	slices.Sort(out)
	return out
}
