package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retinadb/retina/internal/pgtest"
)

// PostgresConfig configures `retina bench postgres`.
type PostgresConfig struct {
	// Scale is pgbench's scale factor (100,000 accounts each).
	Scale int
	// Duration of pgbench's TPC-B-like run, unthrottled; Clients its
	// connections (pgbench's default is one).
	Duration time.Duration
	Clients  int
	// Kill: SIGKILL Retina halfway through the run and restart it.
	Kill bool
	// Heartbeat is how often a heartbeat row is committed for the lag;
	// CheckEvery how often the invariant is checked (0: only at the end).
	Heartbeat, CheckEvery time.Duration
	CheckpointInterval    time.Duration
	// Command runs retina (default: this executable).
	Command []string
	// Dir is the work directory (data directory, logs), kept; by default a
	// temporary one, removed.
	Dir string
}

// DefaultPostgresConfig is the run: scale 10, 30 s, a kill halfway.
func DefaultPostgresConfig() PostgresConfig {
	return PostgresConfig{Scale: 10, Duration: 30 * time.Second, Clients: 1, Kill: true, Heartbeat: 20 * time.Millisecond, CheckEvery: 500 * time.Millisecond,
		CheckpointInterval: time.Second}
}

// Postgres runs a private PostgreSQL, loads it with pgbench -i, starts
// retina serve on it (the initial copy), then runs pgbench at full speed
// with a heartbeat table while it checks pgbench's invariant in every
// sampled Retina snapshot, kills Retina halfway and restarts it, and at the
// end compares every table with PostgreSQL's.
func Postgres(ctx context.Context, r *Report, cfg PostgresConfig) error {
	command, dir, cleanup, err := childRun(cfg.Command, cfg.Dir, "retina-bench-postgres-")
	if err != nil {
		return err
	}
	defer cleanup()
	cfg.Command = command
	cl, err := pgtest.Start(ctx, pgtest.Options{Durable: true, Settings: []string{"max_wal_size = 4GB", "checkpoint_timeout = 30min"}})
	if err != nil {
		return err
	}
	defer cl.Close()
	r.Printf("PostgreSQL on 127.0.0.1:%d; pgbench -i -s %d", cl.Port, cfg.Scale)
	if _, err := cl.Run(ctx, "postgres", "pgbench", "-i", "-q", "-s", strconv.Itoa(cfg.Scale)); err != nil {
		return err
	}
	pg, err := pgx.Connect(ctx, cl.DSN("postgres"))
	if err != nil {
		return err
	}
	defer pg.Close(context.Background())
	if _, err := pg.Exec(ctx, `CREATE TABLE retina_heartbeat (id bigint PRIMARY KEY, ts timestamptz NOT NULL)`); err != nil {
		return err
	}
	var copyRows int64
	if err := pg.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgbench_accounts) + (SELECT count(*) FROM pgbench_tellers) +
		(SELECT count(*) FROM pgbench_branches) + (SELECT count(*) FROM pgbench_history)`).Scan(&copyRows); err != nil {
		return err
	}
	start, logPath, tailLog, closeLog, err := serveOn(ctx, cfg.Command, dir, cl.DSN("postgres")+"&slot=bench&publication=bench", cfg.CheckpointInterval)
	if err != nil {
		return err
	}
	defer closeLog()
	// waitLSN returns once Retina shows every commit PostgreSQL made so far.
	waitLSN := func(conn *pgx.Conn) error {
		var lsn string
		if err := pg.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
			return err
		}
		var ok bool
		return conn.QueryRow(ctx, fmt.Sprintf("SELECT retina_wait_lsn('%s', 600)", lsn)).Scan(&ok)
	}

	began := time.Now()
	c, retina, err := start()
	if err != nil {
		return err
	}
	defer func() { c.kill() }()
	if err := waitLSN(retina); err != nil {
		return fmt.Errorf("initial copy: %w; retina's log ends:\n%s", err, tailLog())
	}
	if err := reportCopy(r, logPath, "created replication slot", "the slot was created", copyRows, began, time.Now()); err != nil {
		return err
	}

	// pgbench, the heartbeat and the invariant checker run together;
	// Retina is killed and restarted halfway.
	var pgbenchOut []byte
	hpg, err := pgx.Connect(ctx, cl.DSN("postgres"))
	if err != nil {
		return err
	}
	defer hpg.Close(context.Background())
	heartbeatID := int64(0)
	load := sourceLoad{start: start, caughtUp: waitLSN, killAfter: killHalfway(cfg.Kill, cfg.Duration), heartbeat: cfg.Heartbeat, checkEvery: cfg.CheckEvery, tailLog: tailLog,
		load: func(ctx context.Context) error {
			var err error
			pgbenchOut, err = cl.Run(ctx, "postgres", "pgbench", "-n", "-c", strconv.Itoa(cfg.Clients), "-j", "2",
				"-T", strconv.Itoa(int(cfg.Duration.Seconds())))
			return err
		},
		// A heartbeat row, then retina_wait_lsn of the WAL position after
		// its commit.
		beat: func(ctx context.Context) (string, error) {
			heartbeatID++
			if _, err := hpg.Exec(ctx, "INSERT INTO retina_heartbeat VALUES ($1, clock_timestamp())", heartbeatID); err != nil {
				return "", err
			}
			var lsn string
			if err := hpg.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
				return "", err
			}
			return fmt.Sprintf("SELECT retina_wait_lsn('%s', 10)", lsn), nil
		},
		check: func(ctx context.Context, conn *pgx.Conn) (string, error) {
			ok, err := pgbenchInvariant(ctx, conn)
			if err != nil || ok {
				return "", err
			}
			return "the balances disagree", nil
		},
	}
	res, err := load.run(ctx, r, &c, &retina)
	if err != nil {
		return err
	}
	heartbeats, checks, invariantFailures, kills, restartCatchUp, catchUp, lags := res.heartbeats, res.checks, len(res.failed), res.kills, res.restartCatchUp, res.catchUpSecs, res.lags
	tps := 0.0
	if m := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(pgbenchOut); m != nil {
		tps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	var streamRows int64
	if err := pg.QueryRow(ctx, `SELECT count(*) FROM pgbench_history`).Scan(&streamRows); err != nil {
		return err
	}
	// Each pgbench transaction changes four rows (three updates and a
	// history insert); the heartbeat adds one row each.
	streamRows = 4*streamRows + int64(heartbeats)
	ok, err := pgbenchInvariant(ctx, retina)
	if err != nil {
		return err
	}
	if !ok {
		invariantFailures++
	}
	diffs, err := comparePgbench(ctx, pg, retina)
	if err != nil {
		return err
	}
	// The slot confirms what a checkpoint made durable; give it a few
	// checkpoint intervals.
	var slotLag int64
	for deadline := time.Now().Add(10 * cfg.CheckpointInterval); ; time.Sleep(100 * time.Millisecond) {
		if err := pg.QueryRow(ctx, `SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'bench'`).Scan(&slotLag); err != nil {
			return err
		}
		if slotLag < 1<<20 || time.Now().After(deadline) {
			break
		}
	}
	p50, p99 := durationPercentileMS(lags, 50), durationPercentileMS(lags, 99)
	r.Printf("pgbench: %.0f tps for %s with %d clients; retina applied %d row changes (%.0f/s)", tps, cfg.Duration, cfg.Clients,
		streamRows, float64(streamRows)/(cfg.Duration.Seconds()+catchUp))
	r.Printf("lag over %d heartbeats: p50 %.1f ms, p99 %.1f ms; caught up %.2fs after pgbench ended", len(lags), p50, p99, catchUp)
	r.Printf("invariant checked in %d snapshots, %d failures; %d tables differ; slot confirmed within %d bytes of the WAL", checks+1, invariantFailures, diffs, slotLag)
	r.Set("pgbench_tps", tps)
	r.Set("stream_rows_per_sec", int64(float64(streamRows)/(cfg.Duration.Seconds()+catchUp)))
	r.Set("lag_p50_ms", p50)
	r.Set("lag_p99_ms", p99)
	r.Set("catch_up_s", catchUp)
	r.Set("invariant_checks", checks+1)
	r.Set("invariant_failures", invariantFailures)
	r.Set("tables_differing", diffs)
	r.Set("slot_lag_bytes", slotLag)
	r.Set("kills", kills)
	r.Set("restart_catch_up_s", restartCatchUp)
	if diffs > 0 || invariantFailures > 0 {
		return errors.Join(fmt.Errorf("%d tables differ from PostgreSQL's, %d invariant failures; retina's log ends:\n%s", diffs, invariantFailures, tailLog()))
	}
	return nil
}

// pgbenchInvariant checks, in one snapshot, that the balances agree:
// sum(abalance) = sum(tbalance) = sum(bbalance) = sum(delta).
func pgbenchInvariant(ctx context.Context, conn *pgx.Conn) (bool, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var a, t, b, h int64
	err := conn.QueryRow(qctx, `SELECT (SELECT coalesce(sum(abalance), 0) FROM pgbench_accounts)::bigint, (SELECT coalesce(sum(tbalance), 0) FROM pgbench_tellers)::bigint,
		(SELECT coalesce(sum(bbalance), 0) FROM pgbench_branches)::bigint, (SELECT coalesce(sum(delta), 0) FROM pgbench_history)::bigint`,
		pgx.QueryExecModeSimpleProtocol).Scan(&a, &t, &b, &h)
	if err != nil {
		return false, err
	}
	return a == t && t == b && b == h, nil
}

// comparePgbench counts the pgbench tables whose rows differ between
// PostgreSQL and Retina.
func comparePgbench(ctx context.Context, pg, retina *pgx.Conn) (int, error) {
	queries := []string{
		"SELECT aid, bid, abalance FROM pgbench_accounts ORDER BY aid",
		"SELECT tid, bid, tbalance FROM pgbench_tellers ORDER BY tid",
		"SELECT bid, bbalance FROM pgbench_branches ORDER BY bid",
		"SELECT tid, bid, aid, delta FROM pgbench_history ORDER BY tid, bid, aid, delta",
		"SELECT id FROM retina_heartbeat ORDER BY id",
	}
	diffs := 0
	for _, q := range queries {
		want, err := allRows(ctx, pg, q)
		if err != nil {
			return 0, err
		}
		got, err := allRows(ctx, retina, q)
		if err != nil {
			return 0, err
		}
		if !slices.Equal(want, got) {
			diffs++
		}
	}
	return diffs, nil
}

// allRows renders a query's rows as one string each.
func allRows(ctx context.Context, conn *pgx.Conn, q string) ([]string, error) {
	rows, err := conn.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", q, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		out = append(out, fmt.Sprint(vals...))
	}
	return out, rows.Err()
}

// loggedAt is the time of the first line of a JSON log with message msg.
func loggedAt(path, msg string) (time.Time, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		var rec struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg {
			return rec.Time, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s has no %q line", path, msg)
}
