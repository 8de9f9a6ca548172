package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/hybench"
)

// CrashConfig configures `retina bench crash`.
type CrashConfig struct {
	Trials int
	Index  string // memory or pebble
	SF     float64
	// TxnRate is how many change transactions per second are appended to
	// the source file while the trials run.
	TxnRate int
	// Each trial's server serves for a random time in [MinUp, MaxUp]
	// before it is killed.
	MinUp, MaxUp time.Duration
	// FailpointShare of the trials arm one failpoint (flush, combination,
	// checkpoint, restore) so their kill lands inside that work.
	FailpointShare     float64
	CheckpointInterval time.Duration
	// GCStaleShare is the servers' storage_gc_stale_share: low, so storage
	// GC rewrites files during the trials and kills land in rewrites.
	GCStaleShare float64
	Seed         uint64
	// Command runs retina (default: this executable); Env is added to the
	// environment of every server it starts.
	Command []string
	Env     []string
	// Dir is the work directory (source, data directory, servers' log),
	// kept afterwards; by default a temporary one, removed.
	Dir string
}

// DefaultCrashConfig is 20 trials at SF 0.1 with the memory index.
func DefaultCrashConfig() CrashConfig {
	return CrashConfig{Trials: 20, Index: "memory", SF: 0.1, TxnRate: 2000, MinUp: 500 * time.Millisecond, MaxUp: 3 * time.Second,
		FailpointShare: 0.3, CheckpointInterval: time.Second, GCStaleShare: 0.2, Seed: 1}
}

// source is the change stream file the trials' servers follow, written by
// a goroutine as a live database would.
type crashSource struct {
	path          string
	snapshotLines int64
	mu            sync.Mutex
	begins        []int64 // line of each change transaction's BEGIN
	lines         int64
}

