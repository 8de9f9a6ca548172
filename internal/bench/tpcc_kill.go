package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// tpccTotals are per-table figures that differ if any row differs in a
// way TPC-C's transactions change rows: counts and sums of the columns
// they update. They are compared between the store and Retina.
var tpccTotals = []struct{ table, exprs string }{
	{"warehouse", "count(*), sum(w_ytd)"},
	{"district", "count(*), sum(d_ytd), sum(d_next_o_id)"},
	{"customer", "count(*), sum(c_balance), sum(c_ytd_payment), sum(c_payment_cnt), sum(c_delivery_cnt)"},
	{"history", "count(*), sum(h_amount)"},
	{"new_order", "count(*), sum(no_o_id), sum(no_d_id)"},
	{"orders", "count(*), sum(o_id), sum(o_ol_cnt), sum(o_carrier_id)"},
	{"order_line", "count(*), sum(ol_amount), sum(ol_quantity), count(ol_delivery_d), sum(ol_o_id)"},
	{"stock", "count(*), sum(s_quantity), sum(s_ytd), sum(s_order_cnt), sum(s_remote_cnt)"},
	{"item", "count(*), sum(i_price)"},
}

// tpccKill runs TPC-C against `retina serve --mysql-addr` as a child
// process, kills it with SIGKILL halfway through the run, restarts it, and
// checks that go-tpc's check passes on the store and that Retina's tables
// equal the store's.
func tpccKill(ctx context.Context, r *Report, cfg TPCCConfig, bin, placement string) error {
	dir, err := os.MkdirTemp(cfg.Dir, "retina-bench-tpcc-kill-")
	if err != nil {
		return fmt.Errorf("make a data directory: %w", err)
	}
	defer os.RemoveAll(dir)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	logPath := filepath.Join(dir, "serve.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"serve", "--data", filepath.Join(dir, "data"), "--sql-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--mysql-addr", "127.0.0.1:0", "--checkpoint-interval", "1s"}
	if mem := tpccPlacements[placement]; len(mem) > 0 {
		args = append(args, "--memory-tables", strings.Join(mem, ","))
	}
	start := func() (*child, time.Duration, error) {
		t0 := time.Now()
		c, err := startChild([]string{exe}, nil, args, logFile)
		if err != nil {
			return nil, 0, err
		}
		if err := c.waitServing(5 * time.Minute); err != nil {
			c.kill()
			return nil, 0, fmt.Errorf("retina serve: %w\n%s", err, logTail(logPath))
		}
		if err := c.waitMySQL(time.Minute); err != nil {
			c.kill()
			return nil, 0, fmt.Errorf("retina serve: %w\n%s", err, logTail(logPath))
		}
		return c, time.Since(t0), nil
	}
	c, _, err := start()
	if err != nil {
		return err
	}
	// c is replaced by the restarted child; stop whichever is current.
	defer func() {
		if c != nil && c.alive() {
			c.stop(time.Minute)
		}
	}()
	gotpc := func(ctx context.Context, c *child, args ...string) *exec.Cmd {
		host, port, _ := net.SplitHostPort(c.mysqlAddr)
		full := append([]string{"tpcc", "-H", host, "-P", port, "-D", "tpcc", "--warehouses", strconv.Itoa(cfg.Warehouses), "-T", strconv.Itoa(cfg.Threads)}, args...)
		return exec.CommandContext(ctx, bin, full...)
	}
	if out, err := gotpc(ctx, c, "prepare", "--no-check").CombinedOutput(); err != nil {
		return fmt.Errorf("go-tpc prepare: %w\n%s", err, tail(out, 20))
	}
	// Kill halfway through the run.
	runCtx, stopRun := context.WithCancel(ctx)
	run := gotpc(runCtx, c, "run", "--time", cfg.Duration.String())
	if err := run.Start(); err != nil {
		stopRun()
		return fmt.Errorf("go-tpc run: %w", err)
	}
	select {
	case <-time.After(cfg.Duration / 2):
	case <-ctx.Done():
		stopRun()
		run.Wait()
		return ctx.Err()
	}
	if !c.alive() {
		// The server died on its own: that is a failure, not our kill.
		stopRun()
		run.Wait()
		return fmt.Errorf("retina serve exited during go-tpc run before the kill: %v\n%s", c.exitErr, logTail(logPath))
	}
	c.kill()
	stopRun()
	run.Wait()
	r.Printf("kill (%s): killed retina serve with SIGKILL %s into go-tpc run", placement, cfg.Duration/2)
	restarted, restart, err := start()
	if err != nil {
		return fmt.Errorf("restart after kill: %w", err)
	}
	c = restarted
	r.Set("kill_restart_s", round(restart.Seconds(), 1))
	t0 := time.Now()
	if cfg.Check {
		out, err := gotpc(ctx, c, "check").CombinedOutput()
		if err == nil && checkFailed.Match(out) {
			err = errors.New("a condition failed")
		}
		if err != nil {
			r.Set("kill_check_passed", false)
			return fmt.Errorf("go-tpc check after the kill: %w\n%s", err, tail(out, 20))
		}
		r.Set("kill_check_passed", true)
		r.Printf("kill (%s): go-tpc check passed after the restart", placement)
	}
	// Retina must come to equal the store (the restart's copy).
	db, err := sql.Open("mysql", "root@tcp("+c.mysqlAddr+")/tpcc?timeout=10s")
	if err != nil {
		return err
	}
	defer db.Close()
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var diffs []string
	deadline := time.Now().Add(5 * time.Minute)
	for {
		diffs, err = compareTPCC(ctx, db, conn)
		if err != nil {
			return err
		}
		if len(diffs) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.Set("kill_retina_equals_store", len(diffs) == 0)
	if len(diffs) > 0 {
		return fmt.Errorf("after the kill Retina does not equal the store: %s", strings.Join(diffs, "; "))
	}
	checked := ""
	if cfg.Check {
		checked = " (go-tpc check included)"
	}
	r.Printf("kill (%s): restart %.1fs; Retina equals the store %.1fs later%s", placement, restart.Seconds(), time.Since(t0).Seconds(), checked)
	return c.stop(time.Minute)
}

// compareTPCC lists the tables whose totals differ between the store and
// Retina.
func compareTPCC(ctx context.Context, db *sql.DB, conn *pgx.Conn) ([]string, error) {
	var diffs []string
	for _, tt := range tpccTotals {
		exprs := strings.Split(tt.exprs, ", ")
		store := make([]sql.NullString, len(exprs))
		ptrs := make([]any, len(exprs))
		for i := range store {
			ptrs[i] = &store[i]
		}
		q := "SELECT " + tt.exprs + " FROM " + tt.table
		if err := db.QueryRowContext(ctx, q).Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("store: %s: %w", q, err)
		}
		casts := make([]string, len(exprs))
		for i, e := range exprs {
			casts[i] = "(" + e + ")::varchar"
		}
		retina := make([]*string, len(exprs))
		rptrs := make([]any, len(exprs))
		for i := range retina {
			rptrs[i] = &retina[i]
		}
		rq := "SELECT " + strings.Join(casts, ", ") + " FROM " + tt.table
		if err := conn.QueryRow(ctx, rq).Scan(rptrs...); err != nil {
			return nil, fmt.Errorf("Retina: %s: %w", rq, err)
		}
		for i := range exprs {
			if !sameNumber(store[i], retina[i]) {
				a, b := "NULL", "NULL"
				if store[i].Valid {
					a = store[i].String
				}
				if retina[i] != nil {
					b = *retina[i]
				}
				diffs = append(diffs, fmt.Sprintf("%s %s: store %s, Retina %s", tt.table, exprs[i], a, b))
			}
		}
	}
	return diffs, nil
}

func sameNumber(a sql.NullString, b *string) bool {
	if !a.Valid || b == nil {
		return a.Valid == (b != nil)
	}
	x, ok1 := new(big.Rat).SetString(a.String)
	y, ok2 := new(big.Rat).SetString(*b)
	if !ok1 || !ok2 {
		return a.String == *b
	}
	return x.Cmp(y) == 0
}
