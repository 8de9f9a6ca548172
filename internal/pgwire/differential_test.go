package pgwire_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/pgtest"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// differentialQueries run on Retina and on PostgreSQL over the same rows;
// column names, type OIDs and every value's text must agree.
var differentialQueries = []string{
	// aggregates
	`SELECT count(*), sum(balance), min(balance), max(balance) FROM account`,
	`SELECT owner, count(*), sum(balance) FROM account GROUP BY owner ORDER BY owner NULLS FIRST`,
	`SELECT count(owner), count(DISTINCT owner) FROM account`,
	`SELECT owner, max(id) FROM account GROUP BY owner HAVING count(*) > 3 ORDER BY 1`,
	`SELECT sum(amount), min(placed), max(day) FROM orders WHERE ok`,
	`SELECT bool_and(ok), bool_or(ok) FROM orders`,
	`SELECT sum(ratio), avg(ratio), min(qty), max(qty) FROM orders`,
	// joins
	`SELECT a.owner, count(o.oid), sum(o.amount) FROM account a JOIN orders o ON o.account_id = a.id GROUP BY a.owner ORDER BY a.owner NULLS LAST`,
	`SELECT a.id, o.oid FROM account a LEFT JOIN orders o ON o.account_id = a.id AND o.amount > 400 WHERE a.id < 6 ORDER BY a.id, o.oid`,
	`SELECT count(*) FROM account a, account b WHERE a.owner = b.owner`,
	`SELECT a.id FROM account a WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.account_id = a.id) ORDER BY a.id`,
	`SELECT id FROM account WHERE id IN (SELECT account_id FROM orders WHERE amount > 450) ORDER BY id`,
	// window functions
	`SELECT id, row_number() OVER (PARTITION BY owner ORDER BY id) FROM account ORDER BY id`,
	`SELECT oid, sum(amount) OVER (ORDER BY oid ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) FROM orders ORDER BY oid LIMIT 12`,
	`SELECT id, rank() OVER (ORDER BY balance DESC), dense_rank() OVER (ORDER BY balance DESC) FROM account ORDER BY id`,
	`SELECT oid, lag(amount) OVER (ORDER BY oid), lead(day, 2) OVER (ORDER BY oid) FROM orders ORDER BY oid LIMIT 10`,
	// CTEs and set operations
	`WITH big AS (SELECT * FROM orders WHERE amount > 300) SELECT account_id, count(*) FROM big GROUP BY account_id ORDER BY account_id`,
	`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5) SELECT i FROM n ORDER BY i`,
	`SELECT id FROM account WHERE id < 3 UNION SELECT account_id FROM orders WHERE oid < 3 ORDER BY 1`,
	`SELECT owner FROM account EXCEPT SELECT 'o1' ORDER BY 1 NULLS FIRST`,
	// date and time
	`SELECT day, count(*) FROM orders GROUP BY day ORDER BY day LIMIT 5`,
	`SELECT oid, placed, day, extract(year FROM placed), date_trunc('month', placed) FROM orders ORDER BY oid LIMIT 5`,
	`SELECT oid, day + 1, day - 7, extract(second FROM placed), extract(epoch FROM placed), extract(dow FROM day) FROM orders ORDER BY oid LIMIT 5`,
	`SELECT DATE '2024-02-28' + 2, TIMESTAMP '2024-03-01 10:00:00' - INTERVAL '90 minutes'`,
	`SELECT INTERVAL '1 day 2 hours', INTERVAL '-3 days', INTERVAL '1 year 2 months 3 days 04:05:06.5'`,
	// NULLs
	`SELECT id, owner, coalesce(owner, 'nobody') FROM account ORDER BY id LIMIT 8`,
	`SELECT count(*) FILTER (WHERE owner IS NULL), count(*) FILTER (WHERE ratio IS NOT NULL) FROM account, orders WHERE orders.oid = account.id`,
	`SELECT NULL::int, nullif(1, 1), CASE WHEN owner IS NULL THEN 'none' ELSE owner END FROM account ORDER BY id LIMIT 4`,
	// numeric precision
	`SELECT oid, amount, amount * 2, amount + 0.005, -amount FROM orders ORDER BY oid LIMIT 6`,
	`SELECT sum(amount * qty) FROM orders`,
	`SELECT 1.10::numeric(5,2), 123456789012345678::bigint, 2.5::float8, 1e-7::float8, (0.1 + 0.2)::float8`,
	`SELECT id, balance, round(balance, 1), trunc(balance) FROM account ORDER BY id LIMIT 5`,
	// expressions, names and types
	`SELECT 1, 'x', 1 + 2, id * 10, upper(owner), length(owner), owner || '!' FROM account ORDER BY id LIMIT 3`,
	`SELECT id::text, id::int4, CAST(id AS smallint), balance::float8 FROM account ORDER BY 2 LIMIT 3`,
	`SELECT true, false, NOT ok, ok AND true FROM orders ORDER BY oid LIMIT 3`,
	`SELECT '\x0aff'::bytea, 'héllo'::text, ''::text`,
	`SELECT oid FROM orders ORDER BY amount DESC, oid LIMIT 5 OFFSET 3`,
}

const differentialDDL = `
CREATE TABLE account (id bigint PRIMARY KEY, owner text, balance numeric(12,2) NOT NULL);
CREATE TABLE orders (oid bigint PRIMARY KEY, account_id bigint NOT NULL, amount numeric(10,2) NOT NULL,
	qty integer NOT NULL, placed timestamp NOT NULL, day date NOT NULL, ok boolean NOT NULL, ratio double precision);`