// Crash runs retina serve over a growing HyBench-like change stream, kills
// it with SIGKILL again and again (some kills inside a flush, combination,
// checkpoint or restore), restarts it each time on the same data
// directory, checks the bank invariants over SQL whenever it is up, and at
// the end compares every table with an oracle computed from the stream.
func Crash(ctx context.Context, r *Report, cfg CrashConfig) error {
	command, dir, cleanup, err := childRun(cfg.Command, cfg.Dir, "retina-crash-")
	if err != nil {
		return err
	}
	defer cleanup()
	cfg.Command = command
	logFile, err := os.Create(filepath.Join(dir, "servers.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	tailLog := func() string { return logTail(logFile.Name()) }
	config, err := writeWorkloadConfig(dir)
	if err != nil {
		return err
	}
	gen := hybench.New(hybench.Config{SF: cfg.SF, Seed: cfg.Seed, Run: "crash"}, time.Now())
	src := &crashSource{path: filepath.Join(dir, "stream.jsonl")}
	if err := src.writeSnapshot(ctx, gen); err != nil {
		return err
	}
	balance := gen.TotalBalance()
	r.Printf("source: %d snapshot rows, then %d change transactions/s appended while the trials run; index %s",
		src.snapshotLines, cfg.TxnRate, cfg.Index)
	writing, stopWriting := context.WithCancel(ctx)
	writerDone := make(chan error, 1)
	go func() { writerDone <- src.appendChanges(writing, gen, cfg.TxnRate) }()
	defer stopWriting()

	args := []string{"serve", "--config", config, "--data", filepath.Join(dir, "data"), "--source", "file:" + src.path,
		"--index", cfg.Index, "--sql-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--checkpoint-interval", cfg.CheckpointInterval.String(), "--log-format", "json",
		// Storage GC rewrites files often here, so kills land in rewrites.
		"--storage-gc-interval", "1s", "--storage-gc-stale-share", strconv.FormatFloat(cfg.GCStaleShare, 'g', -1, 64)}
	rng := rand.New(rand.NewPCG(cfg.Seed, 41))
	var restarts []time.Duration
	invariantFailures, failpointKills := 0, 0
	var redoTxns, gcRewrites int64
	var redoTime time.Duration
	check := func(c *child, what string) {
		if n := src.checkInvariants(ctx, c, balance); n > 0 {
			invariantFailures += n
			r.Printf("  invariant failed %s", what)
		}
	}
	// The base data goes in first, so the trials redo change transactions
	// (kills during a snapshot are covered by the tests); the loading
	// server is killed too, right after.
	{
		c, err := startChild(cfg.Command, cfg.Env, args, logFile)
		if err != nil {
			return err
		}
		start := time.Now()
		if err := c.waitServing(2 * time.Minute); err != nil {
			return fmt.Errorf("load: %w; the servers' log ends:\n%s", err, tailLog())
		}
		for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
			off, err := c.metric("retina_committed_offset")
			if err == nil && int64(off) >= src.snapshotLines {
				break
			}
			if time.Now().After(deadline) || !c.alive() {
				c.kill()
				return fmt.Errorf("load: applied to line %v of %d; the servers' log ends:\n%s", off, src.snapshotLines, tailLog())
			}
		}
		c.kill()
		r.Printf("load: %d snapshot rows applied in %.1fs, then killed", src.snapshotLines, time.Since(start).Seconds())
	}
	for trial := 1; trial <= cfg.Trials; trial++ {
		var env []string
		armed := ""
		if rng.Float64() < cfg.FailpointShare {
			points := failpoint.All()
			armed = points[rng.IntN(len(points))]
			env = []string{failpoint.EnvVar + "=" + armed + "=kill"}
		}
		c, err := startChild(cfg.Command, append(slices.Clone(cfg.Env), env...), args, logFile)
		if err != nil {
			return err
		}
		if err := c.waitServing(2 * time.Minute); err != nil {
			if armed != "" && !c.alive() {
				failpointKills++
				r.Printf("trial %d: killed at %s before serving", trial, armed)
				continue
			}
			c.kill()
			return fmt.Errorf("trial %d: %w; the servers' log ends:\n%s", trial, err, tailLog())
		}
		restart, err := c.firstQuery(ctx)
		if err != nil {
			c.kill()
			return fmt.Errorf("trial %d: %w; the servers' log ends:\n%s", trial, err, tailLog())
		}
		restarts = append(restarts, restart)
		up := cfg.MinUp + time.Duration(rng.Int64N(int64(cfg.MaxUp-cfg.MinUp)+1))
		served := time.Now()
		deadline := served.Add(up)
		// Redo: the server counts the transactions it redoes (those the
		// killed one had committed after its last checkpoint) and times
		// them until its sources are past where that one stopped. A trial
		// killed before that counts no redo.
		last, lastCheck, redoing, rewrites := int64(0), time.Time{}, true, int64(0)
		for c.alive() && time.Now().Before(deadline) {
			if off, err := c.metric("retina_committed_offset"); err == nil {
				last = max(last, int64(off))
			}
			if n, err := c.metric("retina_storage_gc_rewrites_total"); err == nil {
				rewrites = max(rewrites, int64(n))
			}
			if redoing {
				busy, err1 := c.metric("retina_redoing")
				n, err2 := c.metric("retina_redone_transactions_total")
				took, err3 := c.metric("retina_redo_seconds")
				if err1 == nil && err2 == nil && err3 == nil && busy == 0 {
					redoing = false
					if n > 0 && took > 0 {
						redoTxns += int64(n)
						redoTime += time.Duration(took * float64(time.Second))
					}
				}
			}
			if last >= src.snapshotLines && time.Since(lastCheck) > 500*time.Millisecond {
				check(c, fmt.Sprintf("in trial %d", trial))
				lastCheck = time.Now()
			}
			time.Sleep(50 * time.Millisecond)
		}
		gcRewrites += rewrites
		how := "SIGKILL"
		switch {
		case c.alive():
			c.kill()
			if armed != "" {
				how += " (" + armed + " armed, not reached)"
			}
		case armed == "":
			return fmt.Errorf("trial %d: the server exited on its own: %v; the servers' log ends:\n%s", trial, c.exitErr, tailLog())
		default:
			how, failpointKills = "at "+armed, failpointKills+1
		}
		applied := "committed nothing"
		if last > 0 {
			applied = fmt.Sprintf("committed up to line %d", last)
		}
		r.Printf("trial %d: SQL served the recovered state %d ms after the start; up %.1fs, %s, killed %s",
			trial, restart.Milliseconds(), time.Since(served).Seconds(), applied, how)
	}

	// The end: the source stops growing, a last server applies all of it.
	stopWriting()
	if err := <-writerDone; err != nil && ctx.Err() == nil && err != context.Canceled {
		return err
	}
	c, err := startChild(cfg.Command, cfg.Env, args, logFile)
	if err != nil {
		return err
	}
	defer func() {
		if c.alive() {
			c.kill()
		}
	}()
	if err := c.waitServing(2 * time.Minute); err != nil {
		return fmt.Errorf("final run: %w; the servers' log ends:\n%s", err, tailLog())
	}
	end := src.lastLine()
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		off, err := c.metric("retina_committed_offset")
		if err == nil && int64(off) >= end {
			break
		}
		if time.Now().After(deadline) || !c.alive() {
			return fmt.Errorf("final run: applied to line %v of %d; the servers' log ends:\n%s", off, end, tailLog())
		}
	}
	check(c, "at the end")
	want, err := buildOracle(src.path)
	if err != nil {
		return err
	}
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	lost, doubled, detail, err := compareWithOracle(ctx, conn, want)
	conn.Close(ctx)
	if err != nil {
		return err
	}
	for _, d := range detail {
		r.Printf("  differs: %s", d)
	}
	checkpoints, _ := c.metric("retina_checkpoints_total")
	if err := c.stop(time.Minute); err != nil {
		return fmt.Errorf("final run: %w", err)
	}
	oracleRows := 0
	for _, t := range want {
		oracleRows += len(t)
	}
	r.Printf("end: %d source transactions, %d rows in the oracle; %d lost, %d doubled, %d invariant failures; %d kills at failpoints",
		len(src.begins), oracleRows, lost, doubled, invariantFailures, failpointKills)
	slices.Sort(restarts)
	r.Set("index", cfg.Index)
	r.Set("scale_factor", cfg.SF)
	r.Set("trials", cfg.Trials)
	r.Set("failpoint_kills", failpointKills)
	r.Set("source_transactions", len(src.begins))
	r.Set("rows_lost", lost)
	r.Set("rows_doubled", doubled)
	r.Set("invariant_failures", invariantFailures)
	r.Set("restart_ms_p50", durationPercentileMS(restarts, 50))
	r.Set("restart_ms_max", durationPercentileMS(restarts, 100))
	redoRate := 0.0
	if redoTime > 0 {
		redoRate = math.Round(float64(redoTxns) / redoTime.Seconds())
	}
	r.Set("redo_txn_per_sec", redoRate)
	r.Set("redo_transactions", redoTxns)
	r.Set("gc_rewrites", gcRewrites)
	r.Set("final_run_checkpoints", checkpoints)
	return nil
}

