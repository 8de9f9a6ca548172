package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// sourceLoad drives the database-source benchmarks (postgres, mysql): a
// load runs on the source database while a heartbeat measures Retina's lag,
// a checker reads Retina snapshots, and Retina (a child process) is killed
// halfway and restarted.
type sourceLoad struct {
	// start starts Retina and connects to it; caughtUp waits until Retina
	// shows everything the source committed so far.
	start    func() (*child, *pgx.Conn, error)
	caughtUp func(*pgx.Conn) error
	// load runs the workload to its end.
	load func(ctx context.Context) error
	// beat commits one heartbeat on the source and returns the statement
	// that waits in Retina for it (with a bound of at most 10 s).
	beat func(ctx context.Context) (wait string, err error)
	// check reads one Retina snapshot and says what it found wrong ("" for
	// nothing).
	check                 func(ctx context.Context, conn *pgx.Conn) (string, error)
	heartbeat, checkEvery time.Duration
	// killAfter, when not zero, is when Retina is killed and restarted
	// (killHalfway).
	killAfter time.Duration
	tailLog   func() string
}

// loadResult is what a sourceLoad measured.
type loadResult struct {
	lags                        []time.Duration // sorted
	heartbeats, checks, kills   int
	failed                      []string // what the checks found
	restartCatchUp, catchUpSecs float64  // after the kill; after the load ended
	loadErr                     error
}

// killHalfway is the killAfter of a run of length d: halfway, or never.
func killHalfway(kill bool, d time.Duration) time.Duration {
	if kill {
		return d / 2
	}
	return 0
}

