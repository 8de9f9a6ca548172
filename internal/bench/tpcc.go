package bench

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "github.com/go-sql-driver/mysql" // the probe's MySQL client
	"github.com/jackc/pgx/v5"

	"github.com/retinadb/retina/internal/oltp/oltpserver"
	"github.com/retinadb/retina/internal/server"
)

// GoTPCVersion is the TPC-C driver the benchmark runs.
const GoTPCVersion = "v1.0.7"

// TPCCConfig sizes `retina bench tpcc`.
type TPCCConfig struct {
	Warehouses int
	Threads    int
	Duration   time.Duration // of each placement's `tpcc run`
	// Placements to run: all-memory, all-storage, new-order-opt (customer
	// and item in memory), payment-opt (customer in memory).
	Placements []string
	// HTAP runs the store inside `retina serve` replicating into Retina,
	// and samples Retina's snapshots while TPC-C runs.
	HTAP bool
	// SampleEvery is how often a Retina snapshot is checked (HTAP).
	SampleEvery time.Duration
	// Check runs go-tpc's `check --check-all` after prepare and `check`
	// after the run (minutes each).
	Check bool
	// GoTPC is the go-tpc binary; empty: go-tpc on PATH, else installed
	// with `go install` into the user cache directory.
	GoTPC string
	Dir   string // where data directories are made (default: temp)
	// KillPlacement, when set, ends the run with a kill -9 of `retina
	// serve --mysql-addr` (a child process) halfway through a TPC-C run
	// under that placement; then go-tpc check (with Check) and Retina
	// against the store after the restart.
	KillPlacement string
	// Rounds runs the placements this many times, interleaved, and reports
	// each placement's median tpmC and abort rate: on a shared machine one
	// run of each is within the noise of another (checks run in the first
	// round only).
	Rounds int
}

// DefaultTPCCConfig runs the four placements for a minute each.
func DefaultTPCCConfig() TPCCConfig {
	return TPCCConfig{Warehouses: 1, Threads: 4, Duration: time.Minute, HTAP: true, SampleEvery: 500 * time.Millisecond, Rounds: 1,
		Placements: []string{"all-storage", "all-memory", "new-order-opt", "payment-opt"}}
}

// tpccPlacements are the tables each placement puts in the memory engine.
var tpccPlacements = map[string][]string{
	"all-memory":    {"warehouse", "district", "customer", "history", "new_order", "orders", "order_line", "item", "stock", "retina_probe"},
	"all-storage":   nil,
	"new-order-opt": {"customer", "item"},
	"payment-opt":   {"customer"},
}

// tpccConsistency are TPC-C's consistency conditions (spec §3.3.2.1–4) as
// SQL on Retina: each counts the districts or warehouses that break it.
var tpccConsistency = []struct{ name, sql string }{
	{"W_YTD = sum(D_YTD)", `SELECT count(*) FROM warehouse w, (SELECT d_w_id, sum(d_ytd) s FROM district GROUP BY d_w_id) d
		WHERE w.w_id = d.d_w_id AND w.w_ytd <> d.s`},
	{"D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID)", `SELECT count(*) FROM district d,
		(SELECT o_w_id, o_d_id, max(o_id) m FROM orders GROUP BY o_w_id, o_d_id) o,
		(SELECT no_w_id, no_d_id, max(no_o_id) m FROM new_order GROUP BY no_w_id, no_d_id) n
		WHERE o.o_w_id = d.d_w_id AND o.o_d_id = d.d_id AND n.no_w_id = d.d_w_id AND n.no_d_id = d.d_id
		AND (d.d_next_o_id - 1 <> o.m OR o.m <> n.m)`},
	{"count(NEW_ORDER) = max(NO_O_ID) - min(NO_O_ID) + 1", `SELECT count(*) FROM
		(SELECT count(*) c, max(no_o_id) - min(no_o_id) + 1 r FROM new_order GROUP BY no_w_id, no_d_id) x WHERE c <> r`},
	{"sum(O_OL_CNT) = count(ORDER_LINE)", `SELECT count(*) FROM
		(SELECT o_w_id, o_d_id, sum(o_ol_cnt) s FROM orders GROUP BY o_w_id, o_d_id) o,
		(SELECT ol_w_id, ol_d_id, count(*) c FROM order_line GROUP BY ol_w_id, ol_d_id) l
		WHERE o.o_w_id = l.ol_w_id AND o.o_d_id = l.ol_d_id AND o.s <> l.c`},
}