func durationPercentileMS(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	i := int(math.Ceil(q/100*float64(len(ds)))) - 1
	return math.Round(float64(ds[max(i, 0)].Microseconds())/100) / 10
}

// writeWorkloadConfig declares the workload's tables (its messages carry
// no schemas).
func writeWorkloadConfig(dir string) (string, error) {
	type col struct {
		Name string `yaml:"name"`
		Type string `yaml:"type"`
	}
	type table struct {
		Name       string   `yaml:"name"`
		PrimaryKey []string `yaml:"primary_key"`
		Columns    []col    `yaml:"columns"`
	}
	var tables []table
	for _, t := range hybench.Tables() {
		tb := table{Name: t.Name, PrimaryKey: []string{t.Key}}
		for _, c := range t.Columns {
			tb.Columns = append(tb.Columns, col{c.Name, c.Type})
		}
		tables = append(tables, tb)
	}
	// Small files, so blocks are flushed and files combined all the time
	// and the kills catch those too.
	data, err := yaml.Marshal(map[string]any{"tables": tables, "block_rows": 1024, "file_blocks": 8})
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "retina.yaml")
	return path, os.WriteFile(path, data, 0o644)
}

func (s *crashSource) writeSnapshot(ctx context.Context, gen *hybench.Generator) error {
	f, err := os.Create(s.path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if err := gen.WriteSnapshot(ctx, w); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	s.snapshotLines = int64(gen.Sizes().Total())
	s.lines = s.snapshotLines
	return f.Close()
}

// appendChanges appends change transactions at rate per second until ctx
// ends.
func (s *crashSource) appendChanges(ctx context.Context, gen *hybench.Generator, rate int) error {
	f, err := os.OpenFile(s.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var buf, txn []byte
	perTick := max(rate/100, 1)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		buf = buf[:0]
		s.mu.Lock()
		for range perTick {
			txn, _ = gen.NextTxn(txn[:0], time.Now())
			s.begins = append(s.begins, s.lines+1)
			s.lines += int64(bytes.Count(txn, []byte{'\n'}))
			buf = append(buf, txn...)
		}
		s.mu.Unlock()
		if _, err := f.Write(buf); err != nil { // whole transactions at a time
			return err
		}
	}
}

func (s *crashSource) lastLine() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lines
}

// checkInvariants runs the bank invariants in one snapshot each; it
// returns how many failed.
func (s *crashSource) checkInvariants(ctx context.Context, c *child, balance int64) int {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := c.connect(qctx)
	if err != nil {
		return 0 // the server is going away: not an invariant
	}
	defer conn.Close(qctx)
	failed := 0
	var total, loans int64
	if err := conn.QueryRow(qctx, hybench.BalanceSQL).Scan(&total); err == nil && total != balance {
		failed++
	}
	if err := conn.QueryRow(qctx, hybench.LoanSQL).Scan(&loans); err == nil && loans != 0 {
		failed++
	}
	return failed
}

// firstQuery waits until the child answers SQL over the state it
// recovered, and returns how long after its start that was.
func (c *child) firstQuery(ctx context.Context) (time.Duration, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := c.connect(qctx)
		if err == nil {
			var one int
			err = conn.QueryRow(qctx, "SELECT count(*) FROM customer").Scan(&one)
			conn.Close(qctx)
		}
		cancel()
		if err == nil {
			return time.Since(c.started), nil
		}
		if time.Now().After(deadline) || !c.alive() {
			return 0, fmt.Errorf("no SQL answer: %w", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
