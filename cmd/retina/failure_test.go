package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/bench"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/server/servertest"
)

// End-to-end tests of what the mirror-transaction core guarantees, through
// `retina serve` as a user runs it: transactions that cannot be applied,
// truncates, snapshot reads of existing rows, start-up errors and the
// shutdown order.

// accountConfig declares the account table the tests' streams write.
func accountConfig(t *testing.T, dir string, extra string) string {
	t.Helper()
	path := filepath.Join(dir, "retina.yaml")
	yml := `tables:
  - name: account
    primary_key: [id]
    columns:
      - {name: id, type: int64}
      - {name: owner, type: string, nullable: true}
      - {name: balance, type: "decimal(12,2)"}
` + extra
	if err := os.WriteFile(path, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// changes builds a Debezium stream of the account table: snapshot reads
// without metadata and transactions with BEGIN/END metadata. Balances are
// whole numbers, written in the precise (base64) decimal form.
type changes struct {
	lines []string
	begin map[string]int // transaction id → line of its BEGIN
}

func newChanges() *changes { return &changes{begin: map[string]int{}} }

func base64Cents(units int64) string {
	v := units * 100
	b := []byte{byte(v >> 56), byte(v >> 48), byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
	i := 0
	for i < 7 && (b[i] == 0 && b[i+1]&0x80 == 0 || b[i] == 0xff && b[i+1]&0x80 != 0) {
		i++
	}
	out, _ := json.Marshal(b[i:]) // []byte marshals as base64
	return string(out)
}

func accountRow(id int, owner string, balance int64) string {
	return fmt.Sprintf(`{"id":%d,"owner":%q,"balance":%s}`, id, owner, base64Cents(balance))
}

func (c *changes) snapshot(rows ...string) {
	for _, r := range rows {
		c.lines = append(c.lines, `{"op":"r","source":{"table":"account"},"before":null,"after":`+r+`}`)
	}
}

// event is one change: op c, u, d, r or t with its images ("" for none).
type event struct{ op, before, after string }

func (c *changes) txn(id string, evs ...event) {
	c.begin[id] = len(c.lines) + 1
	c.lines = append(c.lines, fmt.Sprintf(`{"status":"BEGIN","id":%q}`, id))
	for i, e := range evs {
		img := func(s string) string {
			if s == "" {
				return "null"
			}
			return s
		}
		c.lines = append(c.lines, fmt.Sprintf(`{"op":%q,"source":{"table":"account"},"before":%s,"after":%s,"transaction":{"id":%q,"total_order":%d}}`,
			e.op, img(e.before), img(e.after), id, i+1))
	}
	c.lines = append(c.lines, fmt.Sprintf(`{"status":"END","id":%q,"event_count":%d,"data_collections":[{"data_collection":"bank.account","event_count":%d}]}`,
		id, len(evs), len(evs)))
}

func (c *changes) write(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(c.lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// query returns the rows of a query, one string each.
func (s *served) query(sql string) []string {
	s.t.Helper()
	rows, err := s.tryQuery(sql)
	if err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
	return rows
}

// tryQuery is query that returns the statement's error instead of
// failing the test.
func (s *served) tryQuery(sql string) ([]string, error) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := s.connect(ctx)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		out = append(out, strings.TrimSpace(fmt.Sprintln(vals...)))
	}
	return out, rows.Err()
}

func (s *served) accounts() string {
	return strings.Join(s.query("SELECT id, owner, balance::VARCHAR FROM account ORDER BY id"), "; ")
}

// health returns the /healthz status code and body.
func (s *served) health() (int, string) {
	s.t.Helper()
	resp, err := http.Get(s.httpURL + "/healthz")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// waitStopped waits until /healthz reports that ingestion stopped.
func (s *served) waitStopped() string {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := s.health()
		if code == http.StatusServiceUnavailable {
			return body
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("ingestion did not stop: /healthz %d %s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitRows waits until a query returns want.
func (s *served) waitRows(sql, want string) {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rows, err := s.tryQuery(sql)
		got := strings.Join(rows, "; ")
		if err != nil && !servertest.NotYetReplicated(err) {
			s.t.Fatalf("%s: %v", sql, err)
		}
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			if err != nil {
				s.t.Fatalf("%s: still %v after 60s", sql, err)
			}
			s.t.Fatalf("%s: got %q, want %q", sql, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serveFails runs `retina serve` expecting it to refuse to start; it
// returns what it printed.
func serveFails(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"serve", "--sql-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "RETINA_TEST_RUN_MAIN=1")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("serve did not exit within 60s; output:\n%s", out)
	}
	if err == nil {
		t.Fatalf("serve started and exited cleanly instead of refusing; output:\n%s", out)
	}
	if strings.Contains(string(out), "panic") || strings.Contains(string(out), "goroutine ") {
		t.Fatalf("serve panicked instead of reporting the error:\n%s", out)
	}
	return string(out)
}

// failingTransfer is the stream: snapshot rows, a complete
// transfer, a transfer whose transaction also deletes a key that does not
// exist, and a transfer after it.
func failingTransfer() *changes {
	c := newChanges()
	var rows []string
	for id := 1; id <= 8; id++ {
		rows = append(rows, accountRow(id, fmt.Sprint("o", id), 100))
	}
	c.snapshot(rows...)
	c.txn("transfer-1",
		event{"u", accountRow(1, "o1", 100), accountRow(1, "o1", 90)},
		event{"u", accountRow(2, "o2", 100), accountRow(2, "o2", 110)})
	var evs []event
	for id := 3; id <= 8; id++ {
		evs = append(evs, event{"u", accountRow(id, fmt.Sprint("o", id), 100), accountRow(id, fmt.Sprint("o", id), 50)})
	}
	evs = append(evs, event{"d", accountRow(99, "nobody", 0), ""})
	c.txn("transfer-bad", evs...)
	c.txn("transfer-2",
		event{"u", accountRow(1, "o1", 90), accountRow(1, "o1", 80)},
		event{"u", accountRow(3, "o3", 100), accountRow(3, "o3", 110)})
	return c
}

const beforeBad = "1 o1 90.00; 2 o2 110.00; 3 o3 100.00; 4 o4 100.00; 5 o5 100.00; 6 o6 100.00; 7 o7 100.00; 8 o8 100.00"

// TestServeFailPolicyStopsAtTheTransaction: under the default fail policy,
// the snapshot and the complete transfer before the bad transaction are
// visible while ingestion is stopped; /healthz names the transaction's
// position and the reason; after SIGTERM and a restart nothing of the bad
// transaction shows, no row is doubled, and the restart stops at the same
// place with the same message.
func TestServeFailPolicyStopsAtTheTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve twice")
	}
	dir := t.TempDir()
	c := failingTransfer()
	src := filepath.Join(dir, "in.jsonl")
	c.write(t, src)
	args := []string{"--config", accountConfig(t, dir, ""), "--data", filepath.Join(dir, "data"), "--source", "file:" + src}
	where := fmt.Sprintf("%s@%d", src, c.begin["transfer-bad"])
	var first string
	for run := range 2 {
		s := startServe(t, args...)
		msg := s.waitStopped()
		if !strings.Contains(msg, where) || !strings.Contains(msg, "no live row") {
			t.Fatalf("run %d: /healthz does not name %s and the reason: %s", run, where, msg)
		}
		if run == 0 {
			first = msg
		} else if msg != first {
			t.Fatalf("the restart stopped differently:\n%s\nfirst:\n%s", msg, first)
		}
		if got := s.accounts(); got != beforeBad {
			t.Fatalf("run %d: visible while stopped:\n%s\nwant\n%s", run, got, beforeBad)
		}
		s.stop()
	}
}

// TestServeDeadLetterSetsTheTransactionAside: under dead-letter the whole
// transaction, with every message, is one record in the dead-letter file;
// none of it is visible and the transactions after it are applied.
func TestServeDeadLetterSetsTheTransactionAside(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve")
	}
	dir := t.TempDir()
	c := failingTransfer()
	src := filepath.Join(dir, "in.jsonl")
	c.write(t, src)
	dead := filepath.Join(dir, "dead.jsonl")
	s := startServe(t, "--config", accountConfig(t, dir, ""), "--data", filepath.Join(dir, "data"), "--source", "file:"+src,
		"--bad-input", "dead-letter", "--dead-letter", dead)
	want := "1 o1 80.00; 2 o2 110.00; 3 o3 110.00; 4 o4 100.00; 5 o5 100.00; 6 o6 100.00; 7 o7 100.00; 8 o8 100.00"
	s.waitRows("SELECT id, owner, balance::VARCHAR FROM account ORDER BY id", want)
	s.healthy()
	s.stop()
	data, err := os.ReadFile(dead)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Transaction string
		Reason      string
		Messages    []struct{ Value string }
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &rec) != nil {
		t.Fatalf("want one dead-letter record:\n%s", data)
	}
	first := c.begin["transfer-bad"] - 1
	if rec.Transaction != "transfer-bad" || !strings.Contains(rec.Reason, "no live row") ||
		!slices.Equal(valuesOf(rec.Messages), c.lines[first:first+9]) {
		t.Fatalf("dead-letter record: %s", lines[0])
	}
}

func valuesOf(ms []struct{ Value string }) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Value
	}
	return out
}

// TestServeTruncates: a truncate after a transaction that fails neither
// hangs the pipeline (shutdown works, /healthz reports the stop), and a
// truncate sees the earlier changes of its own transaction.
func TestServeTruncates(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve twice")
	}
	dir := t.TempDir()
	config := accountConfig(t, dir, "")

	c := failingTransfer()
	c.txn("truncate", event{"t", "", ""})
	src := filepath.Join(dir, "after-failure.jsonl")
	c.write(t, src)
	s := startServe(t, "--config", config, "--data", filepath.Join(dir, "data1"), "--source", "file:"+src)
	s.waitStopped()
	if got := s.accounts(); got != beforeBad {
		t.Fatalf("visible: %s", got)
	}
	s.stop() // fails the test if shutdown hangs

	c = newChanges()
	c.snapshot(accountRow(1, "o1", 10), accountRow(2, "o2", 20))
	c.txn("insert-then-truncate", event{"c", "", accountRow(5, "o5", 50)}, event{"t", "", ""})
	c.txn("refill", event{"c", "", accountRow(1, "o1", 11)})
	c.txn("delete-then-truncate", event{"d", accountRow(1, "o1", 11), ""}, event{"t", "", ""}, event{"c", "", accountRow(7, "o7", 70)})
	src = filepath.Join(dir, "own.jsonl")
	c.write(t, src)
	s = startServe(t, "--config", config, "--data", filepath.Join(dir, "data2"), "--source", "file:"+src)
	s.waitRows("SELECT id, owner, balance::VARCHAR FROM account ORDER BY id", "7 o7 70.00")
	s.healthy()
	s.stop()
}

// TestServeSnapshotReadOfExistingRow: Debezium's incremental snapshots and
// re-snapshots read rows that exist; that overwrites them.
func TestServeSnapshotReadOfExistingRow(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve")
	}
	dir := t.TempDir()
	c := newChanges()
	c.snapshot(accountRow(1, "o1", 10), accountRow(2, "o2", 20))
	c.txn("update", event{"u", accountRow(1, "o1", 10), accountRow(1, "o1", 15)})
	c.snapshot(accountRow(1, "o1", 15), accountRow(2, "o2-renamed", 20), accountRow(3, "o3", 30))
	src := filepath.Join(dir, "in.jsonl")
	c.write(t, src)
	s := startServe(t, "--config", accountConfig(t, dir, ""), "--data", filepath.Join(dir, "data"), "--source", "file:"+src)
	s.waitRows("SELECT id, owner, balance::VARCHAR FROM account ORDER BY id", "1 o1 15.00; 2 o2-renamed 20.00; 3 o3 30.00")
	s.healthy()
	s.stop()
}

