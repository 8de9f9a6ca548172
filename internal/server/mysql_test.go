package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retinadb/retina/internal/mysqltest"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
)

// startMariaDB starts a private MariaDB with the binary log as the MySQL
// source needs it, stopped when the test ends.
func startMariaDB(t *testing.T) *mysqltest.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := mysqltest.Start(ctx, mysqltest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func myExec(t *testing.T, m *mysqltest.Server, db string, stmts ...string) {
	t.Helper()
	if err := m.Exec(db, stmts...); err != nil {
		t.Fatal(err)
	}
}

// myRows returns a query's rows on MariaDB as text (NULL as "<nil>").
func myRows(t *testing.T, m *mysqltest.Server, db, q string) [][]string {
	t.Helper()
	c, err := m.Connect(db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Execute(q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer r.Close()
	var out [][]string
	for i := range r.Values {
		row := make([]string, len(r.Values[i]))
		for j := range r.Values[i] {
			switch v := r.Values[i][j].Value().(type) {
			case nil:
				row[j] = "<nil>"
			case []byte:
				row[j] = string(v)
			default:
				row[j] = fmt.Sprint(v)
			}
		}
		out = append(out, row)
	}
	return out
}

// myCaughtUp waits, through retina_wait_mysql, until Retina shows every
// transaction MariaDB has committed so far.
func myCaughtUp(t *testing.T, r *pgRun, m *mysqltest.Server, retina *pgx.Conn) {
	t.Helper()
	pos := myRows(t, m, "", "SELECT @@gtid_binlog_pos")[0][0]
	var ok bool
	if err := retina.QueryRow(context.Background(), fmt.Sprintf("SELECT retina_wait_mysql('%s', 60)", pos)).Scan(&ok); err != nil || !ok {
		t.Fatalf("retina_wait_mysql(%s): %v %v (ingestion: %v)", pos, ok, err, r.srv.Failure())
	}
}

// sameAsMariaDB compares query results on MariaDB and Retina, as text.
func sameAsMariaDB(t *testing.T, m *mysqltest.Server, db string, retina *pgx.Conn, queries map[string][2]string) {
	t.Helper()
	for name, q := range queries {
		want, got := myRows(t, m, db, q[0]), textRows(t, retina, q[1])
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("%s differs: MariaDB has %d rows, Retina %d\nMariaDB: %.800v\nRetina:  %.800v", name, len(want), len(got), want, got)
		}
	}
}

const typesTable = `CREATE TABLE types (
	id int PRIMARY KEY,
	ti tinyint, tiu tinyint unsigned, si smallint, siu smallint unsigned, mi mediumint, miu mediumint unsigned,
	i int, iu int unsigned, bi bigint, biu bigint unsigned,
	d decimal(12,3), dbig decimal(50,10), f float, db double,
	dt date, dtm datetime(6), dt0 datetime, ts timestamp(3) NULL, tm time(2), y year,
	c char(5), vc varchar(20), tx text, l1 varchar(10) CHARACTER SET latin1, asc1 varchar(10) CHARACTER SET ascii,
	bin binary(4), vb varbinary(10), bl blob, j json,
	e enum('x','y','z'), st set('p','q','r'), b1 bit(1), b10 bit(10), b64 bit(64))`

const typesValues = `(%d, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295, -9223372036854775808, 18446744073709551615,
	-123456789.125, 1234567890123456789012345678901234567890.0123456789, 1.2345678, 2.718281828459045,
	'2024-02-29', '2024-02-29 12:34:56.123456', '1999-12-31 23:59:59', '2024-01-01 00:00:00.5', '-838:00:00.25', 2024,
	'abc', 'héllo wörld', 'τεξτ ✓ 🚀', 'café', 'plain',
	x'01', x'00ff00', x'deadbeef', '{"a": [1, 2]}',
	'y', 'p,r', b'1', b'1010101010', b'1111111111111111111111111111111111111111111111111111111111111111')`

// TestMySQLSourceTypes copies a row of every type, streams the same
// values and a row of NULLs, and checks that Retina holds each value
// exactly, the copied and the streamed row alike.
func TestMySQLSourceTypes(t *testing.T) {
	m := startMariaDB(t)
	myExec(t, m, "", "CREATE DATABASE shop")
	myExec(t, m, "shop", typesTable, fmt.Sprintf("INSERT INTO types VALUES "+typesValues, 1))
	r := startRetina(t, t.TempDir(), m.URI("shop", ""))
	defer r.close(t)
	retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	myCaughtUp(t, r, m, retina)
	myExec(t, m, "shop", fmt.Sprintf("INSERT INTO types VALUES "+typesValues, 2), "INSERT INTO types (id) VALUES (3)",
		fmt.Sprintf("INSERT INTO types VALUES "+typesValues, 4), "UPDATE types SET vc = 'updated' WHERE id = 4")
	myCaughtUp(t, r, m, retina)
	cols := "ti, tiu, si, siu, mi, miu, i, iu, bi, biu, d, dbig, f, db, dt, dtm, dt0, ts, tm, y, c, vc, tx, l1, asc1, bin, vb, bl, j, e, st, b1, b10, b64"
	exprs := strings.NewReplacer("biu,", "biu::text,", " d,", " d::text,", "b64", "b64::text").Replace(cols)
	rows := textRows(t, retina, "SELECT "+exprs+" FROM types ORDER BY id")
	if len(rows) != 4 {
		t.Fatalf("Retina has %d rows of types, want 4: %v", len(rows), rows)
	}
	want := []string{"-128", "255", "-32768", "65535", "-8388608", "16777215", "-2147483648", "4294967295", "-9223372036854775808", "18446744073709551615",
		"-123456789.125", "1234567890123456789012345678901234567890.0123456789", "1.2345678", "2.718281828459045",
		"2024-02-29 00:00:00 +0000 UTC", "2024-02-29 12:34:56.123456 +0000 UTC", "1999-12-31 23:59:59 +0000 UTC", "2024-01-01 00:00:00.5 +0000 UTC", "-838:00:00.25", "2024",
		"abc", "héllo wörld", "τεξτ ✓ 🚀", "café", "plain",
		"[1 0 0 0]", "[0 255 0]", "[222 173 190 239]", `{"a": [1, 2]}`,
		"y", "p,r", "true", "682", "18446744073709551615"}
	for i, name := range strings.Split(cols, ", ") {
		if rows[0][i] != want[i] {
			t.Errorf("copied %s = %s, want %s", name, rows[0][i], want[i])
		}
		if rows[1][i] != want[i] {
			t.Errorf("streamed %s = %s, want %s", name, rows[1][i], want[i])
		}
		if rows[2][i] != "<nil>" {
			t.Errorf("streamed NULL %s = %s", name, rows[2][i])
		}
	}
	if rows[3][21] != "updated" || rows[3][0] != want[0] {
		t.Errorf("updated row: %v", rows[3])
	}
	// The console shows the source following, at its GTID position.
	resp, err := http.Get("http://" + r.srv.HTTPAddr() + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Sources []struct{ Name, State, Position string }
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || len(st.Sources) != 1 || st.Sources[0].State != "following" || !strings.HasPrefix(st.Sources[0].Position, "gtid:0-1-") ||
		!strings.HasPrefix(st.Sources[0].Name, "mysql://root@") {
		t.Fatalf("/api/status sources: %+v %v", st.Sources, err)
	}
}

// TestMySQLSourceSchemaAndKeyless follows what Retina can follow exactly:
// a table created after the start, a column added as NULL and one
// dropped, TRUNCATE, DROP TABLE (Retina keeps the table, empty), a table
// without a primary key (rows found by content, duplicates included), a
// large BLOB and TEXT left untouched by an update of another column, and
// one transaction of a million rows; each step equals MariaDB's tables.
func TestMySQLSourceSchemaAndKeyless(t *testing.T) {
	m := startMariaDB(t)
	myExec(t, m, "", "CREATE DATABASE app")
	myExec(t, m, "app",
		"CREATE TABLE acct (id int PRIMARY KEY, owner varchar(40) NOT NULL, bal decimal(12,2), note varchar(10))",
		"CREATE TABLE log (k int, v varchar(10))",
		"CREATE TABLE doc (id int PRIMARY KEY, n int, body longtext, data longblob)",
		"INSERT INTO acct SELECT seq, concat('owner ', seq), seq * 1.25, 'n' FROM seq_1_to_3000",
		"INSERT INTO log SELECT seq % 10, concat('v', seq % 3) FROM seq_1_to_100",
		"INSERT INTO doc SELECT seq, 0, repeat(md5(seq), 100000), unhex(repeat(md5(seq), 50000)) FROM seq_1_to_3")
	queries := map[string][2]string{
		"acct": {"SELECT id, owner, bal FROM acct ORDER BY id", "SELECT id, owner, bal::VARCHAR FROM acct ORDER BY id"},
		"log":  {"SELECT k, v, count(*) FROM log GROUP BY k, v ORDER BY k, v", "SELECT k, v, count(*) FROM log GROUP BY k, v ORDER BY k, v"},
		"doc": {"SELECT id, n, length(body), md5(body), length(data), md5(data) FROM doc ORDER BY id",
			"SELECT id, n, length(body), md5(body), octet_length(data), md5(data) FROM doc ORDER BY id"},
	}
	r := startRetina(t, t.TempDir(), m.URI("app", ""))
	defer r.close(t)
	retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	myCaughtUp(t, r, m, retina)
	sameAsMariaDB(t, m, "app", retina, queries)

	myExec(t, m, "app",
		"UPDATE acct SET bal = bal + 1 WHERE id % 7 = 0",
		"DELETE FROM acct WHERE id > 2900",
		"UPDATE doc SET n = n + 1", // the large values are not touched
		"DELETE FROM log WHERE k = 3 LIMIT 2",
		"UPDATE log SET v = 'moved' WHERE k = 4 LIMIT 3",
		"INSERT INTO log VALUES (1, 'v1'), (1, 'v1')",
		"ALTER TABLE acct ADD COLUMN tag varchar(8) NULL",
		"UPDATE acct SET tag = 'gold' WHERE id < 10",
		"ALTER TABLE acct DROP COLUMN note",
		"CREATE TABLE later (id bigint PRIMARY KEY, x double)",
		"INSERT INTO later VALUES (1, 0.5), (2, 1.5)",
		"CREATE TABLE gone (id int PRIMARY KEY)",
		"INSERT INTO gone VALUES (1)")
	myCaughtUp(t, r, m, retina)
	queries["acct"] = [2]string{"SELECT id, owner, bal, tag FROM acct ORDER BY id", "SELECT id, owner, bal::VARCHAR, tag FROM acct ORDER BY id"}
	queries["later"] = [2]string{"SELECT id, x FROM later ORDER BY id", "SELECT id, x FROM later ORDER BY id"}
	sameAsMariaDB(t, m, "app", retina, queries)
	// Versions written after the drop read NULL in the dropped column.
	myExec(t, m, "app", "UPDATE acct SET bal = 0 WHERE id < 20")
	myCaughtUp(t, r, m, retina)
	if got := textRows(t, retina, "SELECT count(*) FROM acct WHERE id < 20 AND note IS NOT NULL"); got[0][0] != "0" {
		t.Fatalf("a dropped column reads %s non-NULL values in rows updated after the drop", got[0][0])
	}

	// MariaDB restarted under Retina: the source reconnects and goes on.
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	myExec(t, m, "app", "TRUNCATE TABLE later", "INSERT INTO later VALUES (3, 3.5)", "DROP TABLE gone")
	myExec(t, m, "app", "INSERT INTO log SELECT seq % 1000, 'bulk' FROM seq_1_to_1000000")
	myCaughtUp(t, r, m, retina)
	sameAsMariaDB(t, m, "app", retina, queries)
	if got := textRows(t, retina, "SELECT count(*) FROM gone"); got[0][0] != "0" {
		t.Fatalf("a dropped table has %s rows in Retina, want 0", got[0][0])
	}
	// Iceberg publication, held while the copy ran, goes on after it.
	for deadline := time.Now().Add(30 * time.Second); r.srv.Node.Iceberg.Stats().Publications == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no Iceberg publication after the initial copy")
		}
	}
}

// waitFailure waits until ingestion stops and returns why.
func waitFailure(t *testing.T, r *pgRun) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.srv.Failure() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the source did not stop")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return r.srv.Failure().Error()
}

