package mirror

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/retinadb/retina/internal/change"
)

// history is one random run: a configuration, what the source holds and
// the commands that drive the world.
type history struct {
	init     string
	source   []srcTxn
	commands []string
}

// TestModel drives the core through random histories of transactions (some
// of which cannot be applied), interleavings of buckets, grants and
// acknowledgements, ticks, drains and restarts with redelivery, and checks
// after every command that the visible state equals the oracle's. At the
// end every transaction must be resolved as the policy says. A failing
// history is shrunk and printed as a datadriven script.
func TestModel(t *testing.T) {
	runs := 1000
	if testing.Short() {
		runs = 200
	}
	for seed := range uint64(runs) {
		h := randomHistory(rand.New(rand.NewPCG(seed, 99)))
		if err := h.run(nil); err != nil {
			small := shrink(h)
			t.Fatalf("seed %d: %v\nshrunk history, as a script (its last command fails):\n%s", seed, small.run(nil), small.script())
		}
	}
}

// TestModelReplaysScripts checks that the scripts the model test prints
// read back: a shrunk history run through datadriven reproduces itself.
func TestModelReplaysScripts(t *testing.T) {
	h := randomHistory(rand.New(rand.NewPCG(7, 99)))
	datadriven.RunTestFromString(t, h.script(), func(t *testing.T, td *datadriven.TestData) string {
		return td.Expected // the script's expected output is what it printed
	})
}

func randomHistory(rng *rand.Rand) history {
	policy := []string{"fail", "dead-letter"}[rng.IntN(2)]
	buckets := 1 + rng.IntN(4)
	// Under the fail policy the driver may propose transactions in parts.
	parts := 1
	if policy == "fail" {
		parts = 1 + rng.IntN(3)
	}
	h := history{init: fmt.Sprintf("init buckets=%d policy=%s group=%d inflight=%d queued=%d checkpoint-ticks=%d checkpoint-commits=%d parts=%d",
		buckets, policy, 1+rng.IntN(4), 2+rng.IntN(8), 1+rng.IntN(6), 1+rng.IntN(2), rng.IntN(3)*3, parts)}
	n := 5 + rng.IntN(30)
	live := map[int64]bool{}
	at := int64(1)
	for i := range n {
		t := srcTxn{id: fmt.Sprintf("t%d", i+1), at: at}
		for range 1 + rng.IntN(4) {
			k := int64(rng.IntN(8))
			var op fakeOp
			switch r := rng.IntN(41); {
			case r == 40:
				op = fakeOp{kind: invalidOp}
			case r < 2:
				op = fakeOp{kind: change.Truncate}
				clear(live)
			case r < 5: // sometimes wrong on purpose, often by chance
				op = fakeOp{kind: change.Delete, key: k}
				delete(live, k)
			case r < 11:
				op = fakeOp{kind: change.Upsert, key: k, val: rng.Int64N(100)}
				live[k] = true
			case r < 24 && !live[k]:
				op = fakeOp{kind: change.Insert, key: k, val: rng.Int64N(100)}
				live[k] = true
			case r < 24:
				op = fakeOp{kind: change.Update, key: k, val: rng.Int64N(100)}
			default:
				op = fakeOp{kind: []change.OpKind{change.Insert, change.Update}[rng.IntN(2)], key: k, val: rng.Int64N(100)}
				live[k] = true
			}
			t.ops = append(t.ops, op)
		}
		h.source = append(h.source, t)
		at += int64(len(t.ops)) + 1
	}
	for range 30 + rng.IntN(150) {
		var c string
		switch r := rng.IntN(60); {
		case r < 8:
			c = "deliver"
		case r < 14:
			c = "grant"
		case r < 28:
			c = fmt.Sprintf("step b=%d n=%d", rng.IntN(buckets), 1+rng.IntN(3))
		case r < 34:
			c = fmt.Sprintf("ack n=%d", 1+rng.IntN(2))
		case r < 42:
			c = "tick"
		case r < 43:
			c = []string{"drain", "end"}[rng.IntN(2)]
		case r < 45:
			c = fmt.Sprintf("restart rewind=%d", rng.IntN(4))
		case r < 48:
			c = "peek"
		case r < 57:
			c = "persisted"
		default:
			c = fmt.Sprintf("crash rewind=%d", rng.IntN(3))
		}
		h.commands = append(h.commands, c)
	}
	return h
}

