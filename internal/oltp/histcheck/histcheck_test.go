package histcheck

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestCheck runs testdata scripts. "check level=si|serializable" takes a
// history, one transaction per line:
//
//	T<id> [aborted]: op; op; …
//
// with ops "a K V" (append V to list K), "r K V,V,…" (read list K),
// "w K V PREV" (register K becomes version V, replacing PREV) and "g K V"
// (read version V of register K), and prints the anomalies found.
func TestCheck(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "check" {
				return "unknown command " + d.Cmd
			}
			var lvl string
			d.ScanArgs(t, "level", &lvl)
			level := SnapshotIsolation
			if lvl == "serializable" {
				level = Serializable
			}
			h, err := parse(d.Input)
			if err != nil {
				return "error: " + err.Error()
			}
			var b strings.Builder
			for _, a := range Check(h, level) {
				fmt.Fprintln(&b, a)
			}
			if b.Len() == 0 {
				return "ok\n"
			}
			return b.String()
		})
	})
}

func parse(input string) ([]Txn, error) {
	var h []Txn
	for _, line := range strings.Split(strings.TrimSpace(input), "\n") {
		head, body, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("line %q: want T<id>: ops", line)
		}
		f := strings.Fields(head)
		id, err := strconv.Atoi(strings.TrimPrefix(f[0], "T"))
		if err != nil {
			return nil, fmt.Errorf("line %q: %v", line, err)
		}
		t := Txn{ID: id}
		if len(f) > 1 && f[1] == "aborted" {
			t.Status = Aborted
		}
		for _, s := range strings.Split(body, ";") {
			w := strings.Fields(s)
			if len(w) < 3 {
				return nil, fmt.Errorf("op %q: too short", s)
			}
			num := func(s string) int { n, _ := strconv.Atoi(s); return n }
			op := Op{Key: w[1]}
			switch w[0] {
			case "a":
				op.Kind, op.Value = Append, num(w[2])
			case "r":
				op.Kind = ReadList
				if w[2] != "-" {
					for _, v := range strings.Split(w[2], ",") {
						op.List = append(op.List, num(v))
					}
				}
			case "w":
				op.Kind, op.Value, op.Prev = Write, num(w[2]), num(w[3])
			case "g":
				op.Kind, op.Value = ReadReg, num(w[2])
			default:
				return nil, fmt.Errorf("op %q: unknown kind", s)
			}
			t.Ops = append(t.Ops, op)
		}
		h = append(h, t)
	}
	return h, nil
}
