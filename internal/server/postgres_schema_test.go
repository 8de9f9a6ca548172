package server_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestPostgresSchemaChanges: an added column appears in Retina, NULL in the
// rows written before it, also in a transaction that writes both shapes,
// in a table without a key (whose rows are found by content) and after a
// restart; a dropped column stays in Retina and reads NULL for rows written
// after the drop; a change Retina cannot follow (a column added with a
// default, a renamed column, a changed type) stops the source with an
// error naming the table and the column, and nothing after it is applied.
func TestPostgresSchemaChanges(t *testing.T) {
	_, dsn, pg := startPostgres(t)

	t.Run("add column", func(t *testing.T) {
		exec(t, pg, `CREATE TABLE adding (id int PRIMARY KEY, a int)`, `INSERT INTO adding VALUES (1, 1)`,
			`CREATE TABLE adding_bag (a int, b text)`, `ALTER TABLE adding_bag REPLICA IDENTITY FULL`,
			`INSERT INTO adding_bag VALUES (1, 'x'), (1, 'x'), (2, 'y')`)
		dir := t.TempDir()
		source := dsn + "&slot=adding&publication=adding&tables=public.adding,public.adding_bag"
		r := startRetina(t, dir, source)
		retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
		caughtUp(t, r, pg, retina)
		exec(t, pg, `BEGIN`, `INSERT INTO adding VALUES (2, 2)`, `ALTER TABLE adding ADD COLUMN b text`,
			`INSERT INTO adding VALUES (3, 3, 'three')`, `UPDATE adding SET b = 'one' WHERE id = 1`, `COMMIT`,
			`ALTER TABLE adding_bag ADD COLUMN c int`, `INSERT INTO adding_bag VALUES (3, 'z', 3)`,
			`UPDATE adding_bag SET c = 1 WHERE a = 1`, `DELETE FROM adding_bag WHERE a = 2`)
		caughtUp(t, r, pg, retina)
		checkSame := func(when string) {
			t.Helper()
			for _, q := range []string{
				"SELECT id, a, coalesce(b, 'NULL') FROM adding ORDER BY id",
				"SELECT a, b, coalesce(CAST(c AS text), 'NULL') FROM adding_bag ORDER BY a, b, c",
			} {
				got, want := textRows(t, retina, q), textRows(t, pg, q)
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("%s: %s: Retina has %v, PostgreSQL %v", when, q, got, want)
				}
			}
		}
		checkSame("added")
		r.close(t)
		exec(t, pg, `INSERT INTO adding VALUES (4, 4, 'four')`, `UPDATE adding SET b = NULL WHERE id = 3`,
			`ALTER TABLE adding ADD COLUMN c int`, `UPDATE adding SET c = 2 WHERE id = 2`,
			`UPDATE adding_bag SET c = 5 WHERE c IS NULL`)
		r = startRetina(t, dir, source)
		defer r.close(t)
		retina = connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
		caughtUp(t, r, pg, retina)
		checkSame("after a restart")
		q := "SELECT id, coalesce(CAST(c AS text), 'NULL') FROM adding ORDER BY id"
		if got, want := textRows(t, retina, q), textRows(t, pg, q); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("after a restart: %s: Retina has %v, PostgreSQL %v", q, got, want)
		}
		// A drop and an add between two changes look like a rename in the
		// stream; PostgreSQL's column numbers tell them apart.
		exec(t, pg, `ALTER TABLE adding DROP COLUMN a`, `ALTER TABLE adding ADD COLUMN d int`, `INSERT INTO adding VALUES (5, 'five', 5, 5)`)
		caughtUp(t, r, pg, retina)
		q = "SELECT id, coalesce(b, 'NULL'), coalesce(CAST(c AS text), 'NULL'), coalesce(CAST(d AS text), 'NULL') FROM adding ORDER BY id"
		if got, want := textRows(t, retina, q), textRows(t, pg, q); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("after a drop and an add: %s: Retina has %v, PostgreSQL %v", q, got, want)
		}
	})
	t.Run("drop column", func(t *testing.T) {
		exec(t, pg, `CREATE TABLE dropping (id int PRIMARY KEY, a int, gone text)`, `INSERT INTO dropping VALUES (1, 1, 'kept')`)
		r := startRetina(t, t.TempDir(), dsn+"&slot=dropping&publication=dropping&tables=public.dropping")
		defer r.close(t)
		retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
		caughtUp(t, r, pg, retina)
		exec(t, pg, `ALTER TABLE dropping DROP COLUMN gone`, `INSERT INTO dropping VALUES (2, 2)`, `UPDATE dropping SET a = 3 WHERE id = 2`)
		caughtUp(t, r, pg, retina)
		got := textRows(t, retina, "SELECT id, a, coalesce(gone, 'NULL') FROM dropping ORDER BY id")
		want := [][]string{{"1", "1", "kept"}, {"2", "3", "NULL"}}
		if len(got) != 2 || strings.Join(got[0], " ") != strings.Join(want[0], " ") || strings.Join(got[1], " ") != strings.Join(want[1], " ") {
			t.Fatalf("rows %v, want %v", got, want)
		}
	})
	for _, c := range []struct {
		name, ddl, column string
	}{
		{"add column with a default", `ALTER TABLE %s ADD COLUMN b int DEFAULT 5`, "b"},
		{"rename column", `ALTER TABLE %s RENAME COLUMN a TO renamed`, "renamed"},
		{"type change", `ALTER TABLE %s ALTER COLUMN a TYPE bigint`, "a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			table := strings.ReplaceAll(c.name, " ", "_")
			exec(t, pg, `CREATE TABLE `+table+` (id int PRIMARY KEY, a int)`, `INSERT INTO `+table+` VALUES (1, 1)`)
			r := startRetina(t, t.TempDir(), dsn+"&slot="+table+"&publication="+table+"&tables=public."+table)
			defer func() { r.stop(); <-r.done }()
			retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
			caughtUp(t, r, pg, retina)
			exec(t, pg, strings.ReplaceAll(c.ddl, "%s", table), `INSERT INTO `+table+` (id) VALUES (2)`)
			deadline := time.Now().Add(time.Minute)
			for r.srv.Failure() == nil {
				if time.Now().After(deadline) {
					t.Fatal("the source did not stop")
				}
				time.Sleep(10 * time.Millisecond)
			}
			msg := r.srv.Failure().Error()
			if !strings.Contains(msg, "public."+table) || !strings.Contains(msg, "column "+c.column) {
				t.Fatalf("error %q does not name public.%s and column %s", msg, table, c.column)
			}
			if got := textRows(t, retina, "SELECT count(*) FROM "+table); got[0][0] != "1" {
				t.Fatalf("%s rows after the stop, want the 1 before it", got[0][0])
			}
		})
	}
}