// run replays the history; out, when set, collects each command's output.
func (h history) run(out func(cmd, output string)) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	var w *world
	do := func(line string) error {
		cmd, a := parseLine(line)
		if w != nil {
			w.out.Reset()
		}
		input := ""
		if cmd == "source" {
			input = sourceText(h.source)
		}
		if err := runCommand(&w, cmd, a, input); err != nil {
			return fmt.Errorf("%s: %w", line, err)
		}
		if out != nil {
			o := w.out.String()
			if o == "" {
				o = "ok\n"
			}
			out(line, o)
		}
		if strings.Contains(w.out.String(), "error:") {
			return fmt.Errorf("%s: the core refused an event:\n%s", line, w.out.String())
		}
		if err := w.check(); err != nil {
			return fmt.Errorf("%s: %w", line, err)
		}
		return nil
	}
	for _, line := range append([]string{h.init, "source"}, h.commands...) {
		if err := do(line); err != nil {
			return err
		}
	}
	// Finally everything gets its chance: restart, run to the end.
	for _, line := range []string{"restart", "run"} {
		if err := do(line); err != nil {
			return err
		}
	}
	return h.liveness(w)
}

// liveness: after the final run every transaction is resolved, or, under
// the fail policy, ingestion stopped at the first that cannot be applied.
func (h history) liveness(w *world) error {
	_, resolved, _ := w.oracle()
	if w.cfg.Policy == DeadLetter {
		if resolved != len(h.source) {
			return fmt.Errorf("after the final run only %d of %d transactions are resolved", resolved, len(h.source))
		}
		return nil
	}
	first := firstFailing(h.source)
	if first < 0 {
		if resolved != len(h.source) {
			return fmt.Errorf("after the final run only %d of %d transactions are resolved", resolved, len(h.source))
		}
		return nil
	}
	var te *TxnError
	if resolved != first || !w.finished || !errors.As(w.finishErr, &te) || te.ID != h.source[first].id {
		return fmt.Errorf("fail policy: want a stop at %s with everything before it applied; resolved %d, finished %v, err %v",
			h.source[first].id, resolved, w.finished, w.finishErr)
	}
	return nil
}

func firstFailing(src []srcTxn) int {
	w := &world{source: src, committed: map[string]int{}}
	for i := range src {
		if !w.appliesAfter(i, w.isCommitted) {
			return i
		}
		w.committed[src[i].id] = 1
	}
	return -1
}

func parseLine(line string) (string, map[string]string) {
	f := strings.Fields(line)
	a := map[string]string{}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		a[k] = v
	}
	return f[0], a
}

func sourceText(src []srcTxn) string {
	var b strings.Builder
	for _, t := range src {
		ops := make([]string, len(t.ops))
		for i, o := range t.ops {
			ops[i] = o.String()
		}
		fmt.Fprintf(&b, "%s: %s\n", t.id, strings.Join(ops, ", "))
	}
	return b.String()
}

// script renders the history as a datadriven script with its output.
func (h history) script() string {
	var b strings.Builder
	h.run(func(cmd, output string) {
		b.WriteString(cmd + "\n")
		if cmd == "source" {
			b.WriteString(sourceText(h.source))
		}
		b.WriteString("----\n" + output + "\n")
	})
	return b.String()
}

// shrink removes commands and source transactions while the history still
// fails.
func shrink(h history) history {
	for progress := true; progress; {
		progress = false
		for i := len(h.commands) - 1; i >= 0; i-- {
			c := h
			c.commands = append(append([]string{}, h.commands[:i]...), h.commands[i+1:]...)
			if c.run(nil) != nil {
				h, progress = c, true
			}
		}
		for i := len(h.source) - 1; i >= 0; i-- {
			c := h
			c.source = renumber(append(append([]srcTxn{}, h.source[:i]...), h.source[i+1:]...))
			if c.run(nil) != nil {
				h, progress = c, true
			}
		}
	}
	return h
}

// renumber lays the transactions' messages out again without gaps.
func renumber(src []srcTxn) []srcTxn {
	at := int64(1)
	for i := range src {
		src[i].at = at
		at += int64(len(src[i].ops)) + 1
	}
	return src
}