// TestServeDecimalWithoutSchema: without a Connect schema, a decimal sent
// in Debezium's default precise form is base64, also when the base64 is
// made only of digits ("0000" is 0xD34D34, −2929356 unscaled).
func TestServeDecimalWithoutSchema(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "in.jsonl")
	line := `{"op":"c","source":{"table":"account"},"before":null,"after":{"id":1,"owner":"x","balance":"0000"}}`
	os.WriteFile(src, []byte(line+"\n"), 0o644)
	s := startServe(t, "--config", accountConfig(t, dir, ""), "--data", filepath.Join(dir, "data"), "--source", "file:"+src)
	s.waitRows("SELECT id, balance::VARCHAR FROM account", "1 -29293.56")
	s.stop()
}

// TestServeStartErrors: every error at start is one message naming its
// subject, with a non-zero exit and no panic.
func TestServeStartErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve several times")
	}
	dir := t.TempDir()
	config := accountConfig(t, dir, "")
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown source scheme", []string{"--source", "oracle://u@127.0.0.1:1/db"}, []string{"oracle://u@127.0.0.1:1/db", "unknown scheme"}},
		{"unreachable mysql", []string{"--source", "mysql://u:secret@127.0.0.1:1/db"}, []string{"mysql://u:xxxxx@127.0.0.1:1/db", "connection refused"}},
		{"unreachable postgres", []string{"--source", "postgres://u:secret@127.0.0.1:1/db"}, []string{"postgres://u:xxxxx@127.0.0.1:1/db", "connection refused"}},
		{"missing source file", []string{"--source", "file:" + filepath.Join(dir, "nope.jsonl")}, []string{"nope.jsonl", "no such file"}},
		{"bad decimal handling", []string{"--decimal-handling", "exact"}, []string{"decimal_handling", "exact"}},
	} {
		out := serveFails(t, append([]string{"--config", config, "--data", filepath.Join(dir, "data")}, c.args...)...)
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: the message does not say %q:\n%s", c.name, w, out)
			}
		}
	}
}