// TestMySQLSourceStopsOnWhatItCannotFollow: schema changes Retina cannot
// follow exactly stop the source with an error naming the table and the
// column and saying how to proceed; the rows before the change stay.
func TestMySQLSourceStopsOnWhatItCannotFollow(t *testing.T) {
	m := startMariaDB(t)
	for i, c := range []struct {
		name, ddl, names string
	}{
		{"add column with a default", "ALTER TABLE t ADD COLUMN b int DEFAULT 5", "column b"},
		{"add column not null", "ALTER TABLE t ADD COLUMN b varchar(3) NOT NULL DEFAULT ''", "column b"},
		{"rename column", "ALTER TABLE t RENAME COLUMN a TO renamed", "column a is renamed to renamed"},
		{"change column", "ALTER TABLE t CHANGE a renamed int", "column a is renamed to renamed"},
		{"type change", "ALTER TABLE t MODIFY a varchar(10)", "column a"},
		{"rename table", "RENAME TABLE t TO t2", "is renamed to t2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := fmt.Sprintf("s%d", i)
			myExec(t, m, "", "CREATE DATABASE "+db)
			myExec(t, m, db, "CREATE TABLE t (id int PRIMARY KEY, a int)", "INSERT INTO t VALUES (1, 1)")
			r := startRetina(t, t.TempDir(), m.URI(db, ""))
			defer func() { r.stop(); <-r.done }()
			retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
			myCaughtUp(t, r, m, retina)
			myExec(t, m, db, c.ddl)
			if c.name != "rename table" {
				myExec(t, m, db, "INSERT INTO t (id) VALUES (2)")
			}
			msg := waitFailure(t, r)
			if !strings.Contains(msg, db+".t") || !strings.Contains(msg, c.names) || !strings.Contains(msg, "copy=") && !strings.Contains(msg, "back") {
				t.Fatalf("error %q does not name %s.t and %q, or say how to proceed", msg, db, c.names)
			}
			if got := textRows(t, retina, "SELECT count(*) FROM t"); got[0][0] != "1" {
				t.Fatalf("%s rows after the stop, want the 1 before it", got[0][0])
			}
		})
	}
}

