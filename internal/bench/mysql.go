package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retinadb/retina/internal/mysqltest"
)

// MySQLConfig configures `retina bench mysql`.
type MySQLConfig struct {
	// Warehouses and Threads of go-tpc's TPC-C; Duration of its run at
	// full speed.
	Warehouses, Threads int
	Duration            time.Duration
	// Kill: SIGKILL Retina halfway through the run and restart it.
	Kill bool
	// Heartbeat is how often a heartbeat row is committed for the lag;
	// CheckEvery how often a Retina snapshot is checked against TPC-C's
	// consistency conditions (0: only at the end).
	Heartbeat, CheckEvery time.Duration
	CheckpointInterval    time.Duration
	// GoTPC is the go-tpc binary (default: on PATH, or installed).
	GoTPC string
	// Command runs retina (default: this executable).
	Command []string
	// Dir is the work directory (data directory, logs), kept; by default a
	// temporary one, removed.
	Dir string
}

// DefaultMySQLConfig is the run: 1 warehouse, 4 threads, 60 s, a
// kill halfway.
func DefaultMySQLConfig() MySQLConfig {
	return MySQLConfig{Warehouses: 1, Threads: 4, Duration: 60 * time.Second, Kill: true,
		Heartbeat: 20 * time.Millisecond, CheckEvery: 500 * time.Millisecond, CheckpointInterval: time.Second}
}

