package pgwire_test

import (
	"context"
	"strings"
	"testing"

	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/server/servertest"
)

// Tables of one name in two source schemas are two tables, each in its
// schema (public's by its plain name), in SQL and in the catalogs.
func TestSchemasKeepTablesApart(t *testing.T) {
	n := servertest.OpenNode(t)
	plain := servertest.CreateTable(t, n, "account", accountCols(), "id")
	sales := servertest.CreateTable(t, n, "sales.account", accountCols(), "id")
	servertest.Apply(t, n,
		change.Op{Table: plain.ID, Kind: change.Insert, Row: []any{int64(1), "p", int64(10)}},
		change.Op{Table: sales.ID, Kind: change.Insert, Row: []any{int64(1), "s", int64(20)}},
		change.Op{Table: sales.ID, Kind: change.Insert, Row: []any{int64(2), "s", int64(30)}},
	)
	c := connect(t, serve(t, n))
	ctx := context.Background()
	for q, want := range map[string]int64{
		"SELECT sum(balance) FROM account":                                                 10,
		"SELECT sum(balance) FROM public.account":                                          10,
		"SELECT sum(balance) FROM sales.account":                                           50,
		"SELECT sum(a.balance + b.balance) FROM account a JOIN sales.account b USING (id)": 30,
	} {
		var got int64
		if err := c.QueryRow(ctx, q).Scan(&got); err != nil || got != want {
			t.Errorf("%s: %d (%v), want %d", q, got, err, want)
		}
	}
	rows, err := c.Query(ctx, `SELECT n.nspname || '.' || c.relname || ' ' || pg_catalog.pg_table_is_visible(c.oid)::text
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		listed = append(listed, s)
	}
	if got := strings.Join(listed, ", "); got != "public.account true, sales.account false" {
		t.Fatalf("pg_class: %s", got)
	}
	// search_path: unqualified names are looked for in its schemas, in
	// order; a common table expression is never taken for a table.
	for _, step := range []struct {
		path, q string
		want    string
	}{
		{"sales, public", "SELECT sum(balance)::text || ' ' || current_schema() FROM account", "50 sales"},
		{"public, sales", "SELECT sum(balance)::text || ' ' || current_schema FROM account", "10 public"},
		{`"$user", sales`, "SELECT count(*)::text FROM account", "2"},
		{"sales", "WITH account AS (SELECT 7 AS balance) SELECT sum(balance)::text FROM account", "7"},
	} {
		if _, err := c.Exec(ctx, "SET search_path TO "+step.path); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := c.QueryRow(ctx, step.q).Scan(&got); err != nil || got != step.want {
			t.Errorf("search_path %s: %s: %q (%v), want %q", step.path, step.q, got, err, step.want)
		}
	}
	if _, err := c.Exec(ctx, "RESET search_path"); err != nil {
		t.Fatal(err)
	}
	var schemas string
	if err := c.QueryRow(ctx, "SELECT string_agg(table_schema || '.' || table_name, ',' ORDER BY table_schema) FROM information_schema.tables").Scan(&schemas); err != nil || schemas != "public.account,sales.account" {
		t.Fatalf("information_schema.tables: %q %v", schemas, err)
	}
}
