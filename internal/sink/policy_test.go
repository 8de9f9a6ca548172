package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/mirror"
)

// stream writes Debezium JSON lines for the customer table, with
// transaction metadata, and remembers the line each transaction starts on.
type stream struct {
	lines []string
	start map[string]int // transaction id → line of its BEGIN (1-based)
}

func newStream() *stream { return &stream{start: map[string]int{}} }

func customerRow(id int, name string) string {
	return fmt.Sprintf(`{"id":%d,"name":%q,"balance":"BOI=","updated":1}`, id, name)
}

// snapshot adds snapshot reads (op r) without metadata.
func (s *stream) snapshot(ids ...int) {
	for _, id := range ids {
		s.lines = append(s.lines, fmt.Sprintf(`{"op":"r","source":{"table":"customer"},"before":null,"after":%s}`, customerRow(id, "snap")))
	}
}

// txn adds BEGIN, the changes ("c 5 name", "u 5 name", "d 5", "r 5 name",
// "t") and END.
func (s *stream) txn(id string, changes ...string) {
	s.start[id] = len(s.lines) + 1
	s.lines = append(s.lines, fmt.Sprintf(`{"status":"BEGIN","id":%q}`, id))
	for i, c := range changes {
		f := strings.Fields(c)
		var before, after, op = "null", "null", f[0]
		var key int
		if len(f) > 1 {
			fmt.Sscan(f[1], &key)
		}
		switch op {
		case "c", "r":
			after = customerRow(key, f[2])
		case "u":
			before, after = customerRow(key, "old"), customerRow(key, f[2])
		case "d":
			before = customerRow(key, "old")
		}
		s.lines = append(s.lines, fmt.Sprintf(`{"op":%q,"source":{"table":"customer"},"before":%s,"after":%s,"transaction":{"id":%q,"total_order":%d}}`,
			op, before, after, id, i+1))
	}
	s.lines = append(s.lines, fmt.Sprintf(`{"status":"END","id":%q,"event_count":%d,"data_collections":[{"data_collection":"db.customer","event_count":%d}]}`,
		id, len(changes), len(changes)))
}

func (s *stream) write(t *testing.T, path string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(s.lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runFile runs a sink over a file to its end (or its stop) with a bound on
// time: a hang fails the test instead of blocking it.
func (st *stack) runFile(t *testing.T, path string, mod func(*Config)) (*Sink, error) {
	t.Helper()
	src, err := cdc.OpenFileSource(path, cdc.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := st.newSink(t, src, mod)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = s.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the sink did not finish within 30s: %v", err)
	}
	return s, err
}

func (st *stack) settled(t *testing.T) {
	t.Helper()
	w, _ := st.svc.Watermarks(context.Background())
	if w.HWM != w.Next {
		t.Fatalf("timestamps left neither committed nor aborted: %+v", w)
	}
}

// failingStream: snapshot rows, a complete transfer, a transaction that
// deletes a key that does not exist (it cannot be applied), and a good
// transaction after it.
func failingStream() *stream {
	s := newStream()
	s.snapshot(1, 2, 3, 4)
	s.txn("transfer", "u 1 paid", "u 2 received")
	s.txn("bad", "u 3 changed", "d 99", "c 10 new")
	s.txn("after", "u 4 later")
	return s
}

// TestUnappliableTransactionFailPolicy: under fail, ingestion stops at the
// transaction that cannot be applied, naming its first message and the
// reason; everything before it is visible and nothing of it or after it is;
// a restart from the checkpoint stops at the same place with the same
// message, re-reads nothing applied and never moves past it.
func TestUnappliableTransactionFailPolicy(t *testing.T) {
	st := newStack(t)
	if _, err := st.cat.CreateTable(context.Background(), "customer", customerSchema()); err != nil {
		t.Fatal(err)
	}
	fs := failingStream()
	path := fs.write(t, filepath.Join(st.dir, "in.jsonl"))
	want := map[string]string{"1": "paid|12.50|1", "2": "received|12.50|1", "3": "snap|12.50|1", "4": "snap|12.50|1"}
	var firstErr string
	cp := []change.Checkpoint(nil)
	for run := range 3 {
		s, err := st.runFile(t, path, func(c *Config) { c.Start = cp })
		var te *mirror.TxnError
		if !errors.As(err, &te) || te.ID != "bad" {
			t.Fatalf("run %d: want a stop at transaction bad, got %v", run, err)
		}
		pos := fmt.Sprintf("file:%s@%d", path, fs.start["bad"])
		if !strings.Contains(err.Error(), pos) || !strings.Contains(err.Error(), "no live row") {
			t.Fatalf("run %d: the error does not name %s and the reason: %v", run, pos, err)
		}
		if run == 0 {
			firstErr = err.Error()
		} else if err.Error() != firstErr {
			t.Fatalf("run %d stopped differently:\n%v\nfirst:\n%v", run, err, firstErr)
		}
		if got := st.rows(t, "customer"); !maps.Equal(got, want) {
			t.Fatalf("run %d: visible %v, want %v", run, got, want)
		}
		st.settled(t)
		cp = s.Checkpoints()
		if r := cp[0].Resume["file:"+path]; r != int64(fs.start["bad"]) {
			t.Fatalf("run %d: resumes at line %d, want the failed transaction's BEGIN at %d", run, r, fs.start["bad"])
		}
	}
}

// TestUnappliableTransactionDeadLetter: under dead-letter, the transaction
// is one record in the dead-letter file with every message and position
// and the reason; none of it is visible and ingestion goes on with the next.
func TestUnappliableTransactionDeadLetter(t *testing.T) {
	st := newStack(t)
	if _, err := st.cat.CreateTable(context.Background(), "customer", customerSchema()); err != nil {
		t.Fatal(err)
	}
	fs := failingStream()
	path := fs.write(t, filepath.Join(st.dir, "in.jsonl"))
	dead := filepath.Join(st.dir, "dead.jsonl")
	s, err := st.runFile(t, path, func(c *Config) { c.BadInput, c.DeadLetterPath = DeadLetter, dead })
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"1": "paid|12.50|1", "2": "received|12.50|1", "3": "snap|12.50|1", "4": "later|12.50|1"}
	if got := st.rows(t, "customer"); !maps.Equal(got, want) {
		t.Fatalf("visible %v, want %v", got, want)
	}
	st.settled(t)
	data, err := os.ReadFile(dead)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one dead-letter record, got %d:\n%s", len(lines), data)
	}
	var rec struct {
		Transaction string
		Reason      string
		Positions   []cdc.Position
		Messages    []struct {
			Position cdc.Position
			Value    string
		}
	}
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	first := fs.start["bad"]
	if rec.Transaction != "bad" || !strings.Contains(rec.Reason, "no live row") || len(rec.Positions) != 5 || len(rec.Messages) != 5 {
		t.Fatalf("dead-letter record: %s", lines[0])
	}
	for i, m := range rec.Messages {
		if m.Position.Offset != int64(first+i) || m.Value != fs.lines[first+i-1] {
			t.Fatalf("message %d of the record: %+v, want line %d %q", i, m, first+i, fs.lines[first+i-1])
		}
	}
	if got := s.Stats().DeadLettered; got != 1 {
		t.Fatalf("dead-lettered %d", got)
	}
	// A restart does not bring it back.
	if _, err := st.runFile(t, path, func(c *Config) { c.BadInput, c.DeadLetterPath, c.Start = DeadLetter, dead, s.Checkpoints() }); err != nil {
		t.Fatal(err)
	}
	if got := st.rows(t, "customer"); !maps.Equal(got, want) {
		t.Fatalf("after a restart: visible %v, want %v", got, want)
	}
}

