package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"gopkg.in/yaml.v3"

	"github.com/retinadb/retina/internal/hybench"
	"github.com/retinadb/retina/internal/server"
)

// TestMain lets a test run the retina command as a child process (the test
// binary itself), so it can be stopped with real signals.
func TestMain(m *testing.M) {
	if os.Getenv("RETINA_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// served is a `retina serve` child process.
type served struct {
	t       *testing.T
	cmd     *exec.Cmd
	sqlAddr string
	httpURL string
	// mysqlAddr is the OLTP endpoint when started with --mysql-addr.
	mysqlAddr string
	// icebergURI is the Iceberg REST catalog when started with --iceberg-addr.
	icebergURI string
	out        *bytes.Buffer // stdout and stderr after the address line
	exited     chan error
}

var (
	servingLine = regexp.MustCompile(`retina serving: SQL on (\S+) .*metrics on (http://\S+)/metrics`)
	mysqlLine   = regexp.MustCompile(`retina serving: OLTP writes over MySQL protocol on (\S+) `)
	icebergLine = regexp.MustCompile(`retina serving: Iceberg REST catalog on \S+ \(uri (\S+)\)`)
)

func startServe(t *testing.T, args ...string) *served {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--sql-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "RETINA_TEST_RUN_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &served{t: t, cmd: cmd, out: &bytes.Buffer{}, exited: make(chan error, 1)}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(60 * time.Second)
	wantMySQL := slices.Contains(args, "--mysql-addr")
	wantIceberg := slices.Contains(args, "--iceberg-addr")
	for s.sqlAddr == "" || wantMySQL && s.mysqlAddr == "" || wantIceberg && s.icebergURI == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("serve exited before serving; stderr:\n%s", stderr.String())
			}
			if m := servingLine.FindStringSubmatch(l); m != nil {
				s.sqlAddr, s.httpURL = m[1], m[2]
			}
			if m := mysqlLine.FindStringSubmatch(l); m != nil {
				s.mysqlAddr = m[1]
			}
			if m := icebergLine.FindStringSubmatch(l); m != nil {
				s.icebergURI = m[1]
			}
		case <-timeout:
			cmd.Process.Kill()
			t.Fatalf("serve did not start in time; stderr:\n%s", stderr.String())
		}
	}
	go func() {
		for range lines {
		}
		err := cmd.Wait()
		s.out.WriteString(stderr.String())
		s.exited <- err
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	return s
}

// stop sends SIGTERM and waits for a clean exit.
func (s *served) stop() string {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatal(err)
	}
	select {
	case err := <-s.exited:
		if err != nil {
			s.t.Fatalf("serve exited with %v after SIGTERM:\n%s", err, s.out)
		}
	case <-time.After(60 * time.Second):
		s.cmd.Process.Kill()
		s.t.Fatal("serve did not stop within 60s of SIGTERM")
	}
	return s.out.String()
}

// metric reads a metric of the Prometheus endpoint: its samples summed,
// whatever their labels. It fails the test when there is none.
func (s *served) metric(name string) float64 {
	s.t.Helper()
	v, ok := s.metricIf(name)
	if !ok {
		s.t.Fatalf("metric %s missing from %s/metrics", name, s.httpURL)
	}
	return v
}

// metricIf is metric that reports a missing metric with ok false.
func (s *served) metricIf(name string) (sum float64, ok bool) {
	s.t.Helper()
	resp, err := http.Get(s.httpURL + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		f, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			s.t.Fatal(err)
		}
		sum, ok = sum+f, true
	}
	return sum, ok
}

// waitCommitted waits until the server has committed n row changes.
func (s *served) waitCommitted(n int) {
	s.t.Helper()
	s.waitMetric("retina_rows_committed_total", n)
}

// waitApplied waits until the server has committed its source up to line.
func (s *served) waitApplied(line int) {
	s.t.Helper()
	s.waitMetric("retina_committed_offset", line)
}