// TPCC runs go-tpc's TPC-C against the store under each placement and
// reports tpmC and the abort rate; with HTAP, Retina's freshness and the
// share of its snapshots that keep TPC-C's consistency conditions.
func TPCC(ctx context.Context, r *Report, cfg TPCCConfig) error {
	if cfg.Warehouses < 1 || cfg.Threads < 1 || cfg.Duration <= 0 || len(cfg.Placements) == 0 || cfg.Rounds < 1 {
		return errors.New("bench tpcc: warehouses, threads, duration, rounds and placements must be given")
	}
	for _, p := range append(slices.Clone(cfg.Placements), cfg.KillPlacement) {
		if p == "" {
			continue
		}
		if _, ok := tpccPlacements[p]; !ok {
			return fmt.Errorf("bench tpcc: placement %q: want all-memory, all-storage, new-order-opt or payment-opt", p)
		}
	}
	bin, err := goTPC(ctx, cfg.GoTPC)
	if err != nil {
		return err
	}
	r.Set("warehouses", cfg.Warehouses)
	r.Set("threads", cfg.Threads)
	r.Set("duration_s", cfg.Duration.Seconds())
	r.Set("htap", cfg.HTAP)
	r.Set("go_tpc", GoTPCVersion)
	r.Set("rounds", cfg.Rounds)
	rounds := map[string][]tpccResult{}
	for i := range cfg.Rounds {
		rc := cfg
		if i > 0 {
			rc.Check = false
		}
		if cfg.Rounds > 1 {
			r.Printf("round %d of %d", i+1, cfg.Rounds)
		}
		for _, p := range cfg.Placements {
			out, err := runPlacement(ctx, r, rc, bin, p)
			if err != nil {
				return fmt.Errorf("bench tpcc: placement %s: %w", p, err)
			}
			rounds[p] = append(rounds[p], out)
		}
	}
	res := map[string]tpccResult{}
	for _, p := range cfg.Placements {
		out := combineRounds(rounds[p])
		res[p] = out
		key := strings.ReplaceAll(p, "-", "_")
		r.Set(key+"_tpmc", round(out.tpmC, 1))
		r.Set(key+"_abort_pct", round(out.abortPct, 3))
		if cfg.Rounds > 1 {
			var each []float64
			for _, o := range rounds[p] {
				each = append(each, round(o.tpmC, 1))
			}
			r.Set(key+"_tpmc_each_round", each)
		}
		if cfg.HTAP {
			r.Set(key+"_freshness_p50_ms", out.freshP50)
			r.Set(key+"_freshness_p99_ms", out.freshP99)
			r.Set(key+"_snapshots_checked", out.samples)
			r.Set(key+"_snapshots_consistent_share", out.consistentShare())
		}
		if cfg.Check {
			r.Set(key+"_checks_passed", out.checked)
		}
	}
	base, hasBase := res["all-storage"]
	for _, p := range []string{"new-order-opt", "payment-opt"} {
		out, ok := res[p]
		if !ok || !hasBase {
			continue
		}
		key := strings.ReplaceAll(p, "-", "_")
		if base.tpmC > 0 {
			r.Set(key+"_vs_all_storage_tpmc_ratio", round(out.tpmC/base.tpmC, 3))
		}
		r.Set(key+"_abort_increase_pp", round(out.abortPct-base.abortPct, 3))
	}
	if cfg.HTAP {
		var all []float64
		samples, good := 0, 0
		for _, out := range res {
			all = append(all, out.freshP99)
			samples, good = samples+out.samples, good+out.consistent
		}
		r.Set("freshness_p99_ms_max", slices.Max(all))
		if samples > 0 {
			r.Set("snapshots_consistent_share", round(float64(good)/float64(samples), 4))
		}
	}
	if cfg.KillPlacement != "" {
		r.Set("kill_placement", cfg.KillPlacement)
		if err := tpccKill(ctx, r, cfg, bin, cfg.KillPlacement); err != nil {
			return fmt.Errorf("bench tpcc: kill: %w", err)
		}
	}
	return nil
}