// MySQL runs a private MariaDB, loads TPC-C with go-tpc, starts retina
// serve on it (the initial copy), then runs TPC-C at full speed with a
// heartbeat table while it checks TPC-C's consistency conditions in Retina
// snapshots, kills Retina halfway and restarts it, and at the end compares
// every table with MariaDB's.
func MySQL(ctx context.Context, r *Report, cfg MySQLConfig) error {
	command, dir, cleanup, err := childRun(cfg.Command, cfg.Dir, "retina-bench-mysql-")
	if err != nil {
		return err
	}
	defer cleanup()
	cfg.Command = command
	bin, err := goTPC(ctx, cfg.GoTPC)
	if err != nil {
		return err
	}
	m, err := mysqltest.Start(ctx, mysqltest.Options{})
	if err != nil {
		return err
	}
	defer m.Close()
	if err := m.Exec("", "CREATE DATABASE tpcc"); err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(m.Addr())
	gotpc := func(ctx context.Context, args ...string) (string, error) {
		full := append([]string{"tpcc", "-H", host, "-P", port, "-U", m.User, "-D", "tpcc", "--warehouses", strconv.Itoa(cfg.Warehouses), "-T", strconv.Itoa(cfg.Threads)}, args...)
		out, err := exec.CommandContext(ctx, bin, full...).CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("go-tpc %s: %w\n%s", strings.Join(args, " "), err, tail(out, 20))
		}
		return string(out), nil
	}
	t0 := time.Now()
	if _, err := gotpc(ctx, "prepare", "--no-check"); err != nil {
		return err
	}
	r.Printf("MariaDB on %s; go-tpc prepared %d warehouse(s) in %.1fs", m.Addr(), cfg.Warehouses, time.Since(t0).Seconds())
	db, err := sql.Open("mysql", m.DSN("tpcc"))
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE retina_heartbeat (id bigint PRIMARY KEY, ts datetime(6) NOT NULL)"); err != nil {
		return err
	}
	var copyRows int64
	for _, tt := range tpccTotals {
		var n int64
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+tt.table).Scan(&n); err != nil {
			return err
		}
		copyRows += n
	}
	start, logPath, tailLog, closeLog, err := serveOn(ctx, cfg.Command, dir, m.URI("tpcc", "name=bench"), cfg.CheckpointInterval)
	if err != nil {
		return err
	}
	defer closeLog()
	// caughtUp returns once Retina shows every transaction MariaDB has
	// committed so far.
	caughtUp := func(conn *pgx.Conn) error {
		var pos string
		if err := db.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
			return err
		}
		var ok bool
		return conn.QueryRow(ctx, fmt.Sprintf("SELECT retina_wait_mysql('%s', 600)", pos)).Scan(&ok)
	}

	began := time.Now()
	c, retina, err := start()
	if err != nil {
		return err
	}
	defer func() { c.kill() }()
	if err := caughtUp(retina); err != nil {
		return fmt.Errorf("initial copy: %w; retina's log ends:\n%s", err, tailLog())
	}
	if err := reportCopy(r, logPath, "initial copy: snapshot taken", "the snapshot was taken", copyRows, began, time.Now()); err != nil {
		return err
	}

	var rowsBefore int64
	if rowsBefore, err = changedRows(ctx, db); err != nil {
		return err
	}
	// TPC-C, the heartbeat and the consistency checker run together;
	// Retina is killed and restarted halfway.
	var runOut string
	hc, err := db.Conn(ctx) // @@last_gtid is the session's
	if err != nil {
		return err
	}
	defer hc.Close()
	heartbeatID := int64(0)
	load := sourceLoad{start: start, caughtUp: caughtUp, killAfter: killHalfway(cfg.Kill, cfg.Duration), heartbeat: cfg.Heartbeat, checkEvery: cfg.CheckEvery, tailLog: tailLog,
		load: func(ctx context.Context) error {
			var err error
			runOut, err = gotpc(ctx, "run", "--time", cfg.Duration.String())
			return err
		},
		// A heartbeat row, then retina_wait_mysql of its GTID.
		beat: func(ctx context.Context) (string, error) {
			heartbeatID++
			if _, err := hc.ExecContext(ctx, "INSERT INTO retina_heartbeat VALUES (?, now(6))", heartbeatID); err != nil {
				return "", err
			}
			var gtid string
			if err := hc.QueryRowContext(ctx, "SELECT @@last_gtid").Scan(&gtid); err != nil {
				return "", err
			}
			return fmt.Sprintf("SELECT retina_wait_mysql('%s', 10)", gtid), nil
		},
		check: func(ctx context.Context, conn *pgx.Conn) (string, error) {
			broken, err := tpccConsistent(ctx, conn)
			return strings.Join(broken, "; "), err
		},
	}
	res, err := load.run(ctx, r, &c, &retina)
	if err != nil {
		return err
	}
	heartbeats, checks, failed, kills, restartCatchUp, catchUp, lags := res.heartbeats, res.checks, res.failed, res.kills, res.restartCatchUp, res.catchUpSecs, res.lags
	failures := len(failed)
	tpmC, _, err := parseGoTPC(runOut)
	if err != nil {
		return err
	}
	rowsAfter, err := changedRows(ctx, db)
	if err != nil {
		return err
	}
	streamRows := rowsAfter - rowsBefore + int64(heartbeats)
	broken, err := tpccConsistent(ctx, retina)
	if err != nil {
		return err
	}
	if len(broken) > 0 {
		failures++
		failed = append(failed, strings.Join(broken, "; "))
	}
	diffs, err := compareTPCC(ctx, db, retina)
	if err != nil {
		return err
	}
	var hbStore, hbRetina int64
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM retina_heartbeat").Scan(&hbStore); err != nil {
		return err
	}
	if err := retina.QueryRow(ctx, "SELECT count(*) FROM retina_heartbeat").Scan(&hbRetina); err != nil {
		return err
	}
	if hbStore != hbRetina {
		diffs = append(diffs, fmt.Sprintf("retina_heartbeat count(*): MariaDB %d, Retina %d", hbStore, hbRetina))
	}
	p50, p99 := durationPercentileMS(lags, 50), durationPercentileMS(lags, 99)
	r.Printf("TPC-C: %.0f tpmC for %s with %d threads; retina applied about %d row changes (%.0f/s)", tpmC, cfg.Duration, cfg.Threads,
		streamRows, float64(streamRows)/(cfg.Duration.Seconds()+catchUp))
	r.Printf("lag over %d heartbeats: p50 %.1f ms, p99 %.1f ms; caught up %.2fs after TPC-C ended", len(lags), p50, p99, catchUp)
	r.Printf("consistency conditions checked in %d snapshots, %d failures; %d tables differ", checks+1, failures, len(diffs))
	for _, f := range failed {
		r.Printf("inconsistent snapshot: %s", f)
	}
	for _, d := range diffs {
		r.Printf("differs: %s", d)
	}
	r.Set("tpmC", tpmC)
	r.Set("stream_rows_per_sec", int64(float64(streamRows)/(cfg.Duration.Seconds()+catchUp)))
	r.Set("lag_p50_ms", p50)
	r.Set("lag_p99_ms", p99)
	r.Set("catch_up_s", catchUp)
	r.Set("consistency_checks", checks+1)
	r.Set("consistency_failures", failures)
	r.Set("tables_differing", len(diffs))
	r.Set("kills", kills)
	r.Set("restart_catch_up_s", restartCatchUp)
	if len(diffs) > 0 || failures > 0 {
		return fmt.Errorf("%d tables differ from MariaDB's, %d inconsistent snapshots; retina's log ends:\n%s", len(diffs), failures, tailLog())
	}
	return nil
}

// changedRows estimates the row changes TPC-C made from MariaDB's counters
// of rows written by statements (inserted, updated and deleted).
func changedRows(ctx context.Context, db *sql.DB) (int64, error) {
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('Handler_write', 'Handler_update', 'Handler_delete')")
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var total int64
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return 0, err
		}
		total += n
	}
	return total, rows.Err()
}

// tpccConsistent checks TPC-C's consistency conditions in one Retina
// snapshot (a read transaction) and names those that fail.
func tpccConsistent(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tx, err := conn.BeginTx(qctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.Background())
	var broken []string
	for _, c := range tpccConsistency {
		var n int64
		if err := tx.QueryRow(qctx, c.sql).Scan(&n); err != nil {
			return nil, fmt.Errorf("condition %s: %w", c.name, err)
		}
		if n != 0 {
			broken = append(broken, fmt.Sprintf("%s fails in %d place(s)", c.name, n))
		}
	}
	return broken, nil
}