// differentialRows are the same rows for both systems, as SQL literals per
// table and as replay rows.
type differentialRows struct {
	accounts, orders [][]any
}

func makeDifferentialRows() differentialRows {
	var r differentialRows
	owners := []any{"o1", "o2", "o3", nil, "o5"}
	for i := range 30 {
		bal := fmt.Sprintf("%d.%02d", (i*7919)%1000, (i*31)%100)
		r.accounts = append(r.accounts, []any{int64(i), owners[i%len(owners)], bal})
	}
	base := time.Date(2024, 1, 30, 8, 15, 0, 0, time.UTC)
	for i := range 80 {
		placed := base.Add(time.Duration(i*37) * time.Hour).Add(time.Duration(i*1234567) * time.Microsecond)
		var ratio any
		if i%4 != 0 {
			ratio = float64(i) / 8
		}
		r.orders = append(r.orders, []any{int64(i), int64((i * 7) % 35), fmt.Sprintf("%d.%02d", (i*37)%500, (i*13)%100),
			int32(i%5 + 1), placed, placed.Truncate(24 * time.Hour), i%3 != 0, ratio})
	}
	return r
}

func sqlLiteral(v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case string:
		return "'" + strings.ReplaceAll(x, "'", "''") + "'"
	case time.Time:
		return "'" + x.Format("2006-01-02 15:04:05.999999") + "'"
	}
	return fmt.Sprint(v)
}

func TestDifferentialAgainstPostgreSQL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	rows := makeDifferentialRows()

	// PostgreSQL.
	want, err := pgconn.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close(context.Background())
	var load strings.Builder
	load.WriteString(differentialDDL)
	for name, tableRows := range map[string][][]any{"account": rows.accounts, "orders": rows.orders} {
		for _, r := range tableRows {
			vals := make([]string, len(r))
			for i, v := range r {
				vals[i] = sqlLiteral(v)
			}
			fmt.Fprintf(&load, "INSERT INTO %s VALUES (%s);\n", name, strings.Join(vals, ", "))
		}
	}
	if _, err := want.Exec(ctx, load.String()).ReadAll(); err != nil {
		t.Fatal(err)
	}

	// Retina.
	n := servertest.OpenNode(t)
	acct := servertest.CreateTable(t, n, "account", decimalAccountCols(), "id")
	ord := servertest.CreateTable(t, n, "orders", []catalog.Column{
		{Name: "oid", Type: types.Of(types.Int64)},
		{Name: "account_id", Type: types.Of(types.Int64)},
		{Name: "amount", Type: types.DecimalOf(10, 2)},
		{Name: "qty", Type: types.Of(types.Int32)},
		{Name: "placed", Type: types.Of(types.Timestamp)},
		{Name: "day", Type: types.Of(types.Date)},
		{Name: "ok", Type: types.Of(types.Bool)},
		{Name: "ratio", Type: types.Of(types.Float64), Nullable: true},
	}, "oid")
	dec := func(s string, p, sc int32) decimal128.Num {
		d, err := decimal128.FromString(s, p, sc)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	var ops []change.Op
	for _, r := range rows.accounts {
		ops = append(ops, change.Op{Table: acct.ID, Kind: change.Insert, Row: []any{r[0], r[1], dec(r[2].(string), 12, 2)}})
	}
	for _, r := range rows.orders {
		placed := r[4].(time.Time)
		ops = append(ops, change.Op{Table: ord.ID, Kind: change.Insert, Row: []any{r[0], r[1], dec(r[2].(string), 10, 2),
			int64(r[3].(int32)), types.TimestampMicros(placed.UnixMicro()), types.DateDays(int32(placed.Unix() / 86400)), r[6], r[7]}})
	}
	servertest.Apply(t, n, ops...)
	got, err := pgconn.Connect(ctx, serve(t, n))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close(context.Background())

	if len(differentialQueries) < 30 {
		t.Fatalf("only %d differential queries", len(differentialQueries))
	}
	failed := 0
	for _, q := range differentialQueries {
		w, werr := runText(ctx, want, q)
		g, gerr := runText(ctx, got, q)
		switch {
		case werr != nil:
			t.Errorf("PostgreSQL refused %s: %v", q, werr)
		case gerr != nil:
			t.Errorf("Retina refused %s: %v", q, gerr)
		case g != w:
			t.Errorf("%s\nRetina:\n%s\nPostgreSQL:\n%s", q, g, w)
		default:
			continue
		}
		failed++
	}
	if failed > 0 {
		t.Logf("%d of %d queries differ", failed, len(differentialQueries))
	}
}

// runText runs a query with the simple protocol (every value in text) and
// renders its columns (name and type OID) and rows.
func runText(ctx context.Context, c *pgconn.PgConn, q string) (string, error) {
	res, err := c.Exec(ctx, q).ReadAll()
	if err != nil {
		return "", err
	}
	if len(res) != 1 {
		return "", fmt.Errorf("%d results", len(res))
	}
	var b strings.Builder
	for i, f := range res[0].FieldDescriptions {
		if i > 0 {
			b.WriteString(" | ")
		}
		fmt.Fprintf(&b, "%s:%d", f.Name, f.DataTypeOID)
	}
	b.WriteString("\n")
	for _, row := range res[0].Rows {
		for i, v := range row {
			if i > 0 {
				b.WriteString(" | ")
			}
			if v == nil {
				b.WriteString("NULL")
			} else {
				b.Write(v)
			}
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}