// TestMySQLSourcePurgedPosition: a checkpoint whose binlog position the
// server has purged stops the source with the position named and what to
// do; a new copy tag copies every table again and follows from there.
func TestMySQLSourcePurgedPosition(t *testing.T) {
	m := startMariaDB(t)
	myExec(t, m, "", "CREATE DATABASE p")
	myExec(t, m, "p", "CREATE TABLE t (id int PRIMARY KEY, v int)", "INSERT INTO t SELECT seq, seq FROM seq_1_to_100")
	dir := t.TempDir()
	r := startRetina(t, dir, m.URI("p", ""))
	retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	myCaughtUp(t, r, m, retina)
	r.close(t)
	myExec(t, m, "p", "INSERT INTO t VALUES (101, 101)", "DELETE FROM t WHERE id = 5", "FLUSH BINARY LOGS", "INSERT INTO t VALUES (102, 102)", "FLUSH BINARY LOGS")
	last := myRows(t, m, "", "SHOW MASTER STATUS")[0][0]
	// The server keeps files a dump thread still reads; Retina's thread may
	// outlive its connection until the server notices.
	for _, row := range myRows(t, m, "", "SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'") {
		myExec(t, m, "", "KILL "+row[0])
	}
	// The server also keeps files until their transactions are
	// checkpointed in InnoDB, which follows shortly.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		myExec(t, m, "", "PURGE BINARY LOGS TO '"+last+"'")
		logs := myRows(t, m, "", "SHOW BINARY LOGS")
		if len(logs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("binary logs after the purge: %v; warnings %v", logs, myRows(t, m, "", "SHOW WARNINGS"))
		}
	}

	r = startRetina(t, dir, m.URI("p", ""))
	msg := waitFailure(t, r)
	r.stop()
	<-r.done
	if !strings.Contains(msg, "purged") || !strings.Contains(msg, "copy=") || !strings.Contains(msg, "gtid:0-1-") {
		t.Fatalf("error %q does not name the position and what to do", msg)
	}
	r = startRetina(t, dir, m.URI("p", "copy=2"))
	defer r.close(t)
	published := r.srv.Node.Iceberg.Stats().Publications
	retina = connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	myExec(t, m, "p", "UPDATE t SET v = -v WHERE id > 95")
	myCaughtUp(t, r, m, retina)
	sameAsMariaDB(t, m, "p", retina, map[string][2]string{"t": {"SELECT id, v FROM t ORDER BY id", "SELECT id, v FROM t ORDER BY id"}})
	for deadline := time.Now().Add(30 * time.Second); r.srv.Node.Iceberg.Stats().Publications == published; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no Iceberg publication after the copy made again")
		}
	}
}