type tpccResult struct {
	tpmC, abortPct      float64
	freshP50, freshP99  float64
	samples, consistent int
	checked             bool
}

// combineRounds is a placement's result over its rounds: median tpmC and
// abort rate, the worst freshness, every sampled snapshot; checked is the
// first round's.
func combineRounds(rs []tpccResult) tpccResult {
	median := func(f func(tpccResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if n := len(v); n%2 == 0 {
			return (v[n/2-1] + v[n/2]) / 2
		}
		return v[len(v)/2]
	}
	out := tpccResult{checked: rs[0].checked}
	out.tpmC = median(func(r tpccResult) float64 { return r.tpmC })
	out.abortPct = median(func(r tpccResult) float64 { return r.abortPct })
	for _, r := range rs {
		out.freshP50, out.freshP99 = max(out.freshP50, r.freshP50), max(out.freshP99, r.freshP99)
		out.samples, out.consistent = out.samples+r.samples, out.consistent+r.consistent
	}
	return out
}

func (t tpccResult) consistentShare() float64 {
	if t.samples == 0 {
		return 0
	}
	return round(float64(t.consistent)/float64(t.samples), 4)
}

// goTPC finds the go-tpc binary, installing it when it is nowhere.
func goTPC(ctx context.Context, given string) (string, error) {
	if given != "" {
		return given, nil
	}
	if p, err := exec.LookPath("go-tpc"); err == nil {
		return p, nil
	}
	// Where .ci/install's `go install` puts it.
	if out, err := exec.CommandContext(ctx, "go", "env", "GOPATH").Output(); err == nil {
		if p := filepath.Join(strings.TrimSpace(string(out)), "bin", "go-tpc"); fileExists(p) {
			return p, nil
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bindir := filepath.Join(cache, "retina", "go-tpc-"+GoTPCVersion)
	bin := filepath.Join(bindir, "go-tpc")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	cmd := exec.CommandContext(ctx, "go", "install", "github.com/pingcap/go-tpc/cmd/go-tpc@"+GoTPCVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+bindir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("bench tpcc: no go-tpc on PATH and `go install github.com/pingcap/go-tpc/cmd/go-tpc@%s` failed: %w\n%s (install it, or pass --go-tpc)", GoTPCVersion, err, out)
	}
	return bin, nil
}

// tpccTarget is a running store under test: alone, or inside retina serve.
type tpccTarget struct {
	mysqlAddr string
	retinaDSN string
	close     func() error
}

func startTarget(ctx context.Context, cfg TPCCConfig, dir string, memory []string) (*tpccTarget, error) {
	quiet := slog.New(slog.DiscardHandler)
	if !cfg.HTAP {
		o, err := oltpserver.Start(ctx, oltpserver.Config{Dir: dir, MySQLAddr: "127.0.0.1:0", MemoryTables: memory, Logger: quiet})
		if err != nil {
			return nil, err
		}
		return &tpccTarget{mysqlAddr: o.MySQLAddr(), close: o.Close}, nil
	}
	sc := server.DefaultConfig()
	sc.DataDir, sc.SQLAddr, sc.HTTPAddr, sc.MySQLAddr, sc.OLTPMemoryTables = dir, "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", memory
	srv, err := server.Start(ctx, sc, server.Options{Logger: quiet})
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	return &tpccTarget{mysqlAddr: srv.MySQLAddr(), retinaDSN: "postgres://retina@" + srv.SQLAddr() + "/retina?sslmode=disable",
		close: func() error { stop(); return <-done }}, nil
}

func runPlacement(ctx context.Context, r *Report, cfg TPCCConfig, bin, placement string) (res tpccResult, err error) {
	dir, err := os.MkdirTemp(cfg.Dir, "retina-bench-tpcc-")
	if err != nil {
		return res, fmt.Errorf("make a data directory: %w", err)
	}
	defer os.RemoveAll(dir)
	tg, err := startTarget(ctx, cfg, dir, tpccPlacements[placement])
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := tg.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	host, port, _ := net.SplitHostPort(tg.mysqlAddr)
	gotpc := func(args ...string) (string, error) {
		full := append([]string{"tpcc", "-H", host, "-P", port, "-D", "tpcc", "--warehouses", strconv.Itoa(cfg.Warehouses), "-T", strconv.Itoa(cfg.Threads)}, args...)
		out, err := exec.CommandContext(ctx, bin, full...).CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("go-tpc %s: %w\n%s", strings.Join(args, " "), err, tail(out, 20))
		}
		if checkFailed.Match(out) {
			return string(out), fmt.Errorf("go-tpc %s reports a failure:\n%s", strings.Join(args, " "), tail(out, 20))
		}
		return string(out), nil
	}
	db, err := sql.Open("mysql", "root@tcp("+tg.mysqlAddr+")/tpcc?timeout=10s")
	if err != nil {
		return res, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE retina_probe (id BIGINT PRIMARY KEY, at_us BIGINT NOT NULL)"); err != nil {
		return res, fmt.Errorf("probe table: %w", err)
	}
	t0 := time.Now()
	if _, err := gotpc("prepare", "--no-check"); err != nil {
		return res, err
	}
	r.Printf("%s: prepared %d warehouse(s) in %.1fs", placement, cfg.Warehouses, time.Since(t0).Seconds())
	res.checked = true
	if cfg.Check {
		t0 = time.Now()
		if _, err := gotpc("check", "--check-all"); err != nil {
			return res, err
		}
		r.Printf("%s: check --check-all after prepare passed in %.1fs", placement, time.Since(t0).Seconds())
	}
	var sampler *tpccSampler
	if cfg.HTAP {
		sampler, err = startSampler(ctx, db, tg.retinaDSN, cfg.SampleEvery)
		if err != nil {
			return res, err
		}
	}
	out, runErr := gotpc("run", "--time", cfg.Duration.String())
	if sampler != nil {
		sres, err := sampler.stop()
		if err != nil && runErr == nil {
			runErr = err
		}
		res.freshP50, res.freshP99 = durationPercentileMS(sres.fresh, 50), durationPercentileMS(sres.fresh, 99)
		res.samples, res.consistent = sres.samples, sres.consistent
		for _, f := range sres.failures {
			r.Printf("%s: inconsistent Retina snapshot: %s", placement, f)
		}
	}
	if runErr != nil {
		return res, runErr
	}
	res.tpmC, res.abortPct, err = parseGoTPC(out)
	if err != nil {
		return res, err
	}
	r.Printf("%s: tpmC %.1f, aborts %.3f%%", placement, res.tpmC, res.abortPct)
	if cfg.HTAP {
		r.Printf("%s: Retina freshness P50 %.1f ms, P99 %.1f ms; %d of %d snapshots consistent", placement, res.freshP50, res.freshP99, res.consistent, res.samples)
	}
	if cfg.Check {
		t0 = time.Now()
		if _, err := gotpc("check"); err != nil {
			res.checked = false
			return res, err
		}
		r.Printf("%s: check after the run passed in %.1fs", placement, time.Since(t0).Seconds())
	}
	return res, nil
}

var (
	summaryLine = regexp.MustCompile(`^\[Summary\] (\w+)\s+- Takes\(s\): [\d.]+, Count: (\d+)`)
	tpmCLine    = regexp.MustCompile(`^tpmC: ([\d.]+)`)
	checkFailed = regexp.MustCompile(`check warehouse \d+ at condition [\d.]+ failed`)
)

// parseGoTPC reads go-tpc run's summary: tpmC, and failed transactions
// (the _ERR lines) as a share of all.
func parseGoTPC(out string) (tpmC, abortPct float64, err error) {
	var ok, failed int64
	found := false
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := summaryLine.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseInt(m[2], 10, 64)
			if strings.HasSuffix(m[1], "_ERR") {
				failed += n
			} else {
				ok += n
			}
		}
		if m := tpmCLine.FindStringSubmatch(line); m != nil {
			tpmC, _ = strconv.ParseFloat(m[1], 64)
			found = true
		}
	}
	if !found || ok+failed == 0 {
		return 0, 0, fmt.Errorf("go-tpc run printed no summary:\n%s", tail([]byte(out), 20))
	}
	return tpmC, 100 * float64(failed) / float64(ok+failed), nil
}

