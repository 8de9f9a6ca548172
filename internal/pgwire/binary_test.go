package pgwire_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/retinadb/retina/internal/server/servertest"
)

// Every type drivers ask for in binary reads the same as in text (pgx
// takes results in binary in its extended modes and in text in the simple
// one), and parameters of those types bind in binary.
func TestBinaryAndTextAgree(t *testing.T) {
	n := servertest.OpenNode(t)
	c := connect(t, serve(t, n))
	ctx := context.Background()
	const q = `SELECT 1::int2 AS i2, 2::int4 AS i4, 3::int8 AS i8, 1.5::float4 AS f4, 2.5::float8 AS f8,
		-12.34::numeric(5,2) AS num, 123456789.000001::numeric(20,6) AS bignum, true AS b, 'x'::text AS t,
		'\xff00'::bytea AS bin, DATE '2024-01-02' AS d, TIMESTAMP '2024-01-02 03:04:05.123456' AS ts,
		TIMESTAMPTZ '2024-01-02 03:04:05+00' AS tstz, INTERVAL '1 day 2 hours 3.5 seconds' AS iv,
		'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS u, '{"a": 1}'::json AS j, TIME '10:11:12.5' AS tm,
		NULL::int4 AS nothing`
	render := func(mode pgx.QueryExecMode) string {
		rows, err := c.Query(ctx, q, mode)
		if err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		defer rows.Close()
		if !rows.Next() {
			t.Fatalf("mode %v: no row: %v", mode, rows.Err())
		}
		vals, err := rows.Values()
		if err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		out := ""
		for i, v := range vals {
			if tm, ok := v.(time.Time); ok {
				v = tm.UTC().Format(time.RFC3339Nano)
			}
			if num, ok := v.(pgtype.Numeric); ok {
				f, _ := num.Value()
				v = f
			}
			out += fmt.Sprintf("%s=%v ", rows.FieldDescriptions()[i].Name, v)
		}
		return out
	}
	text := render(pgx.QueryExecModeSimpleProtocol)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec} {
		if got := render(mode); got != text {
			t.Errorf("mode %v:\n got %s\ntext %s", mode, got, text)
		}
	}

	// Parameters, bound in binary where pgx knows the type.
	var (
		d   time.Time
		ts  time.Time
		num pgtype.Numeric
		u   pgtype.UUID
		bin []byte
		iv  pgtype.Interval
	)
	day := time.Date(2024, 1, 2, 0, 0, 0, 0, time.UTC)
	stamp := time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC)
	wantNum := pgtype.Numeric{}
	wantNum.Scan("-12.34")
	wantU := pgtype.UUID{}
	wantU.Scan("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
	wantIv := pgtype.Interval{Days: 1, Microseconds: 7_203_500_000, Valid: true}
	err := c.QueryRow(ctx, `SELECT $1::date, $2::timestamp, $3::numeric(5,2), $4::uuid, $5::bytea, $6::interval`,
		day, stamp, wantNum, wantU, []byte{0xff, 0}, wantIv).Scan(&d, &ts, &num, &u, &bin, &iv)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Equal(day) || !ts.Equal(stamp) || fmt.Sprint(num.Int, num.Exp) != fmt.Sprint(wantNum.Int, wantNum.Exp) || u != wantU || string(bin) != "\xff\x00" || iv != wantIv {
		t.Fatalf("parameters came back as %v %v %v %v %x %+v", d, ts, num, u, bin, iv)
	}
}