// TestMySQLSourceFilePositions follows the binlog by file and offset
// (positions=file, as on a MySQL server without GTIDs): the copy, the
// stream across a binlog rotation, a restart that resumes at the
// checkpointed offset, and retina_wait_mysql of SHOW MASTER STATUS.
func TestMySQLSourceFilePositions(t *testing.T) {
	m := startMariaDB(t)
	myExec(t, m, "", "CREATE DATABASE f")
	myExec(t, m, "f", "CREATE TABLE t (id int PRIMARY KEY, v varchar(10))", "INSERT INTO t SELECT seq, 'a' FROM seq_1_to_500")
	dir, uri := t.TempDir(), m.URI("f", "positions=file")
	caught := func(r *pgRun, retina *pgx.Conn) {
		t.Helper()
		st := myRows(t, m, "", "SHOW MASTER STATUS")[0]
		var ok bool
		if err := retina.QueryRow(context.Background(), fmt.Sprintf("SELECT retina_wait_mysql('%s:%s', 60)", st[0], st[1])).Scan(&ok); err != nil || !ok {
			t.Fatalf("retina_wait_mysql(%s:%s): %v %v (ingestion: %v)", st[0], st[1], ok, err, r.srv.Failure())
		}
	}
	queries := map[string][2]string{"t": {"SELECT id, v FROM t ORDER BY id", "SELECT id, v FROM t ORDER BY id"}}
	r := startRetina(t, dir, uri)
	retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	caught(r, retina)
	myExec(t, m, "f", "UPDATE t SET v = 'b' WHERE id % 3 = 0", "FLUSH BINARY LOGS", "DELETE FROM t WHERE id > 480", "INSERT INTO t VALUES (1000, 'z')")
	caught(r, retina)
	sameAsMariaDB(t, m, "f", retina, queries)
	// A wait for a GTID set is refused with what to give instead.
	if _, err := tryTextRows(retina, "SELECT retina_wait_mysql('0-1-5', 1)"); err == nil || !strings.Contains(err.Error(), "SHOW MASTER STATUS") {
		t.Fatalf("a GTID wait on a file-position source: %v", err)
	}
	// Stop (a final checkpoint), then restart while MariaDB writes.
	r.close(t)
	myExec(t, m, "f", "UPDATE t SET v = 'c' WHERE id < 50", "FLUSH BINARY LOGS", "INSERT INTO t VALUES (1001, 'y')")
	// MariaDB restarts (a new binlog file) while Retina is down.
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	myExec(t, m, "f", "DELETE FROM t WHERE id = 7")
	r = startRetina(t, dir, uri)
	defer r.close(t)
	retina = connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	caught(r, retina)
	sameAsMariaDB(t, m, "f", retina, queries)
	// It resumed at the checkpointed offset rather than copying again.
	resp, err := http.Get("http://" + r.srv.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^retina_source_snapshot_rows\{[^}]*\} 0$`).Match(body) {
		t.Fatalf("the restart copied again:\n%s", regexp.MustCompile(`(?m)^retina_source_snapshot_rows.*$`).Find(body))
	}
}

// TestMySQLAndPostgresSourcesTogether: one Retina follows a MariaDB and a
// PostgreSQL database at once; each waits on its own source and the
// metrics name both.
func TestMySQLAndPostgresSourcesTogether(t *testing.T) {
	m := startMariaDB(t)
	myExec(t, m, "", "CREATE DATABASE shop")
	myExec(t, m, "shop", "CREATE TABLE orders (id int PRIMARY KEY, total decimal(10,2))", "INSERT INTO orders VALUES (1, 9.50)")
	_, dsn, pg := startPostgres(t)
	exec(t, pg, "CREATE TABLE stock (sku int PRIMARY KEY, qty int)", "INSERT INTO stock VALUES (7, 3)")
	r := startServer(t, t.TempDir(), servertest.Quiet(), func(cfg *server.Config) {
		cfg.Sources = []string{m.URI("shop", ""), dsn + "&slot=together&publication=together"}
	})
	srv := r.srv
	defer r.close(t)
	retina := connect(t, "postgres://retina@"+srv.SQLAddr()+"/retina?sslmode=disable")
	myExec(t, m, "shop", "INSERT INTO orders VALUES (2, 1.25)")
	exec(t, pg, "UPDATE stock SET qty = 2")
	myCaughtUp(t, r, m, retina)
	caughtUp(t, r, pg, retina)
	if got := textRows(t, retina, "SELECT (SELECT sum(total)::VARCHAR FROM orders), (SELECT qty FROM stock)"); fmt.Sprint(got) != "[[10.75 2]]" {
		t.Fatalf("Retina has %v", got)
	}
	resp, err := http.Get("http://" + srv.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`retina_source_snapshot_rows{source="mysql://`, `retina_source_snapshot_rows{source="postgres://`} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
}