// waitMetric waits, while ingestion runs, until a metric reaches want.
func (s *served) waitMetric(name string, want int) {
	s.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for s.metric(name) < float64(want) {
		s.healthy()
		if time.Now().After(deadline) {
			s.t.Fatalf("%s is %v, not %d, after 90s", name, s.metric(name), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// healthy fails the test if ingestion stopped.
func (s *served) healthy() {
	s.t.Helper()
	resp, err := http.Get(s.httpURL + "/healthz")
	if err != nil {
		s.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("/healthz: %s %s", resp.Status, body)
	}
}

// connect opens a SQL connection to the server.
func (s *served) connect(ctx context.Context) *pgx.Conn {
	s.t.Helper()
	conn, err := pgx.Connect(ctx, "postgres://retina@"+s.sqlAddr+"/retina?sslmode=disable")
	if err != nil {
		s.t.Fatal(err)
	}
	return conn
}

// answers runs the workload's queries and renders their results.
func (s *served) answers() map[string]string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := s.connect(ctx)
	defer conn.Close(ctx)
	queries := append(hybench.AnalyticalQueries(),
		hybench.Query{Name: "balance", SQL: hybench.BalanceSQL}, hybench.Query{Name: "loans", SQL: hybench.LoanSQL})
	for _, t := range hybench.Tables() {
		queries = append(queries, hybench.Query{Name: "count_" + t.Name, SQL: "SELECT count(*), max(fresh_ts) FROM " + t.Name})
	}
	out := map[string]string{}
	for _, q := range queries {
		rows, err := conn.Query(ctx, q.SQL)
		if err != nil {
			s.t.Fatalf("%s: %v", q.Name, err)
		}
		var b strings.Builder
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				s.t.Fatal(err)
			}
			fmt.Fprintln(&b, vals...)
		}
		if err := rows.Err(); err != nil {
			s.t.Fatalf("%s: %v", q.Name, err)
		}
		out[q.Name] = b.String()
	}
	return out
}

func compareAnswers(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %s differs:\ngot  %q\nwant %q", what, name, got[name], w)
		}
	}
}

