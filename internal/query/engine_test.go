package query_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/duckdb/duckdb-go/v2"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/query"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

var (
	openNode    = servertest.OpenNode
	apply       = servertest.Apply
	createTable = servertest.CreateTable
)

func queryAll(t testing.TB, s *query.Session, q string, args ...any) [][]any {
	t.Helper()
	res, err := s.Run(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return resultRows(t, res)
}

// resultRows reads a result's rows and closes it.
func resultRows(t testing.TB, res *query.Result) [][]any {
	t.Helper()
	defer res.Close()
	var out [][]any
	for res.Next() {
		v, err := res.Values()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func accountCols() []catalog.Column {
	return []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "owner", Type: types.Of(types.String), Nullable: true},
		{Name: "balance", Type: types.Of(types.Int64)},
	}
}

func TestQueriesSeeSnapshotsJoinsAndSelfJoins(t *testing.T) {
	n := openNode(t)
	ctx := context.Background()
	acct := createTable(t, n, "account", accountCols(), "id")
	var ops []change.Op
	for i := range 100 {
		ops = append(ops, change.Op{Table: acct.ID, Kind: change.Insert, Row: []any{int64(i), fmt.Sprintf("o%d", i%7), int64(10)}})
	}
	apply(t, n, ops...)
	s, err := n.Engine.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := queryAll(t, s, "SELECT count(*), sum(balance) FROM account"); got[0][0] != int64(100) || fmt.Sprint(got[0][1]) != "1000" {
		t.Fatalf("count/sum: %v", got)
	}
	// A self-join scans the table twice: both scans must see every row.
	if got := queryAll(t, s, "SELECT count(*) FROM account a JOIN account b ON a.id = b.id"); got[0][0] != int64(100) {
		t.Fatalf("self-join: %v", got)
	}
	if got := queryAll(t, s, "WITH x AS (SELECT * FROM account) SELECT count(*) FROM x a, x b WHERE a.id = b.id AND a.owner = 'o3'"); got[0][0] != int64(14) {
		t.Fatalf("CTE used twice: %v", got)
	}
	// Repeatable read between BEGIN and COMMIT.
	queryAll(t, s, "BEGIN")
	before := queryAll(t, s, "SELECT retina_snapshot(), count(*) FROM account")
	apply(t, n, change.Op{Table: acct.ID, Kind: change.Delete, Key: []any{int64(5)}})
	if got := queryAll(t, s, "SELECT retina_snapshot(), count(*) FROM account"); !slices.Equal(got[0], before[0]) {
		t.Fatalf("inside a read transaction: %v then %v", before, got)
	}
	queryAll(t, s, "COMMIT")
	after := queryAll(t, s, "SELECT retina_snapshot(), count(*), retina_hwm() FROM account")
	if after[0][1] != int64(99) || after[0][0].(uint64) <= before[0][0].(uint64) || after[0][2].(uint64) != after[0][0].(uint64)+1 {
		t.Fatalf("after COMMIT: %v (before %v)", after, before)
	}
	w, _ := n.Txn.Watermarks(ctx)
	if w.Running != 0 {
		t.Fatalf("%d snapshots still registered", w.Running)
	}
}

func TestSecurityAndReadOnly(t *testing.T) {
	t.Run("memory lake", func(t *testing.T) { securityAndReadOnly(t, openNode(t)) })
	// DuckDB reads the lake's own files, nothing beside or above them.
	t.Run("file lake", func(t *testing.T) {
		securityAndReadOnly(t, servertest.OpenNodeTuned(t, func(c *server.NodeConfig) { c.Lake = "" }))
	})
}

func securityAndReadOnly(t *testing.T, n *server.Node) {
	createTable(t, n, "account", accountCols(), "id")
	s, err := n.Engine.NewSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lakeDir, _ := n.Lake.LocalDir()
	for _, q := range []string{
		"SELECT * FROM read_csv('" + filepath.Join(n.Config.DataDir, "catalog") + "/*')",
		"SELECT * FROM read_csv('" + lakeDir + "/../catalog/*')",
		"SET allowed_directories = ['/']",
		"SELECT * FROM read_csv('/etc/passwd')",
		"SELECT * FROM read_parquet('/etc/hostname')",
		"COPY (SELECT 1) TO '/tmp/retina-should-not-exist.csv'",
		"INSTALL httpfs",
		"LOAD httpfs",
		"ATTACH '/tmp/retina-attach.db' AS x",
		"SET enable_external_access = true",
		"CREATE TABLE t (a INT)",
		"DROP VIEW account",
		"SELECT * FROM glob('/*')",
	} {
		res, err := s.Run(context.Background(), q)
		if err == nil {
			res.Close()
			t.Errorf("%s: allowed", q)
			continue
		}
		msg := err.Error()
		if !errors.Is(err, query.ErrReadOnly) && !errors.Is(err, query.ErrSetting) && query.SQLState(err) != "0A000" && !strings.Contains(msg, "Permission") && !strings.Contains(msg, "disabled") {
			t.Errorf("%s: %v", q, err)
		}
	}
	w, _ := n.Txn.Watermarks(context.Background())
	if w.Running != 0 {
		t.Fatalf("%d snapshots leaked by refused statements", w.Running)
	}
}

// TestOracleEquivalence: at random points of a replay, SQL over Retina
// tables equals the same SQL run by DuckDB over plain tables built from the
// oracle's state at that snapshot.
func TestOracleEquivalence(t *testing.T) {
	n := openNode(t)
	ctx := context.Background()
	acct := createTable(t, n, "account", accountCols(), "id")
	orders := createTable(t, n, "orders", []catalog.Column{
		{Name: "oid", Type: types.Of(types.Int64)},
		{Name: "account_id", Type: types.Of(types.Int64)},
		{Name: "amount", Type: types.DecimalOf(10, 2)},
	}, "oid")
	s, err := n.Engine.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	plain, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	rng := rand.New(rand.NewPCG(1, 1))
	accounts := map[int64][]any{}
	ords := map[int64][2]any{} // oid → account id, amount as text
	nextOrder := int64(1)
	queries := []string{
		"SELECT count(*), sum(balance), min(owner), max(id) FROM account",
		"SELECT owner, count(*) AS n, sum(balance) AS s FROM account GROUP BY owner ORDER BY owner",
		"SELECT a.owner, count(o.oid), sum(o.amount) FROM account a JOIN orders o ON o.account_id = a.id GROUP BY a.owner ORDER BY a.owner",
		"SELECT id, balance FROM account WHERE balance > 50 ORDER BY id LIMIT 7",
		"SELECT count(*) FROM orders o LEFT JOIN account a ON a.id = o.account_id WHERE a.id IS NULL",
	}
	for round := range 25 {
		var ops []change.Op
		for range 1 + rng.IntN(30) {
			id := int64(rng.IntN(60))
			switch row, live := accounts[id]; {
			case !live:
				r := []any{id, fmt.Sprintf("o%d", rng.IntN(5)), int64(rng.IntN(100))}
				accounts[id] = r
				ops = append(ops, change.Op{Table: acct.ID, Kind: change.Insert, Row: r})
			case rng.IntN(3) == 0:
				delete(accounts, id)
				ops = append(ops, change.Op{Table: acct.ID, Kind: change.Delete, Key: []any{id}})
			default:
				r := []any{id, row[1], int64(rng.IntN(100))}
				accounts[id] = r
				ops = append(ops, change.Op{Table: acct.ID, Kind: change.Update, Row: r})
			}
			if rng.IntN(2) == 0 {
				amt := fmt.Sprintf("%d.%02d", rng.IntN(500), rng.IntN(100))
				num, err := decimal128.FromString(amt, 10, 2)
				if err != nil {
					t.Fatal(err)
				}
				acc := int64(rng.IntN(60))
				ords[nextOrder] = [2]any{acc, amt}
				ops = append(ops, change.Op{Table: orders.ID, Kind: change.Insert, Row: []any{nextOrder, acc, num}})
				nextOrder++
			}
		}
		apply(t, n, ops...)
		if round%5 != 4 {
			continue
		}
		// The oracle as plain DuckDB tables.
		for _, stmt := range []string{
			"CREATE OR REPLACE TABLE account (id BIGINT, owner VARCHAR, balance BIGINT)",
			"CREATE OR REPLACE TABLE orders (oid BIGINT, account_id BIGINT, amount DECIMAL(10,2))",
		} {
			if _, err := plain.Exec(stmt); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range accounts {
			plain.Exec("INSERT INTO account VALUES (?, ?, ?)", r...)
		}
		for oid, r := range ords {
			plain.Exec("INSERT INTO orders VALUES (?, ?, ?::DECIMAL(10,2))", oid, r[0], r[1])
		}
		for _, q := range queries {
			got := fmt.Sprint(queryAll(t, s, q))
			want := fmt.Sprint(plainQuery(t, plain, q))
			if got != want {
				t.Fatalf("round %d: %s\n retina %s\n oracle %s", round, q, got, want)
			}
		}
	}
}

func plainQuery(t testing.TB, db *sql.DB, q string) [][]any {
	t.Helper()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out [][]any
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if d, ok := v.(duckdb.Decimal); ok { // rendered as the engine renders exact numerics
				vals[i] = query.Decimal{Value: d.Value, Scale: d.Scale}
			}
		}
		out = append(out, vals)
	}
	return out
}
