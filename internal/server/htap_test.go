package server_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/retinadb/retina/internal/console"
	"github.com/retinadb/retina/internal/oltp/oltpserver"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
)

// htapRun is `retina serve --mysql-addr`: the OLTP store and Retina in one
// process.
type htapRun struct {
	*pgRun
	mysql  *sql.DB
	retina *pgx.Conn
}

func startHTAP(t *testing.T, dir string) *htapRun {
	t.Helper()
	r := &htapRun{pgRun: startServer(t, dir, servertest.Quiet(), func(cfg *server.Config) {
		cfg.MySQLAddr, cfg.OLTPMemoryTables = "127.0.0.1:0", []string{"accounts"}
	})}
	srv := r.srv
	var err error
	r.mysql, err = sql.Open("mysql", fmt.Sprintf("root@tcp(%s)/app?timeout=5s&readTimeout=30s&writeTimeout=30s", srv.MySQLAddr()))
	if err != nil {
		t.Fatal(err)
	}
	r.retina = connect(t, "postgres://retina@"+srv.SQLAddr()+"/retina?sslmode=disable")
	return r
}

func (r *htapRun) close(t *testing.T) {
	t.Helper()
	r.mysql.Close()
	r.retina.Close(context.Background())
	r.pgRun.close(t)
}

func (r *htapRun) exec(t *testing.T, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := r.mysql.Exec(s); err != nil {
			t.Fatalf("mysql: %s: %v", s, err)
		}
	}
}

// mysqlRows renders a query on the store as text rows.
func (r *htapRun) mysqlRows(t *testing.T, q string) [][]string {
	t.Helper()
	rs, err := r.mysql.Query(q)
	if err != nil {
		t.Fatalf("mysql: %s: %v", q, err)
	}
	defer rs.Close()
	cols, _ := rs.Columns()
	var out [][]string
	for rs.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rs.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := make([]string, len(cols))
		for i, v := range vals {
			row[i] = "<nil>"
			if v.Valid {
				row[i] = v.String
			}
		}
		out = append(out, row)
	}
	return out
}