// TestServeRestartResumesExactly is the clean-restart contract: serve a
// growing Debezium file, stop with SIGTERM, restart on the same data
// directory: the answers are the same, and ingestion continues after the
// last applied position without duplicates: the final answers equal
// those of one uninterrupted run over the whole file.
func TestServeRestartResumesExactly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve four times")
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "retina.yaml")
	var decls []server.TableDecl
	for _, tb := range hybench.Tables() {
		d := server.TableDecl{Name: tb.Name, PrimaryKey: []string{tb.Key}}
		for _, c := range tb.Columns {
			d.Columns = append(d.Columns, server.ColumnDecl{Name: c.Name, Type: c.Type})
		}
		decls = append(decls, d)
	}
	yml, err := yaml.Marshal(map[string]any{"tables": decls, "log_format": "json"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, yml, 0o644); err != nil {
		t.Fatal(err)
	}

	gen := hybench.New(hybench.Config{SF: 0.0005, Seed: 11, Run: "restart"}, time.Now())
	var part1, part2, part3 bytes.Buffer
	if err := gen.WriteSnapshot(context.Background(), &part1); err != nil {
		t.Fatal(err)
	}
	rows1 := gen.Sizes().Total()
	now := time.Now()
	var buf []byte
	for i := range 300 {
		buf, _ = gen.NextTxn(buf[:0], now.Add(time.Duration(i)*time.Millisecond))
		part1.Write(buf)
	}
	rows1 += gen.Changes().Rows
	for i := range 200 {
		buf, _ = gen.NextTxn(buf[:0], now.Add(time.Duration(300+i)*time.Millisecond))
		part2.Write(buf)
	}
	rows2 := gen.Changes().Rows + gen.Sizes().Total() - rows1
	for i := range 200 {
		buf, _ = gen.NextTxn(buf[:0], now.Add(time.Duration(500+i)*time.Millisecond))
		part3.Write(buf)
	}
	rows3 := gen.Changes().Rows + gen.Sizes().Total() - rows1 - rows2

	for _, index := range []string{"memory", "pebble"} {
		t.Run(index, func(t *testing.T) {
			src := filepath.Join(dir, index+".jsonl")
			if err := os.WriteFile(src, part1.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			data := filepath.Join(dir, index+"-data")
			args := []string{"--config", config, "--data", data, "--source", "file:" + src, "--index", index}

			first := startServe(t, args...)
			first.waitCommitted(rows1)
			before := first.answers()
			if before["balance"] != fmt.Sprintln(gen.TotalBalance()) || before["loans"] != "0\n" {
				t.Fatalf("invariants before the restart: balance %q (want %d), loans %q", before["balance"], gen.TotalBalance(), before["loans"])
			}
			log := first.stop()
			if !strings.Contains(log, "shutdown complete") {
				t.Fatalf("no clean shutdown in the log:\n%s", log)
			}

			// The second run purges the index every second: the updates
			// of part 3 must find their rows through a purged index.
			second := startServe(t, append(args, "--index-purge-interval", "1s")...)
			compareAnswers(t, "after restart", second.answers(), before)
			second.healthy()
			if n := second.metric("retina_rows_committed_total"); n != 0 {
				t.Fatalf("the restart re-applied %v rows", n)
			}
			appendTo(t, src, part2.Bytes()) // the source keeps following the file
			second.waitCommitted(rows2)
			second.waitMetric("retina_index_purged_versions_total", 1)
			appendTo(t, src, part3.Bytes())
			second.waitCommitted(rows2 + rows3)
			final := second.answers()
			if d := second.metric("retina_duplicates_dropped_total"); d != 0 {
				t.Fatalf("%v duplicate transactions were delivered", d)
			}
			second.stop()

			whole := filepath.Join(dir, index+"-whole.jsonl")
			os.WriteFile(whole, slices.Concat(part1.Bytes(), part2.Bytes(), part3.Bytes()), 0o644)
			ref := startServe(t, "--config", config, "--data", filepath.Join(dir, index+"-ref"), "--source", "file:"+whole, "--index", index)
			ref.waitCommitted(rows1 + rows2 + rows3)
			compareAnswers(t, "restarted vs uninterrupted", final, ref.answers())
			ref.stop()
		})
	}
}

func appendTo(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSQLCommandAgainstServe runs `retina sql` against a live server.
func TestSQLCommandAgainstServe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "in.jsonl")
	row := `{"type":"struct","optional":true,"fields":[{"type":"int64","optional":false,"field":"id"},{"type":"string","optional":true,"field":"name"}]`
	msg := `{"key":{"schema":{"type":"struct","fields":[{"type":"int64","optional":false,"field":"id"}]},"payload":{"id":7}},` +
		`"value":{"schema":{"type":"struct","fields":[` + row + `,"field":"before"},` + row + `,"field":"after"},` +
		`{"type":"struct","field":"source","fields":[{"type":"string","field":"table"}]},{"type":"string","field":"op"}]},` +
		`"payload":{"before":null,"after":{"id":7,"name":"seven"},"source":{"table":"things"},"op":"c"}}}`
	os.WriteFile(src, []byte(msg+"\n"), 0o644)
	s := startServe(t, "--data", filepath.Join(dir, "data"), "--source", "file:"+src)
	s.waitCommitted(1)
	var out bytes.Buffer
	root := newRootCommand()
	root.SetOut(&out)
	root.SetArgs([]string{"sql", "--addr", s.sqlAddr, "--json", "SELECT id, name FROM things"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != `{"id":7,"name":"seven"}` {
		t.Fatalf("retina sql printed %q", got)
	}
	s.stop()
}

// lockedBuffer is a bytes.Buffer safe for the writer (the child's stderr
// copier) and a reader.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