// run runs the load with Retina *proc (connected as *conn), leaving in
// them the Retina process and connection current at the end.
func (l sourceLoad) run(ctx context.Context, r *Report, proc **child, conn **pgx.Conn) (loadResult, error) {
	c, retina := *proc, *conn
	defer func() { *proc, *conn = c, retina }()
	var res loadResult
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var wg sync.WaitGroup
	wg.Go(func() {
		res.loadErr = l.load(ctx)
		stopRun()
	})
	var mu sync.Mutex // guards cur, the outage and res
	cur := c
	var outageFrom, outageTo time.Time
	// retinaConn keeps a connection to whichever Retina process runs.
	retinaConn := func(ctx context.Context, conn **pgx.Conn) bool {
		if *conn != nil {
			return true
		}
		mu.Lock()
		ch := cur
		mu.Unlock()
		if ch == nil || !ch.alive() {
			return false
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		*conn, _ = ch.connect(cctx)
		return *conn != nil
	}
	drop := func(conn **pgx.Conn) {
		if *conn != nil {
			(*conn).Close(context.Background())
			*conn = nil
		}
	}
	// The lag is from the source's acknowledgement of a heartbeat's commit
	// to a Retina snapshot that shows it.
	wg.Go(func() {
		var conn *pgx.Conn
		defer drop(&conn)
		for runCtx.Err() == nil {
			wait, err := l.beat(runCtx)
			if err != nil {
				return
			}
			acked := time.Now()
			mu.Lock()
			res.heartbeats++
			mu.Unlock()
			if retinaConn(runCtx, &conn) {
				var ok bool
				wctx, cancel := context.WithTimeout(runCtx, 10*time.Second)
				err := conn.QueryRow(wctx, wait).Scan(&ok)
				cancel()
				seen := time.Now()
				if err != nil {
					drop(&conn)
				} else {
					mu.Lock()
					// A heartbeat committed before the restart caught up waited
					// out the outage: that is restart_catch_up_s, not the lag.
					if outageFrom.IsZero() || acked.Before(outageFrom) && seen.Before(outageFrom) || !outageTo.IsZero() && acked.After(outageTo) {
						res.lags = append(res.lags, seen.Sub(acked))
					}
					mu.Unlock()
				}
			}
			select {
			case <-time.After(l.heartbeat):
			case <-runCtx.Done():
			}
		}
	})
	wg.Go(func() {
		var conn *pgx.Conn
		defer drop(&conn)
		for runCtx.Err() == nil && l.checkEvery > 0 {
			select {
			case <-time.After(l.checkEvery):
			case <-runCtx.Done():
				return
			}
			if !retinaConn(runCtx, &conn) {
				continue
			}
			broken, err := l.check(runCtx, conn)
			if err != nil {
				drop(&conn)
				continue
			}
			mu.Lock()
			res.checks++
			if broken != "" {
				res.failed = append(res.failed, broken)
			}
			mu.Unlock()
		}
	})
	if l.killAfter > 0 {
		select {
		case <-time.After(l.killAfter):
		case <-runCtx.Done():
		}
		if runCtx.Err() == nil {
			mu.Lock()
			outageFrom = time.Now()
			cur.kill()
			cur = nil
			mu.Unlock()
			res.kills++
			retina.Close(context.Background())
			nc, nconn, err := l.start()
			if err != nil {
				stopRun()
				wg.Wait()
				return res, fmt.Errorf("restart after the kill: %w", err)
			}
			mu.Lock()
			cur, c = nc, nc
			mu.Unlock()
			retina = nconn
			if err := l.caughtUp(retina); err != nil {
				stopRun()
				wg.Wait()
				return res, fmt.Errorf("catch up after the kill: %w; retina's log ends:\n%s", err, l.tailLog())
			}
			mu.Lock()
			outageTo = time.Now()
			res.restartCatchUp = outageTo.Sub(outageFrom).Seconds()
			mu.Unlock()
			r.Printf("killed retina (SIGKILL) halfway; restarted and caught up in %.2fs", res.restartCatchUp)
		}
	}
	<-runCtx.Done()
	ended := time.Now()
	wg.Wait()
	if res.loadErr != nil {
		return res, res.loadErr
	}
	if err := l.caughtUp(retina); err != nil {
		return res, fmt.Errorf("catch up after the load: %w", err)
	}
	res.catchUpSecs = time.Since(ended).Seconds()
	slices.Sort(res.lags)
	return res, nil
}

// serveOn returns how to start `retina serve` on source as a child process
// (its JSON log in dir/retina.log) and connect to it, and how to read the
// log's end.
func serveOn(ctx context.Context, command []string, dir, source string, checkpointInterval time.Duration) (start func() (*child, *pgx.Conn, error), logPath string, tailLog func() string, closeLog func(), err error) {
	logPath = filepath.Join(dir, "retina.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, "", nil, nil, err
	}
	tailLog = func() string { return logTail(logPath) }
	args := []string{"serve", "--data", filepath.Join(dir, "data"), "--source", source,
		"--sql-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--checkpoint-interval", checkpointInterval.String(), "--log-format", "json"}
	start = func() (*child, *pgx.Conn, error) {
		c, err := startChild(command, nil, args, logFile)
		if err != nil {
			return nil, nil, err
		}
		if err := c.waitServing(2 * time.Minute); err != nil {
			c.kill()
			return nil, nil, fmt.Errorf("%w; retina's log ends:\n%s", err, tailLog())
		}
		conn, err := c.connect(ctx)
		if err != nil {
			c.kill()
			return nil, nil, err
		}
		return c, conn, nil
	}
	return start, logPath, tailLog, func() { logFile.Close() }, nil
}

// reportCopy reports the initial copy's rate: rows from the log line that
// starts it (after the process opened its data directory and query
// engine) until the copy was queryable.
func reportCopy(r *Report, logPath, startLine, what string, rows int64, began, queryable time.Time) error {
	copyBegan, err := loggedAt(logPath, startLine)
	if err != nil {
		return err
	}
	secs := queryable.Sub(copyBegan).Seconds()
	r.Printf("initial copy: %d rows queryable %.1fs after %s, %.1fs after the process started (%.0f rows/s)",
		rows, secs, what, queryable.Sub(began).Seconds(), float64(rows)/secs)
	r.Set("snapshot_rows", rows)
	r.Set("snapshot_rows_per_sec", int64(float64(rows)/secs))
	return nil
}
