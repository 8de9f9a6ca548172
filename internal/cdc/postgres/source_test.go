package postgres

import (
	"context"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/jackc/pgx/v5"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/pgtest"
	"github.com/retinadb/retina/internal/types"
)

// startCluster starts a private PostgreSQL for one test.
func startCluster(t *testing.T) *pgtest.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func execSQL(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func openCatalog(t *testing.T) *catalog.Catalog {
	t.Helper()
	cat, err := catalog.Open(filepath.Join(t.TempDir(), "catalog"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	return cat
}

// reader collects a source's records.
type reader struct {
	t   *testing.T
	src *Source
}

// until reads records until stop says so, returning them (Skip records
// included).
func (r reader) until(stop func(cdc.Record) bool) []cdc.Record {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []cdc.Record
	for {
		m, err := r.src.Next(ctx)
		if err != nil {
			r.t.Fatalf("after %d records: %v", len(out), err)
		}
		if m.Record == nil {
			r.t.Fatalf("message at %s without a record", m.Pos)
		}
		out = append(out, *m.Record)
		if stop(*m.Record) {
			return out
		}
	}
}

func copyDone(r cdc.Record) bool { return r.Kind == cdc.Skip && r.Pos.Offset == snapshotDone }
func isEnd(r cdc.Record) bool    { return r.Kind == cdc.End }

func dec(t *testing.T, s string, p, sc int32) decimal128.Num {
	n, err := decimal128.FromString(s, p, sc)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTypesRoundTrip: every type of the mapping arrives with its exact
// value, from the initial copy and from the stream, NULLs included.
func TestTypesRoundTrip(t *testing.T) {
	c := startCluster(t)
	dsn := c.DSN("postgres")
	execSQL(t, dsn,
		`CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')`,
		`CREATE TABLE typed (id int PRIMARY KEY, i2 int2, i4 int4, i8 int8, n numeric(12,3), nu numeric, f4 float4, f8 float8,
			b bool, t text, v varchar(10), ch char(4), by bytea, d date, tm time, ts timestamp, tz timestamptz, iv interval,
			u uuid, j json, jb jsonb, e mood, a int[])`,
		`INSERT INTO typed VALUES (1, -32768, 2147483647, -9223372036854775808, -123456789.125, 3.14159265358979323846264338327950288419716939937510,
			1.5, 0.1, true, 'tab	and ''quote'' \ and
newline', 'varchar', 'ab', '\x00ff5c0a', '1969-07-20', '13:45:01.5', '2024-02-29 23:59:59.999999', '2024-02-29 23:59:59.5+02',
			'1 year 2 mons 3 days 04:05:06', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2]}', '{"b": null}', 'happy', '{1,NULL,3}')`,
		`INSERT INTO typed (id) VALUES (2)`,
	)
	opts, err := ParseURI(dsn + "&slot=types&publication=types")
	if err != nil {
		t.Fatal(err)
	}
	cat := openCatalog(t)
	ctx := context.Background()
	src, err := Open(ctx, opts, Config{Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	r := reader{t, src}
	recs := r.until(copyDone)
	tb, ok := cat.Snapshot().Table("typed")
	if !ok {
		t.Fatal("table typed was not created")
	}
	wantTypes := []string{"int32", "int16", "int32", "int64", "decimal(12,3)", "string", "float32", "float64", "bool", "string", "string", "string",
		"bytes", "date", "string", "timestamp", "timestamptz", "string", "string", "string", "string", "string", "string"}
	for i, col := range tb.Schema.Columns {
		if col.Type.String() != wantTypes[i] {
			t.Errorf("column %s: type %s, want %s", col.Name, col.Type, wantTypes[i])
		}
	}
	want1 := []any{int64(1), int64(-32768), int64(2147483647), int64(math.MinInt64), dec(t, "-123456789.125", 12, 3),
		"3.14159265358979323846264338327950288419716939937510", float64(float32(1.5)), 0.1, true, "tab\tand 'quote' \\ and\nnewline",
		"varchar", "ab  ", []byte{0, 0xff, 0x5c, 0x0a}, types.DateDays(-165),
		"13:45:01.5", types.TimestampMicros(time.Date(2024, 2, 29, 23, 59, 59, 999999000, time.UTC).UnixMicro()),
		types.TimestampMicros(time.Date(2024, 2, 29, 21, 59, 59, 500000000, time.UTC).UnixMicro()),
		"1 year 2 mons 3 days 04:05:06", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", `{"a": [1, 2]}`, `{"b": null}`, "happy", "{1,NULL,3}"}
	want2 := make([]any, len(want1))
	want2[0] = int64(2)
	var rows [][]any
	for _, rec := range recs {
		if rec.Kind == cdc.Change {
			if rec.Op != cdc.OpRead {
				t.Fatalf("copy delivered op %c", rec.Op)
			}
			rows = append(rows, rec.After)
		}
	}
	if len(rows) != 2 || !reflect.DeepEqual(rows[0], want1) || !reflect.DeepEqual(rows[1], want2) {
		t.Fatalf("copied rows:\n%#v\nwant\n%#v\n%#v", rows, want1, want2)
	}
	// The same values through the stream.
	execSQL(t, dsn, `INSERT INTO typed SELECT id + 10, i2, i4, i8, n, nu, f4, f8, b, t, v, ch, by, d, tm, ts, tz, iv, u, j, jb, e, a FROM typed`)
	recs = r.until(isEnd)
	rows = nil
	for _, rec := range recs {
		if rec.Kind == cdc.Change {
			rows = append(rows, rec.After)
		}
	}
	want1[0], want2[0] = int64(11), int64(12)
	if len(rows) != 2 || !reflect.DeepEqual(rows[0], want1) || !reflect.DeepEqual(rows[1], want2) {
		t.Fatalf("streamed rows:\n%#v\nwant\n%#v\n%#v", rows, want1, want2)
	}
}

// TestUnrepresentableValueNamesTableAndColumn: a value Retina cannot hold
// stops the source with an error naming the table and the column.
func TestUnrepresentableValueNamesTableAndColumn(t *testing.T) {
	c := startCluster(t)
	dsn := c.DSN("postgres")
	execSQL(t, dsn, `CREATE TABLE odd (id int PRIMARY KEY, d date)`)
	opts, _ := ParseURI(dsn)
	src, err := Open(context.Background(), opts, Config{Catalog: openCatalog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	reader{t, src}.until(copyDone)
	execSQL(t, dsn, `INSERT INTO odd VALUES (1, 'infinity')`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		_, err := src.Next(ctx)
		if err == nil {
			continue
		}
		if want := "public.odd"; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "column d") {
			t.Fatalf("error %q does not name %s and column d", err, want)
		}
		return
	}
}