// converge waits (at most a minute) until Retina's answer to q equals
// want, and fails with both if it never does.
func (r *htapRun) converge(t *testing.T, q string, want [][]string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var got [][]string
	var err error
	for time.Now().Before(deadline) {
		got, err = tryTextRows(r.retina, q)
		if err != nil && !servertest.NotYetReplicated(err) {
			t.Fatalf("%s on Retina: %v", q, err)
		}
		if err == nil && slices.EqualFunc(got, want, slices.Equal) {
			return
		}
		if err := r.srv.Failure(); err != nil {
			t.Fatalf("ingestion stopped: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("%s on Retina: still %v after a minute", q, err)
	}
	t.Fatalf("%s on Retina:\n%v\nthe store has:\n%v", q, got, want)
}

// TestHTAPReplicatesTheStore writes through the MySQL endpoint and reads
// through Retina: inserts, updates, deletes, a primary-key change, a table
// without a primary key, cross-engine transactions (accounts in memory,
// ledger in storage) and a rollback; then a restart must leave Retina
// equal to the store again (the start's copy), and the stream must go on.
func TestHTAPReplicatesTheStore(t *testing.T) {
	dir := t.TempDir()
	r := startHTAP(t, dir)
	r.exec(t,
		"CREATE TABLE accounts (id INT PRIMARY KEY, owner VARCHAR(20) NOT NULL, balance DECIMAL(12,2) NOT NULL)",
		"CREATE TABLE ledger (id BIGINT PRIMARY KEY, account INT NOT NULL, amount DECIMAL(12,2), note VARCHAR(40))",
		"CREATE TABLE notes (body VARCHAR(40))",
		"INSERT INTO accounts VALUES (1, 'ann', 100.00), (2, 'bob', 50.50), (3, 'cy', 0)",
		"INSERT INTO notes VALUES ('first'), ('second')",
	)
	tx, err := r.mysql.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"UPDATE accounts SET balance = balance - 10 WHERE id = 1",
		"UPDATE accounts SET balance = balance + 10 WHERE id = 2",
		"INSERT INTO ledger VALUES (1, 1, -10, 'transfer'), (2, 2, 10, 'transfer')",
	} {
		if _, err := tx.Exec(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	tx, err = r.mysql.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("DELETE FROM accounts"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	r.exec(t,
		"DELETE FROM accounts WHERE id = 3",
		"UPDATE accounts SET id = 20 WHERE id = 2",
		"UPDATE notes SET body = 'changed' WHERE body = 'first'",
		"INSERT INTO ledger VALUES (3, 1, NULL, NULL)",
		"DELETE FROM ledger WHERE id = 3",
	)
	// The same query on both sides; Retina's decimals as text.
	queries := map[string][2]string{
		"accounts": {"SELECT id, owner, balance FROM accounts ORDER BY id", "SELECT id, owner, balance::varchar FROM accounts ORDER BY id"},
		"ledger":   {"SELECT id, account, amount, note FROM ledger ORDER BY id", "SELECT id, account, amount::varchar, note FROM ledger ORDER BY id"},
		"notes":    {"SELECT body FROM notes ORDER BY body", "SELECT body FROM notes ORDER BY body"},
	}
	check := func(r *htapRun) {
		t.Helper()
		for _, q := range queries {
			r.converge(t, q[1], r.mysqlRows(t, q[0]))
		}
	}
	check(r)
	// The console shows the store: its commits, a table in each engine,
	// and a stream Retina has taken everything from.
	resp, err := http.Get("http://" + r.srv.HTTPAddr() + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	var st console.Status
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.OLTP == nil || st.OLTP.Commits < 8 || st.OLTP.Aborts != 0 || st.OLTP.MemoryTables != 1 || st.OLTP.StorageTables != 2 ||
		st.OLTP.MemoryRecords == 0 || st.OLTP.StorageBytes == 0 || st.OLTP.StreamLagCommits != 0 {
		t.Fatalf("the console's OLTP status: %+v (%v)", st.OLTP, err)
	}
	r.close(t)

	r = startHTAP(t, dir)
	check(r)
	r.exec(t, "INSERT INTO accounts VALUES (4, 'dee', 7.25)", "DROP TABLE notes")
	r.converge(t, queries["accounts"][1], r.mysqlRows(t, queries["accounts"][0]))
	r.converge(t, "SELECT count(*) FROM notes", [][]string{{"0"}})
	if got := textRows(t, r.retina, "SELECT owner FROM accounts WHERE id = 20"); len(got) != 1 || !strings.EqualFold(got[0][0], "bob") {
		t.Fatalf("moved row: %v", got)
	}
	r.close(t)
}

// TestHTAPEmptiesATableDroppedWhileRetinaWasDown: the store alone (as
// `retina oltp` on the same data) drops a table Retina holds; the next
// `retina serve` must empty Retina's copy though it never saw the drop.
func TestHTAPEmptiesATableDroppedWhileRetinaWasDown(t *testing.T) {
	dir := t.TempDir()
	r := startHTAP(t, dir)
	r.exec(t,
		"CREATE TABLE notes (id INT PRIMARY KEY, body VARCHAR(40))",
		"CREATE TABLE kept (id INT PRIMARY KEY)",
		"INSERT INTO notes VALUES (1, 'a'), (2, 'b')",
		"INSERT INTO kept VALUES (7)",
	)
	r.converge(t, "SELECT count(*) FROM notes", [][]string{{"2"}})
	r.converge(t, "SELECT count(*) FROM kept", [][]string{{"1"}})
	r.close(t)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o, err := oltpserver.Start(ctx, oltpserver.Config{Dir: filepath.Join(dir, "oltp"), MySQLAddr: "127.0.0.1:0", Logger: servertest.Quiet()})
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(%s)/app?timeout=5s", o.MySQLAddr()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("DROP TABLE notes"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}

	r = startHTAP(t, dir)
	r.converge(t, "SELECT count(*) FROM notes", [][]string{{"0"}})
	r.converge(t, "SELECT count(*) FROM kept", [][]string{{"1"}})
	// Created again, the table replicates again.
	r.exec(t, "CREATE TABLE notes (id INT PRIMARY KEY, body VARCHAR(40))", "INSERT INTO notes VALUES (3, 'c')")
	r.converge(t, "SELECT id FROM notes", [][]string{{"3"}})
	r.close(t)
}