// TestTruncateSeesItsOwnTransaction: a truncate deletes the rows its own
// transaction inserted before it, and does not delete again a row its
// transaction already deleted.
func TestTruncateSeesItsOwnTransaction(t *testing.T) {
	st := newStack(t)
	if _, err := st.cat.CreateTable(context.Background(), "customer", customerSchema()); err != nil {
		t.Fatal(err)
	}
	fs := newStream()
	fs.snapshot(1, 2, 3)
	fs.txn("insert-then-truncate", "c 5 five", "t")
	fs.txn("refill", "c 1 one", "c 2 two")
	fs.txn("delete-then-truncate", "d 1", "t", "c 7 seven")
	if _, err := st.runFile(t, fs.write(t, filepath.Join(st.dir, "in.jsonl")), nil); err != nil {
		t.Fatal(err)
	}
	if got, want := st.rows(t, "customer"), map[string]string{"7": "seven|12.50|1"}; !maps.Equal(got, want) {
		t.Fatalf("visible %v, want %v", got, want)
	}
	st.settled(t)
}

// TestTruncateAfterFailure: a truncate queued behind a transaction that
// fails neither blocks nor runs early: under fail ingestion stops at the
// failure; under dead-letter the truncate applies after it.
func TestTruncateAfterFailure(t *testing.T) {
	for _, policy := range []Policy{Fail, DeadLetter} {
		t.Run(string(policy), func(t *testing.T) {
			st := newStack(t)
			if _, err := st.cat.CreateTable(context.Background(), "customer", customerSchema()); err != nil {
				t.Fatal(err)
			}
			fs := newStream()
			fs.snapshot(1, 2)
			fs.txn("bad", "d 42")
			fs.txn("truncate", "t")
			fs.txn("after", "c 3 three")
			dead := filepath.Join(st.dir, "dead.jsonl")
			_, err := st.runFile(t, fs.write(t, filepath.Join(st.dir, "in.jsonl")), func(c *Config) { c.BadInput, c.DeadLetterPath = policy, dead })
			want := map[string]string{"3": "three|12.50|1"}
			if policy == Fail {
				var te *mirror.TxnError
				if !errors.As(err, &te) || te.ID != "bad" {
					t.Fatalf("want a stop at bad, got %v", err)
				}
				want = map[string]string{"1": "snap|12.50|1", "2": "snap|12.50|1"}
			} else if err != nil {
				t.Fatal(err)
			}
			if got := st.rows(t, "customer"); !maps.Equal(got, want) {
				t.Fatalf("visible %v, want %v", got, want)
			}
			st.settled(t)
		})
	}
}

// TestSnapshotReadIsUpsert: a snapshot read of a key that exists (an
// incremental snapshot or a re-snapshot) overwrites the row instead of
// stopping the pipeline.
func TestSnapshotReadIsUpsert(t *testing.T) {
	st := newStack(t)
	if _, err := st.cat.CreateTable(context.Background(), "customer", customerSchema()); err != nil {
		t.Fatal(err)
	}
	fs := newStream()
	fs.snapshot(1, 2)
	fs.txn("update", "u 1 changed")
	fs.txn("incremental-snapshot", "r 1 again", "r 3 new")
	fs.lines = append(fs.lines, `{"op":"r","source":{"table":"customer"},"before":null,"after":`+customerRow(2, "resnap")+`}`)
	if _, err := st.runFile(t, fs.write(t, filepath.Join(st.dir, "in.jsonl")), nil); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"1": "again|12.50|1", "2": "resnap|12.50|1", "3": "new|12.50|1"}
	if got := st.rows(t, "customer"); !maps.Equal(got, want) {
		t.Fatalf("visible %v, want %v", got, want)
	}
}
