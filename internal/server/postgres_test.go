package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retinadb/retina/internal/pgtest"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
)

// startPostgres starts a private PostgreSQL, stopped when the test ends,
// and connects to its postgres database.
func startPostgres(t *testing.T) (*pgtest.Cluster, string, *pgx.Conn) {
	t.Helper()
	cl, err := pgtest.Start(context.Background(), pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	dsn := cl.DSN("postgres")
	return cl, dsn, connect(t, dsn)
}

// pgRun is a Retina server fed by a PostgreSQL source, running until stop.
type pgRun struct {
	srv  *server.Server
	stop context.CancelFunc
	done chan error
}

func startRetina(t *testing.T, dir, source string) *pgRun {
	t.Helper()
	return startRetinaLogged(t, dir, source, servertest.Quiet())
}

func startRetinaLogged(t *testing.T, dir, source string, lg *slog.Logger) *pgRun {
	t.Helper()
	return startServer(t, dir, lg, func(cfg *server.Config) { cfg.Sources = []string{source} })
}

// startServer runs a server on dir with loopback endpoints, a 1 s
// checkpoint interval, and what set changes.
func startServer(t *testing.T, dir string, lg *slog.Logger, set func(*server.Config)) *pgRun {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.DataDir, cfg.SQLAddr, cfg.HTTPAddr = dir, "127.0.0.1:0", "127.0.0.1:0"
	cfg.CheckpointInterval = time.Second
	set(&cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := server.Start(ctx, cfg, server.Options{Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	r := &pgRun{srv: srv, stop: stop, done: make(chan error, 1)}
	go func() { r.done <- srv.Run(runCtx) }()
	return r
}

func (r *pgRun) close(t *testing.T) {
	t.Helper()
	r.stop()
	if err := <-r.done; err != nil {
		t.Fatalf("retina stopped with: %v", err)
	}
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func exec(t *testing.T, c *pgx.Conn, stmts ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range stmts {
		if _, err := c.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// textRows returns a query's rows rendered as text.
func textRows(t *testing.T, c *pgx.Conn, q string) [][]string {
	t.Helper()
	out, err := tryTextRows(c, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return out
}

// tryTextRows is textRows that returns the statement's error.
func tryTextRows(c *pgx.Conn, q string) ([][]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs, err := c.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out [][]string
	for rs.Next() {
		vals, err := rs.Values()
		if err != nil {
			return nil, err
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = fmt.Sprint(v)
		}
		out = append(out, row)
	}
	return out, rs.Err()
}

// caughtUp waits, through retina_wait_lsn, until Retina shows every
// commit PostgreSQL has made so far.
func caughtUp(t *testing.T, r *pgRun, pg, retina *pgx.Conn) {
	t.Helper()
	var lsn string
	if err := pg.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	var ok bool
	if err := retina.QueryRow(context.Background(), fmt.Sprintf("SELECT retina_wait_lsn('%s', 60)", lsn)).Scan(&ok); err != nil || !ok {
		t.Fatalf("retina_wait_lsn(%s): %v %v (ingestion: %v)", lsn, ok, err, r.srv.Failure())
	}
}

// sameTables compares the tables' contents, every column as text.
func sameTables(t *testing.T, pg, retina *pgx.Conn, queries map[string]string) {
	t.Helper()
	for name, q := range queries {
		want, got := textRows(t, pg, q), textRows(t, retina, q)
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("%s differs: PostgreSQL has %d rows, Retina %d\nPostgreSQL: %.600v\nRetina:     %.600v", name, len(want), len(got), want, got)
		}
	}
}

// TestPostgresSource runs the whole path against a private PostgreSQL:
// the initial copy, streamed inserts, updates, deletes, a primary-key
// change, an unchanged TOAST value, a truncate of several tables with
// CASCADE, a table without a key (inserts only) and one under REPLICA
// IDENTITY FULL (updates and deletes of rows with equal values); then Retina stopped and restarted
// while PostgreSQL writes, PostgreSQL restarted under Retina, and a table
// created after the start. After
// each step every table equals PostgreSQL's, and the slot confirms what
// Retina applied.
func TestPostgresSource(t *testing.T) {
	cl, dsn, pg := startPostgres(t)
	exec(t, pg,
		`CREATE TABLE acct (id int PRIMARY KEY, owner text NOT NULL, bal numeric(12,2))`,
		`CREATE TABLE branch (id int PRIMARY KEY, name text)`,
		`CREATE TABLE teller (id int PRIMARY KEY, branch int REFERENCES branch (id))`,
		`CREATE TABLE hist (acct int, delta int, at timestamp DEFAULT now())`,
		`CREATE TABLE doc (id int PRIMARY KEY, n int, body text)`,
		`ALTER TABLE doc REPLICA IDENTITY FULL`,
		`CREATE TABLE note (id int PRIMARY KEY, n int, body text)`, // REPLICA IDENTITY DEFAULT
		`CREATE TABLE log (k int, v text, big text)`,               // no key: rows found by content
		`ALTER TABLE log REPLICA IDENTITY FULL`,
		`INSERT INTO log SELECT i % 10, 'v' || (i % 3), NULL FROM generate_series(1, 100) i`,
		`INSERT INTO log SELECT 20, 'toasted', (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g)`,
		`INSERT INTO acct SELECT i, 'owner ' || i, i * 1.25 FROM generate_series(1, 3000) i`,
		`INSERT INTO branch SELECT i, 'b' || i FROM generate_series(1, 10) i`,
		`INSERT INTO teller SELECT i, 1 + i % 10 FROM generate_series(1, 50) i`,
		`INSERT INTO hist (acct, delta) SELECT i % 7, i FROM generate_series(1, 200) i`,
		`INSERT INTO doc SELECT i, 0, (SELECT string_agg(md5(i::text || g::text), '') FROM generate_series(1, 300) g) FROM generate_series(1, 5) i`,
		`INSERT INTO note SELECT i, 0, (SELECT string_agg(md5(i::text || g::text), '') FROM generate_series(1, 300) g) FROM generate_series(1, 5) i`,
	)
	queries := map[string]string{
		"acct":   "SELECT id, owner, bal FROM acct ORDER BY id",
		"branch": "SELECT id, name FROM branch ORDER BY id",
		"teller": "SELECT id, branch FROM teller ORDER BY id",
		"hist":   "SELECT acct, delta FROM hist ORDER BY acct, delta",
		"doc":    "SELECT id, n, length(body), md5(body) FROM doc ORDER BY id",
		"note":   "SELECT id, n, length(body), md5(body) FROM note ORDER BY id",
		"log":    "SELECT k, v, md5(coalesce(big, '')) FROM log ORDER BY 1, 2, 3",
	}
	dir := t.TempDir()
	source := dsn + "&slot=retina_test&publication=retina_test"
	r := startRetina(t, dir, source)
	retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	caughtUp(t, r, pg, retina)
	sameTables(t, pg, retina, queries)

	exec(t, pg,
		`BEGIN`,
		`UPDATE acct SET bal = bal + 1 WHERE id % 3 = 0`,
		`DELETE FROM acct WHERE id % 10 = 1`,
		`UPDATE acct SET id = id + 100000 WHERE id <= 20`, // primary-key change
		`INSERT INTO hist (acct, delta) VALUES (1, -5), (1, -5)`,
		`COMMIT`,
		`UPDATE doc SET n = n + 1`,                 // body is an unchanged TOAST value, in the old row
		`UPDATE note SET n = n + 1`,                // … not sent: the replayer reads the current version
		`UPDATE note SET n = n + 1 WHERE id <= 2`,  // … of a version written in the same batch
		`UPDATE log SET v = 'changed' WHERE k = 1`, // rows with equal values, one by one
		`DELETE FROM log WHERE ctid IN (SELECT ctid FROM log WHERE k = 2 LIMIT 3)`,
		`DELETE FROM log WHERE k = 3`,
		`UPDATE log SET k = 21 WHERE k = 20`, // big is an unchanged TOAST value
		`BEGIN`,
		`INSERT INTO log VALUES (30, 'brief', NULL)`,
		`UPDATE log SET v = 'briefer' WHERE k = 30`,
		`DELETE FROM log WHERE k = 30`,
		`COMMIT`,
		`TRUNCATE branch, teller`,
		`INSERT INTO branch VALUES (1, 'again')`,
		`TRUNCATE branch CASCADE`, // teller too
		`INSERT INTO branch VALUES (2, 'after cascade')`,
	)
	caughtUp(t, r, pg, retina)
	sameTables(t, pg, retina, queries)

	// Retina stops; PostgreSQL goes on; Retina restarts from its checkpoint.
	r.close(t)
	exec(t, pg,
		`INSERT INTO acct SELECT i, 'late ' || i, 0 FROM generate_series(5001, 5500) i`,
		`INSERT INTO hist (acct, delta) SELECT 9, i FROM generate_series(1, 100) i`,
		`DELETE FROM acct WHERE id BETWEEN 100 AND 200`,
		`UPDATE note SET n = n + 10`, // the current versions are in regular files now
		`DELETE FROM log WHERE k = 4`,
		`UPDATE log SET v = 'late' WHERE k = 5`,
		// A table that comes and goes while Retina is down: its changes
		// are in the stream, its catalog entry is gone.
		`CREATE TABLE gone (id int PRIMARY KEY, v text)`,
		`INSERT INTO gone VALUES (1, 'written before the drop')`,
		`DROP TABLE gone`,
	)
	r = startRetina(t, dir, source)
	defer r.close(t)
	retina = connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	caughtUp(t, r, pg, retina)
	sameTables(t, pg, retina, queries)
	if got := textRows(t, retina, "SELECT id, v FROM gone"); len(got) != 1 || got[0][1] != "written before the drop" {
		t.Fatalf("the dropped table's rows in Retina: %v", got)
	}

	// PostgreSQL restarts under Retina: the source reconnects.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg.Close(ctx)
	if err := cl.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := cl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pg = connect(t, dsn)
	exec(t, pg,
		`UPDATE acct SET bal = 7 WHERE id > 5400`,
		`INSERT INTO hist (acct, delta) VALUES (3, 3)`,
		`TRUNCATE log`,
		`INSERT INTO log VALUES (7, 'x', NULL), (7, 'x', NULL), (8, 'y', NULL)`,
		`DELETE FROM log WHERE ctid IN (SELECT ctid FROM log WHERE k = 7 LIMIT 1)`,
		`UPDATE log SET v = 'z' WHERE k = 8`,
		// A table created now is in the publication (FOR ALL TABLES): it
		// appears in Retina with its first change.
		`CREATE TABLE later (id bigint PRIMARY KEY, what text)`,
		`INSERT INTO later VALUES (1, 'made after the start'), (2, 'too')`,
	)
	queries["later"] = "SELECT id, what FROM later ORDER BY id"
	caughtUp(t, r, pg, retina)
	sameTables(t, pg, retina, queries)

	// The slot confirms what the checkpoints made durable: it reaches the
	// current WAL position once a checkpoint covers the last commit.
	var cur string
	if err := pg.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&cur); err != nil {
		t.Fatal(err)
	}
	for {
		var confirmedOK bool
		err := pg.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'retina_test'`, cur).Scan(&confirmedOK)
		if err != nil {
			t.Fatal(err)
		}
		if confirmedOK {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the slot never confirmed %s", cur)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if got := textRows(t, retina, "SELECT count(*) FROM hist"); !strings.HasPrefix(got[0][0], "303") {
		t.Fatalf("hist has %v rows, want 303", got)
	}
	// The source's figures are on the metrics endpoint, labelled with the
	// URI (no password in it).
	resp, err := http.Get("http://" + r.srv.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"retina_source_lag_bytes", "retina_source_lag_seconds", "retina_source_slot_retained_bytes", "retina_source_confirmed_lsn"} {
		if !strings.Contains(string(body), name+`{source="postgres://retina@127.0.0.1:`) {
			t.Errorf("metrics lack %s for the source", name)
		}
	}
}