func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

// tpccSampler writes probe rows through MySQL and reads Retina's snapshots.
// A snapshot's staleness is measured from the oldest probe it misses that
// was acknowledged before the snapshot began: the snapshot's start minus
// when that probe's INSERT was sent (an upper bound: the commit happened
// between send and acknowledgement); 0 if it misses none. Each snapshot is
// also checked against the consistency conditions.
type tpccSampler struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	sent  []time.Time // when probe id i+1 was sent
	acked []time.Time // when it was acknowledged
	res   samplerResult
	errs  []error
}

type samplerResult struct {
	fresh               []time.Duration
	samples, consistent int
	failures            []string
}

func startSampler(ctx context.Context, db *sql.DB, dsn string, every time.Duration) (*tpccSampler, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connect to Retina: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &tpccSampler{cancel: cancel}
	s.wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for id := int64(1); ; id++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			sent := time.Now()
			if _, err := db.ExecContext(ctx, "INSERT INTO retina_probe VALUES (?, ?)", id, sent.UnixMicro()); err != nil {
				if ctx.Err() == nil {
					s.fail(fmt.Errorf("probe write %d: %w", id, err))
				}
				return
			}
			s.mu.Lock()
			s.sent, s.acked = append(s.sent, sent), append(s.acked, time.Now())
			s.mu.Unlock()
		}
	})
	s.wg.Go(func() {
		defer conn.Close(context.Background())
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := s.sample(ctx, conn); err != nil {
				if ctx.Err() == nil {
					s.fail(err)
				}
				return
			}
		}
	})
	return s, nil
}