// logTo is a slog sink tests read back.
type logTo struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logTo) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logTo) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestPostgresCopyStoppedMidwayStartsOver: Retina stopped in the middle of
// the initial copy does not resume it (the exported snapshot is gone): the
// next start drops and re-creates the slot, empties the tables and copies
// again, and ends with every row once.
func TestPostgresCopyStoppedMidwayStartsOver(t *testing.T) {
	if testing.Short() {
		t.Skip("a copy of a million rows: not in -short")
	}
	_, dsn, pg := startPostgres(t)
	exec(t, pg, `CREATE TABLE copied (id int PRIMARY KEY, a int)`, `INSERT INTO copied SELECT i, i FROM generate_series(1, 1000000) i`)
	source := dsn + "&slot=copied"
	dir := t.TempDir()
	r := startRetina(t, dir, source)
	retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	deadline := time.Now().Add(time.Minute)
	for {
		var n int64
		if err := retina.QueryRow(context.Background(), "SELECT count(*) FROM copied").Scan(&n); err == nil && n > 0 {
			if n == 1000000 {
				t.Fatal("the copy finished before the stop: nothing to test")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no row copied")
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.close(t)
	exec(t, pg, `DELETE FROM copied WHERE id <= 1000`, `UPDATE copied SET a = -a WHERE id > 999000`)
	var log logTo
	r = startRetinaLogged(t, dir, source, slog.New(slog.NewTextHandler(&log, nil)))
	defer r.close(t)
	retina = connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	caughtUp(t, r, pg, retina)
	sameTables(t, pg, retina, map[string]string{"copied": "SELECT count(*), sum(a)::bigint, min(id), max(id) FROM copied"})
	if !strings.Contains(log.String(), "copying again") {
		t.Fatalf("the second start did not copy again; its log:\n%s", log.String())
	}
}