// TestServeRecoversAfterKill: a data directory left by kill -9 is
// recovered at start (the last checkpoint, then redo from the source): the
// answers equal the source's, nothing lost or doubled, every time.
func TestServeRecoversAfterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve several times")
	}
	dir := t.TempDir()
	c := newChanges()
	var rows []string
	for id := 1; id <= 200; id++ {
		rows = append(rows, accountRow(id, fmt.Sprint("o", id), 100))
	}
	c.snapshot(rows...)
	balance := map[int]int64{}
	for id := 1; id <= 200; id++ {
		balance[id] = 100
	}
	for i := range 400 { // transfers between accounts
		a, b := 1+i%200, 1+(i*7+3)%200
		if a == b {
			continue
		}
		c.txn(fmt.Sprint("transfer-", i),
			event{"u", accountRow(a, fmt.Sprint("o", a), balance[a]), accountRow(a, fmt.Sprint("o", a), balance[a]-1)},
			event{"u", accountRow(b, fmt.Sprint("o", b), balance[b]), accountRow(b, fmt.Sprint("o", b), balance[b]+1)})
		balance[a]--
		balance[b]++
	}
	src := filepath.Join(dir, "in.jsonl")
	c.write(t, src)
	var want []string
	for id := 1; id <= 200; id++ {
		want = append(want, fmt.Sprintf("%d %d.00", id, balance[id]))
	}
	args := []string{"--config", accountConfig(t, dir, ""), "--data", filepath.Join(dir, "data"), "--source", "file:" + src,
		"--checkpoint-interval", "1s"}
	// Kill it three times: as soon as it serves, once the snapshot is in,
	// and after a checkpoint; then let it finish.
	for kill := range 3 {
		s := startServe(t, args...)
		if kill > 0 {
			s.waitRows("SELECT count(*) FROM account", "200")
		}
		if kill == 2 {
			deadline := time.Now().Add(30 * time.Second)
			for s.metric("retina_checkpoints_total") < 1 {
				if time.Now().After(deadline) {
					t.Fatal("no checkpoint within 30 s at a 1 s interval: the kill after a checkpoint cannot be tested")
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.exited
	}
	s := startServe(t, args...)
	s.waitRows("SELECT id, balance::VARCHAR FROM account ORDER BY id", strings.Join(want, "; "))
	s.waitRows("SELECT sum(balance)::VARCHAR FROM account", "20000.00")
	s.healthy()
	s.stop()
}

// TestServeShardingIsFixed: --buckets and --replayers decide which replayer
// owns each row; a restart with other values is refused before anything is
// touched, saying which values the data directory needs.
func TestServeShardingIsFixed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve three times")
	}
	dir := t.TempDir()
	c := failingTransfer()
	c.lines = c.lines[:12] // the snapshot and the first transfer
	src := filepath.Join(dir, "in.jsonl")
	c.write(t, src)
	args := []string{"--config", accountConfig(t, dir, ""), "--data", filepath.Join(dir, "data"), "--source", "file:" + src}
	s := startServe(t, args...)
	s.waitRows("SELECT count(*) FROM account", "8")
	s.stop()
	for _, change := range [][]string{{"--buckets", "8"}, {"--replayers", "3"}} {
		out := serveFails(t, append(slices.Clone(args), change...)...)
		if !strings.Contains(out, "--buckets 16 --replayers 2") {
			t.Errorf("%v: the refusal does not give the settings to use:\n%s", change, out)
		}
	}
	s = startServe(t, args...)
	if got := s.accounts(); got != beforeBad {
		t.Fatalf("after the refused starts: %s", got)
	}
	s.stop()
}