func (s *tpccSampler) fail(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

// sample checks one Retina snapshot: one read transaction.
func (s *tpccSampler) sample(ctx context.Context, conn *pgx.Conn) error {
	start := time.Now()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("Retina: begin: %w", err)
	}
	defer tx.Rollback(context.Background())
	var seen int64
	if err := tx.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM retina_probe").Scan(&seen); err != nil {
		return fmt.Errorf("Retina: probe: %w", err)
	}
	var broken []string
	for _, c := range tpccConsistency {
		var n int64
		if err := tx.QueryRow(ctx, c.sql).Scan(&n); err != nil {
			return fmt.Errorf("Retina: condition %s: %w", c.name, err)
		}
		if n != 0 {
			broken = append(broken, fmt.Sprintf("%s fails in %d place(s)", c.name, n))
		}
	}
	var districts int64
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM district").Scan(&districts); err != nil {
		return fmt.Errorf("Retina: count districts: %w", err)
	}
	if districts == 0 {
		broken = append(broken, "no districts: the load is not in the snapshot")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var fresh time.Duration
	if int(seen) < len(s.acked) && s.acked[seen].Before(start) { // probe seen+1 committed before the snapshot
		fresh = start.Sub(s.sent[seen])
	}
	s.res.fresh = append(s.res.fresh, fresh)
	s.res.samples++
	if len(broken) == 0 {
		s.res.consistent++
	} else {
		s.res.failures = append(s.res.failures, strings.Join(broken, "; "))
	}
	return nil
}

func (s *tpccSampler) stop() (samplerResult, error) {
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	slices.Sort(s.res.fresh)
	return s.res, errors.Join(s.errs...)
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
