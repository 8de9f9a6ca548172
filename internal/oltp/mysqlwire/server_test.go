package mysqlwire

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/retinadb/retina/internal/oltp/skeena"
	"github.com/retinadb/retina/internal/oltp/sqlexec"
	"github.com/retinadb/retina/internal/oltp/sqlstore"
)

// server is a store, its SQL engine and a MySQL listener on loopback.
type server struct {
	store *skeena.Store
	srv   *Server
	done  chan struct{}
}

func start(t *testing.T, dir string, memTables ...string) *server {
	t.Helper()
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	store, err := skeena.Open(ctx, skeena.Options{Dir: dir, Tables: sqlstore.PhysicalTables(), Logger: quiet, CheckpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := sqlstore.OpenCatalog(ctx, store)
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	mem := map[string]bool{}
	for _, n := range memTables {
		mem[n] = true
	}
	eng, err := sqlexec.New(store, cat, sqlexec.Config{MemoryTables: mem, Logger: quiet})
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	srv, err := Listen(eng, Config{Addr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	s := &server{store: store, srv: srv, done: make(chan struct{})}
	go func() { defer close(s.done); srv.Serve() }()
	return s
}

func (s *server) stop(t *testing.T) {
	s.srv.Close()
	<-s.done
	if err := s.store.Close(); err != nil {
		t.Fatal(err)
	}
}

func (s *server) db(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(%s)/tpcc?timeout=5s&readTimeout=30s&writeTimeout=30s", s.srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func exec(t *testing.T, db interface {
	Exec(string, ...any) (sql.Result, error)
}, q string, args ...any) sql.Result {
	t.Helper()
	r, err := db.Exec(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return r
}

// rows returns a query's result as text, one line per row, values joined
// by '|', NULL as "NULL".
func rows(t *testing.T, db interface {
	Query(string, ...any) (*sql.Rows, error)
}, q string, args ...any) string {
	t.Helper()
	rs, err := db.Query(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rs.Close()
	cols, _ := rs.Columns()
	var lines []string
	for rs.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rs.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		parts := make([]string, len(vals))
		for i, v := range vals {
			parts[i] = "NULL"
			if v.Valid {
				parts[i] = v.String
			}
		}
		lines = append(lines, strings.Join(parts, "|"))
	}
	if err := rs.Err(); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return strings.Join(lines, "\n")
}

func mysqlErrno(err error) uint16 {
	var me *gomysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

const schema = `
CREATE TABLE warehouse (w_id INT NOT NULL, w_name VARCHAR(10), w_ytd DECIMAL(12,2), PRIMARY KEY (w_id));
CREATE TABLE customer (c_w_id INT NOT NULL, c_id INT NOT NULL, c_last VARCHAR(16), c_balance DECIMAL(12,2) DEFAULT 0, c_since DATETIME,
  PRIMARY KEY (c_w_id, c_id), INDEX idx_customer (c_w_id, c_last)) ENGINE=InnoDB;
CREATE TABLE history (h_c_id INT, h_amount DECIMAL(6,2), h_data VARCHAR(24), INDEX idx_h (h_c_id));
CREATE TABLE item (i_id INT PRIMARY KEY, i_name VARCHAR(24) NOT NULL, i_price DECIMAL(5,2)) ENGINE=MEMORY`

func load(t *testing.T, db *sql.DB) {
	t.Helper()
	for _, st := range strings.Split(schema, ";") {
		exec(t, db, st)
	}
	exec(t, db, "INSERT INTO warehouse VALUES (1, 'north', 300000.00), (2, 'south', 300000.00)")
	exec(t, db, `INSERT INTO customer (c_w_id, c_id, c_last, c_since) VALUES
		(1, 1, 'ABLE', '2024-01-02 03:04:05'), (1, 2, 'BAKER', '2024-01-02 03:04:05'), (1, 3, 'ABLE', NULL),
		(2, 1, 'CHARLIE', '2024-02-03 00:00:00'), (2, 2, 'ABLE', '2024-02-03 00:00:00')`)
	exec(t, db, "INSERT INTO item VALUES (1, 'pen', 1.50), (2, 'ink', 12.25), (3, 'pad', 3.00)")
}

func TestSQLOverMySQLProtocol(t *testing.T) {
	s := start(t, t.TempDir(), "item")
	defer s.stop(t)
	db := s.db(t)
	load(t, db)

	for _, c := range []struct{ q, want string }{
		{"SELECT w_name, w_ytd FROM warehouse WHERE w_id = 2", "south|300000.00"},
		{"SELECT c_id, c_last, c_balance FROM customer WHERE c_w_id = 1 ORDER BY c_id", "1|ABLE|0.00\n2|BAKER|0.00\n3|ABLE|0.00"},
		{"SELECT c_id FROM customer WHERE c_w_id = 1 AND c_last = 'ABLE' ORDER BY c_id DESC", "3\n1"},
		{"SELECT c_id FROM customer WHERE c_w_id = 1 AND c_id >= 2 AND c_id < 10", "2\n3"},
		{"SELECT c_id FROM customer WHERE c_w_id = 1 AND c_id BETWEEN 1 AND 2", "1\n2"},
		{"SELECT c_w_id, c_id FROM customer WHERE (c_w_id, c_id) IN ((2, 2), (1, 3), (1, 3)) ORDER BY c_w_id", "1|3\n2|2"},
		{"SELECT i_name FROM item WHERE i_id IN (3, 1, 7) ORDER BY i_id", "pen\npad"},
		{"SELECT count(*), count(c_since), min(c_last), max(c_id), sum(c_id) FROM customer", "5|4|ABLE|3|9"},
		{"SELECT c_w_id, count(*) AS n, avg(c_id) FROM customer GROUP BY c_w_id ORDER BY n DESC", "1|3|2.0000\n2|2|1.5000"},
		{"SELECT c_last, count(*) FROM customer GROUP BY c_last HAVING count(*) > 1", "ABLE|3"},
		{"SELECT count(DISTINCT c_last) FROM customer", "3"},
		{"SELECT DISTINCT c_last FROM customer ORDER BY 1", "ABLE\nBAKER\nCHARLIE"},
		{"SELECT w.w_name, c.c_id FROM warehouse w JOIN customer c ON c.c_w_id = w.w_id WHERE c.c_last = 'ABLE' ORDER BY w.w_id, c.c_id", "north|1\nnorth|3\nsouth|2"},
		{"SELECT c_id, w_ytd FROM customer, warehouse WHERE w_id = 2 AND c_w_id = w_id AND c_id = 1", "1|300000.00"},
		{"SELECT c_id FROM customer WHERE c_w_id = 1 ORDER BY c_id LIMIT 1 OFFSET 1", "2"},
		{"SELECT sum(c_id) FROM customer WHERE c_w_id = 9", "NULL"},
		{"SELECT count(*) FROM customer WHERE c_w_id = 9", "0"},
		{"SELECT 1 + 1, 'x', NULL", "2|x|NULL"},
		{"SELECT @@autocommit, @@version_comment", "1|Retina OLTP (Skeena)"},
		{"SELECT c_since FROM customer WHERE c_w_id = 1 AND c_id = 1", "2024-01-02 03:04:05"},
		{"SELECT i_price * 2 FROM item WHERE i_id = 2", "24.50"},
		// Subqueries in FROM, outer joins, correlated subqueries.
		{"SELECT count(*) FROM (SELECT c_w_id, count(*) n FROM customer GROUP BY c_w_id) t WHERE n > 2", "1"},
		{"SELECT t.w, t.n, w_name FROM (SELECT c_w_id w, count(*) n FROM customer GROUP BY c_w_id) t, warehouse WHERE w_id = t.w ORDER BY t.w", "1|3|north\n2|2|south"},
		{"SELECT * FROM (SELECT * FROM (SELECT c_w_id, c_id FROM customer) a JOIN (SELECT w_id FROM warehouse) b ON a.c_w_id = b.w_id) ab WHERE c_id = 3", "1|3|1"},
		{"SELECT i_id, c_id FROM item LEFT JOIN customer ON c_w_id = 1 AND c_id = i_id ORDER BY i_id", "1|1\n2|2\n3|3"},
		{"SELECT w_id, c_id FROM warehouse LEFT JOIN customer ON c_w_id = w_id AND c_last = 'BAKER' ORDER BY w_id", "1|2\n2|NULL"},
		{"SELECT count(*) FROM warehouse LEFT JOIN customer ON c_w_id = w_id AND c_last = 'BAKER' WHERE c_id IS NULL", "1"},
		{"SELECT w_id, (SELECT count(*) FROM customer WHERE c_w_id = w.w_id) n FROM warehouse w ORDER BY w_id", "1|3\n2|2"},
		{"SELECT w_id FROM warehouse WHERE w_id IN (SELECT c_w_id FROM customer WHERE c_last = 'CHARLIE')", "2"},
		{"SELECT w_id FROM warehouse w WHERE EXISTS (SELECT 1 FROM customer WHERE c_w_id = w.w_id AND c_last = 'BAKER')", "1"},
		{"SELECT count(*) FROM (SELECT c_id, (SELECT sum(c2.c_id) FROM customer c2 WHERE c2.c_w_id = c.c_w_id) s FROM customer c WHERE c.c_w_id = 1) t WHERE s <> 6", "0"},
		{"SELECT POWER(2, 3) + 0", "8"},
		// Correlated aggregates run once, grouped; missing groups are 0 or NULL.
		{"SELECT i_id, (SELECT count(*) FROM customer WHERE c_id = i.i_id AND c_w_id = 2), (SELECT max(c_last) FROM customer WHERE c_w_id = 2 AND i.i_id = c_id) FROM item i ORDER BY i_id", "1|1|CHARLIE\n2|1|ABLE\n3|0|NULL"},
	} {
		if got := rows(t, db, c.q); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.q, got, c.want)
		}
	}

	// Prepared statements (binary protocol) with placeholders.
	if got := rows(t, db, "SELECT c_last FROM customer WHERE c_w_id = ? AND c_id = ?", 2, 1); got != "CHARLIE" {
		t.Errorf("prepared point read: %q", got)
	}
	// The binary protocol encodes each value by its field's type: an int
	// column before others must not shift them.
	if got := rows(t, db, "SELECT c_w_id, c_id, c_balance, c_last, c_id + 1 FROM customer WHERE c_w_id = ? AND c_id = ?", 1, 2); got != "1|2|0.00|BAKER|3" {
		t.Errorf("prepared mixed types: %q", got)
	}
	if got := rows(t, db, "SELECT i_name FROM item WHERE i_id IN (?, ?) ORDER BY i_id LIMIT ?", 2, 3, 1); got != "ink" {
		t.Errorf("prepared IN with LIMIT: %q", got)
	}

	// DML.
	r := exec(t, db, "UPDATE warehouse SET w_ytd = w_ytd + ? WHERE w_id = ?", "10.25", 1)
	if n, _ := r.RowsAffected(); n != 1 {
		t.Errorf("update affected %d rows", n)
	}
	exec(t, db, "UPDATE customer SET c_last = 'ZED' WHERE c_w_id = 1 AND c_id = 3") // moves an index entry
	if got := rows(t, db, "SELECT c_id FROM customer WHERE c_w_id = 1 AND c_last = 'ABLE'"); got != "1" {
		t.Errorf("index after update: %q", got)
	}
	if got := rows(t, db, "SELECT w_ytd FROM warehouse WHERE w_id = 1"); got != "300010.25" {
		t.Errorf("w_ytd after update: %q", got)
	}
	exec(t, db, "INSERT INTO history (h_c_id, h_amount, h_data) VALUES (1, 10.00, 'a'), (1, 5.50, 'b'), (2, 1.00, 'c')")
	if got := rows(t, db, "SELECT sum(h_amount), count(*) FROM history WHERE h_c_id = 1"); got != "15.50|2" {
		t.Errorf("history without a primary key: %q", got)
	}
	r = exec(t, db, "DELETE FROM customer WHERE (c_w_id, c_id) IN ((2, 1), (2, 2))")
	if n, _ := r.RowsAffected(); n != 2 {
		t.Errorf("delete affected %d rows", n)
	}
	if got := rows(t, db, "SELECT count(*) FROM customer WHERE c_w_id = 2"); got != "0" {
		t.Errorf("after delete: %q", got)
	}
	if got := rows(t, db, "SELECT count(*) FROM customer WHERE c_w_id = 2 AND c_last = 'ABLE'"); got != "0" {
		t.Errorf("index entries after delete: %q", got)
	}

	// Errors carry MySQL numbers.
	for _, c := range []struct {
		q    string
		code uint16
	}{
		{"INSERT INTO warehouse VALUES (1, 'dup', 0)", 1062},
		{"SELECT * FROM nosuch", 1146},
		{"SELECT nosuch FROM warehouse", 1054},
		{"INSERT INTO item (i_id) VALUES (9)", 1364},
		{"INSERT INTO warehouse VALUES (9, 'name too long!', 0)", 1406},
		{"INSERT INTO warehouse VALUES (NULL, 'x', 0)", 1048},
		{"SELEC 1", 1064},
		{"CREATE TABLE warehouse (x INT)", 1050},
	} {
		_, err := db.Exec(c.q)
		if got := mysqlErrno(err); got != c.code {
			t.Errorf("%s: error %v (number %d), want number %d", c.q, err, got, c.code)
		}
	}
}

func TestTransactions(t *testing.T) {
	s := start(t, t.TempDir(), "item")
	defer s.stop(t)
	db := s.db(t)
	load(t, db)
	ctx := context.Background()

	// Rollback leaves nothing; commit makes a cross-engine change whole.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, tx, "UPDATE item SET i_price = 99 WHERE i_id = 1")
	exec(t, tx, "UPDATE warehouse SET w_ytd = 0 WHERE w_id = 1")
	if got := rows(t, tx, "SELECT i_price FROM item WHERE i_id = 1"); got != "99.00" {
		t.Errorf("own write not visible: %q", got)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, db, "SELECT i_price FROM item WHERE i_id = 1"); got != "1.50" {
		t.Errorf("after rollback: %q", got)
	}
	tx, _ = db.BeginTx(ctx, nil)
	exec(t, tx, "UPDATE item SET i_price = 2 WHERE i_id = 1")
	exec(t, tx, "UPDATE warehouse SET w_ytd = 1 WHERE w_id = 1")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, db, "SELECT i_price, w_ytd FROM item, warehouse WHERE i_id = 1 AND w_id = 1"); got != "2.00|1.00" {
		t.Errorf("after commit: %q", got)
	}

	// Two transactions writing one row: the second writer gets 1213.
	a, _ := db.BeginTx(ctx, nil)
	b, _ := db.BeginTx(ctx, nil)
	rows(t, a, "SELECT w_ytd FROM warehouse WHERE w_id = 2 FOR UPDATE")
	exec(t, b, "SELECT 1") // b's snapshot is taken
	_, err = b.Exec("UPDATE warehouse SET w_ytd = 5 WHERE w_id = 2")
	if mysqlErrno(err) != 1213 {
		t.Errorf("conflicting update: %v, want error 1213", err)
	}
	b.Rollback()
	if err := a.Commit(); err != nil {
		t.Fatal(err)
	}

	// Snapshot reads: a transaction does not see a later commit.
	r, _ := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	before := rows(t, r, "SELECT count(*) FROM history")
	exec(t, db, "INSERT INTO history VALUES (7, 1.00, 'later')")
	if got := rows(t, r, "SELECT count(*) FROM history"); got != before {
		t.Errorf("snapshot moved: %q then %q", before, got)
	}
	r.Commit()

	// Autocommit off: changes wait for COMMIT.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET autocommit = 0"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "UPDATE item SET i_name = 'quill' WHERE i_id = 1"); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, db, "SELECT i_name FROM item WHERE i_id = 1"); got != "pen" {
		t.Errorf("uncommitted change visible: %q", got)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, db, "SELECT i_name FROM item WHERE i_id = 1"); got != "quill" {
		t.Errorf("committed change not visible: %q", got)
	}
}

func TestRestartKeepsTablesAndRows(t *testing.T) {
	dir := t.TempDir()
	s := start(t, dir, "item")
	db := s.db(t)
	load(t, db)
	exec(t, db, "INSERT INTO history VALUES (1, 1.00, 'before restart')")
	db.Close()
	s.stop(t)

	s = start(t, dir)
	defer s.stop(t)
	db = s.db(t)
	if got := rows(t, db, "SELECT count(*) FROM customer WHERE c_w_id = 1 AND c_last = 'ABLE'"); got != "2" {
		t.Errorf("index after restart: %q", got)
	}
	if got := rows(t, db, "SELECT i_name FROM item WHERE i_id = 2"); got != "ink" {
		t.Errorf("memory table after restart: %q", got)
	}
	// Hidden row ids of the new run do not collide with the old ones.
	exec(t, db, "INSERT INTO history VALUES (1, 2.00, 'after restart')")
	if got := rows(t, db, "SELECT h_data FROM history ORDER BY h_amount"); got != "before restart\nafter restart" {
		t.Errorf("history after restart: %q", got)
	}
	if got := rows(t, db, "SHOW TABLES"); got != "customer\nhistory\nitem\nwarehouse" {
		t.Errorf("SHOW TABLES: %q", got)
	}
	exec(t, db, "DROP TABLE history")
	if _, err := db.Exec("SELECT * FROM history"); mysqlErrno(err) != 1146 {
		t.Errorf("dropped table: %v", err)
	}
	_ = time.Second
}

// TestInsertValuesWithoutTheEngine: VALUES items that are literals or
// placeholders skip the evaluation engine; each column type must store
// exactly what the engine's path stores, and refuse what it refuses.
func TestInsertValuesWithoutTheEngine(t *testing.T) {
	s := start(t, t.TempDir())
	defer s.stop(t)
	db := s.db(t)
	exec(t, db, "CREATE TABLE v (k INT PRIMARY KEY, i BIGINT, d DECIMAL(8,2), s VARCHAR(10), ts DATETIME, f DOUBLE, n INT)")
	exec(t, db, "INSERT INTO v VALUES (1, 42, '3.5', 'x', '2026-01-02 03:04:05', '2.5', NULL)")
	exec(t, db, "INSERT INTO v VALUES (?, ?, ?, ?, ?, ?, ?)", 2, 42, "3.5", "x", "2026-01-02 03:04:05", 2.5, nil)
	exec(t, db, "INSERT INTO v VALUES (3, 40+2, 3.5+0, concat('x'), concat('2026-01-02 03:04:05'), 2.5+0, NULL+0)")
	got := rows(t, db, "SELECT i, d, s, ts, f, n FROM v ORDER BY k")
	want := strings.Repeat("42|3.50|x|2026-01-02 03:04:05|2.5|NULL\n", 3)
	if got != want[:len(want)-1] {
		t.Fatalf("rows:\n%s\nwant each as the engine stores it:\n%s", got, want)
	}
	for _, c := range []struct{ plain, engine string }{
		{"INSERT INTO v (k, i) VALUES (10, 'abc')", "INSERT INTO v (k, i) VALUES (11, concat('abc'))"},
		{"INSERT INTO v (k, ts) VALUES (12, 'not a time')", "INSERT INTO v (k, ts) VALUES (13, concat('not a time'))"},
		{"INSERT INTO v (k, s) VALUES (14, 'much too long')", "INSERT INTO v (k, s) VALUES (15, concat('much too long'))"},
	} {
		_, perr := db.Exec(c.plain)
		_, eerr := db.Exec(c.engine)
		if (perr == nil) != (eerr == nil) {
			t.Errorf("%s: %v, but %s: %v", c.plain, perr, c.engine, eerr)
		}
	}
	if got := rows(t, db, "SELECT i, ts, s FROM v WHERE k >= 10 ORDER BY k"); got != "" {
		if plain, engine := rows(t, db, "SELECT i, ts, s FROM v WHERE k IN (10, 12, 14) ORDER BY k"), rows(t, db, "SELECT i, ts, s FROM v WHERE k IN (11, 13, 15) ORDER BY k"); plain != engine {
			t.Errorf("kept rows differ: plain\n%s\nengine\n%s", plain, engine)
		}
	}
}