// TestServeKeepsItsLastCheckpointWhenTheFinalOneFails: source positions
// live in the checkpoint with the replay state they count on, written
// after it. When the final checkpoint of a stop cannot be written, the one
// before stays current, and the next start recovers from it: nothing lost,
// nothing doubled.
func TestServeKeepsItsLastCheckpointWhenTheFinalOneFails(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve twice")
	}
	dir := t.TempDir()
	c := failingTransfer()
	c.lines = c.lines[:12]
	src := filepath.Join(dir, "in.jsonl")
	c.write(t, src)
	data := filepath.Join(dir, "data")
	args := []string{"--config", accountConfig(t, dir, ""), "--data", data, "--source", "file:" + src, "--checkpoint-interval", "1s"}
	s := startServe(t, args...)
	s.waitRows("SELECT count(*) FROM account", "8")
	before, _ := os.ReadFile(filepath.Join(data, "checkpoint"))
	// Make writing the next manifest fail: a directory, not empty, where
	// its temporary file goes.
	if err := os.MkdirAll(filepath.Join(data, "checkpoint.tmp", "in-the-way"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.exited:
		if err == nil {
			t.Fatalf("the stop reported success although its checkpoint failed:\n%s", s.out)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not stop")
	}
	if after, _ := os.ReadFile(filepath.Join(data, "checkpoint")); !bytes.Equal(before, after) {
		t.Fatal("the failed stop changed the checkpoint")
	}
	os.RemoveAll(filepath.Join(data, "checkpoint.tmp"))
	s = startServe(t, args...)
	s.waitApplied(len(c.lines)) // the redo from the last checkpoint
	if got := s.accounts(); got != beforeBad {
		t.Fatalf("after recovering from the last checkpoint: %s", got)
	}
	s.stop()
}

// TestBenchCrash runs `retina bench crash` with a few trials at a tiny
// scale: servers killed at random moments and at failpoints, restarted on
// the same directory; nothing lost, nothing doubled, invariants held.
func TestBenchCrash(t *testing.T) {
	cfg := bench.DefaultCrashConfig()
	cfg.Trials, cfg.SF, cfg.TxnRate, cfg.MaxUp, cfg.FailpointShare = 6, 0.002, 500, 1500*time.Millisecond, 0.5
	if testing.Short() {
		cfg.Trials = 3
	}
	cfg.Command, cfg.Env = []string{os.Args[0]}, []string{"RETINA_TEST_RUN_MAIN=1"}
	var out bytes.Buffer
	r := bench.NewReport(&out, "crash")
	if err := bench.Crash(context.Background(), r, cfg); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, key := range []string{"rows_lost", "rows_doubled", "invariant_failures"} {
		if v, _ := r.Get(key); v != 0 {
			t.Errorf("%s = %v\n%s", key, v, out.String())
		}
	}
	t.Log(out.String())
}

// TestServeRecoversFromKillsInsideItsWork arms each failpoint in turn: the
// server dies inside a flush, a combination, a checkpoint, a restore or a
// storage-GC rewrite, and the next start recovers all of it.
func TestServeRecoversFromKillsInsideItsWork(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve several times per failpoint")
	}
	c := newChanges()
	var rows []string
	for id := 1; id <= 300; id++ {
		rows = append(rows, accountRow(id, fmt.Sprint("o", id), 100))
	}
	c.snapshot(rows...)
	for i := range 100 {
		c.txn(fmt.Sprint("t", i), event{"u", accountRow(i+1, fmt.Sprint("o", i+1), 100), accountRow(i+1, fmt.Sprint("o", i+1), 50)})
	}
	want := "300 25000.00"
	for _, point := range failpoint.All() {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "in.jsonl")
			c.write(t, src)
			// Tiny files: every few rows a block is flushed and a file combined.
			config := accountConfig(t, dir, "block_rows: 16\nfile_blocks: 2\n")
			// Storage GC rewrites every second files a fifth stale.
			args := []string{"--config", config, "--data", filepath.Join(dir, "data"), "--source", "file:" + src, "--checkpoint-interval", "1s",
				"--storage-gc-interval", "1s", "--storage-gc-stale-share", "0.2"}
			if point == failpoint.RestoreMidway { // it needs something to restore
				s := startServe(t, args...)
				s.waitRows("SELECT count(*) FROM account", "300")
				s.cmd.Process.Signal(syscall.SIGKILL)
				<-s.exited
			}
			armed := exec.Command(os.Args[0], append([]string{"serve", "--sql-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...)...)
			armed.Env = append(os.Environ(), "RETINA_TEST_RUN_MAIN=1", failpoint.EnvVar+"="+point+"=kill")
			var out lockedBuffer
			armed.Stdout, armed.Stderr = &out, &out
			if err := armed.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- armed.Wait() }()
			if strings.HasPrefix(point, "gc-") {
				// Storage GC switches at a checkpoint and drops the old file
				// once LWM passes the switch: keep transactions coming
				// (updates that change nothing the final check sees).
				stop := make(chan struct{})
				defer close(stop)
				go func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						case <-time.After(200 * time.Millisecond):
						}
						more := newChanges()
						row := accountRow(200, "o200", 100)
						more.txn(fmt.Sprint("noop", i), event{"u", row, row})
						f, err := os.OpenFile(src, os.O_APPEND|os.O_WRONLY, 0)
						if err != nil {
							return
						}
						f.WriteString(strings.Join(more.lines, "\n") + "\n")
						f.Close()
					}
				}()
			}
			select {
			case err := <-done:
				if ws, ok := err.(*exec.ExitError); !ok || ws.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("the server ended with %v, not killed at %s:\n%s", err, point, out.String())
				}
			case <-time.After(60 * time.Second):
				armed.Process.Kill()
				t.Fatalf("%s was never reached in 60s:\n%s", point, out.String())
			}
			s := startServe(t, args...)
			s.waitRows("SELECT count(*), sum(balance)::VARCHAR FROM account", want)
			s.healthy()
			s.stop()
		})
	}
}
