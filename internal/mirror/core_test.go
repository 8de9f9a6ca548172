package mirror

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/retinadb/retina/internal/change"
)

// TestDataDriven runs the scripts in testdata: each command drives the
// world (see world_test.go) and prints every event fed to the core ("> …")
// followed by the Ready it produced. After every command the visible state
// is checked against the oracle; a violation is printed. Regenerate with
// -rewrite.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var w *world
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			if td.Cmd != "init" && w == nil {
				td.Fatalf(t, "init first")
			}
			if w != nil {
				w.out.Reset()
			}
			if err := runCommand(&w, td.Cmd, args(td), td.Input); err != nil {
				return fmt.Sprintf("error: %v\n", err)
			}
			out := w.out.String()
			if err := w.check(); err != nil {
				out += fmt.Sprintf("check failed: %v\n", err)
			}
			if out == "" {
				return "ok\n"
			}
			return out
		})
	})
}

func args(td *datadriven.TestData) map[string]string {
	m := map[string]string{}
	for _, a := range td.CmdArgs {
		m[a.Key] = strings.Join(a.Vals, ",")
	}
	return m
}

func intArg(a map[string]string, key string, def int) (int, error) {
	v, ok := a[key]
	if !ok {
		return def, nil
	}
	var n int
	if _, err := fmt.Sscan(v, &n); err != nil {
		return 0, fmt.Errorf("%s=%q is not a number", key, v)
	}
	return n, nil
}

// runCommand is one script command; the model test writes the same ones.
func runCommand(wp **world, cmd string, a map[string]string, input string) error {
	w := *wp
	n, err := intArg(a, "n", -1)
	if err != nil {
		return err
	}
	switch cmd {
	case "init":
		cfg := Config{}
		if cfg.Buckets, err = intArg(a, "buckets", 2); err != nil {
			return err
		}
		if a["policy"] == "dead-letter" {
			cfg.Policy = DeadLetter
		}
		for key, p := range map[string]*int{"group": &cfg.GroupMax, "inflight": &cfg.MaxInflight, "queued": &cfg.MaxQueued,
			"checkpoint-ticks": &cfg.CheckpointTicks, "checkpoint-commits": &cfg.CheckpointCommits, "purge-ticks": &cfg.PurgeTicks} {
			if *p, err = intArg(a, key, 0); err != nil {
				return err
			}
		}
		_, cfg.CheckpointOnCommit = a["checkpoint-on-commit"]
		nw, err := newWorld(cfg)
		if err != nil {
			return err
		}
		if nw.parts, err = intArg(a, "parts", 1); err != nil {
			return err
		}
		if w != nil {
			nw.out = w.out
		}
		*wp = nw
	case "source":
		at := int64(1)
		if k := len(w.source); k > 0 {
			last := w.source[k-1]
			at = last.at + int64(len(last.ops)) + 1
		}
		for _, line := range strings.Split(strings.TrimSpace(input), "\n") {
			if line == "" {
				continue
			}
			id, body, ok := strings.Cut(line, ":")
			if !ok {
				return fmt.Errorf("source line %q: want ID: OP, OP, …", line)
			}
			t := srcTxn{id: strings.TrimSpace(id), at: at}
			for _, f := range strings.Split(body, ",") {
				op, err := parseOp(f)
				if err != nil {
					return err
				}
				t.ops = append(t.ops, op)
			}
			w.ids[t.id] = len(w.source)
			w.source = append(w.source, t)
			at += int64(len(t.ops)) + 1
		}
	case "deliver":
		for i := 0; (n < 0 && i < 1 || i < n) && w.deliver(); i++ {
		}
	case "peek":
		w.peek()
	case "grant":
		w.grant()
	case "step":
		b, err := intArg(a, "b", 0)
		if err != nil || b < 0 || b >= len(w.buckets) {
			return fmt.Errorf("step: bad bucket %q", a["b"])
		}
		for i := 0; (n < 0 || i < n) && w.step(b); i++ {
		}
	case "break":
		b, err := intArg(a, "b", 0)
		if err != nil || b < 0 || b >= len(w.buckets) {
			return fmt.Errorf("break: bad bucket %q", a["b"])
		}
		w.buckets[b].breakNext = true
	case "ack":
		for i := 0; (n < 0 || i < n) && w.ack(); i++ {
		}
	case "tick":
		w.tick()
	case "want-checkpoint":
		w.event("want-checkpoint", func() error { w.core.WantCheckpoint(); return nil })
	case "skip":
		// A message read and handled without a transaction (a position mark).
		at, err := intArg(a, "at", 0)
		if err != nil {
			return err
		}
		ps := []change.Position{{Stream: "s", Offset: int64(at)}}
		w.event(fmt.Sprintf("skip s@%d", at), func() error {
			if err := w.core.Read(0, ps); err != nil {
				return err
			}
			return w.core.Handled(0, ps)
		})
	case "drain":
		w.event("drain", func() error { w.core.Drain(nil); return nil })
	case "end":
		w.event("source-ended", func() error { return w.core.SourceEnded(0) })
	case "run":
		return w.run()
	case "restart", "crash":
		rewind, err := intArg(a, "rewind", 0)
		if err != nil {
			return err
		}
		if cmd == "crash" {
			return w.crash(rewind)
		}
		return w.restart(rewind)
	case "persisted":
		w.persisted()
	case "state":
		v := w.visible()
		keys := make([]string, 0, len(v))
		for k, val := range v {
			keys = append(keys, fmt.Sprintf("%d=%d", k, val))
		}
		sortByKey(keys)
		fmt.Fprintf(w.out, "hwm=%d rows: %s\n", w.hwm, strings.Join(keys, " "))
	case "redo":
		st := w.core.Stats()
		fmt.Fprintf(w.out, "redone=%d redoing=%t\n", st.Redone, st.Redoing)
	case "checkpoints":
		for i, cp := range w.core.Checkpoints() {
			fmt.Fprintf(w.out, "source=%d %s\n", i, cp)
		}
	default:
		return fmt.Errorf("unknown command %q", cmd)
	}
	return nil
}

// sortByKey sorts "k=v" strings by their numeric key.
func sortByKey(s []string) {
	key := func(x string) int {
		var k int
		fmt.Sscan(strings.SplitN(x, "=", 2)[0], &k)
		return k
	}
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && key(s[j]) < key(s[j-1]); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
