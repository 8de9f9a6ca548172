package csr

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestRegistry runs the scripts in testdata. Commands:
//
//	new part-size=N
//	bounds s=S          → the storage snapshots S may read at
//	select s=S v=V      → record a snapshot point
//	commit c1=A c2=B    → the commit check
//	recycle oldest=S keep=K
//	show                → parts and their points
func TestRegistry(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var r *Registry
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			arg := func(name string) uint64 {
				var v uint64
				d.ScanArgs(t, name, &v)
				return v
			}
			switch d.Cmd {
			case "new":
				var n int
				d.ScanArgs(t, "part-size", &n)
				r = New(n)
				return ""
			case "bounds":
				b, err := r.Bounds(arg("s"))
				if err != nil {
					return "error: " + err.Error()
				}
				up := "∞"
				if b.Upper != ^uint64(0) {
					up = fmt.Sprint(b.Upper)
				}
				return fmt.Sprintf("[%d, %s]", b.Lower, up)
			case "select":
				if err := r.Select(arg("s"), arg("v")); err != nil {
					return "error: " + err.Error()
				}
				return "ok"
			case "commit":
				if err := r.CommitCheck(arg("c1"), arg("c2")); err != nil {
					return "error: " + err.Error()
				}
				return "ok"
			case "recycle":
				var keep int
				d.ScanArgs(t, "keep", &keep)
				return fmt.Sprintf("dropped %d", r.Recycle(arg("oldest"), keep))
			case "show":
				var b strings.Builder
				if f, ok := r.Floor(); ok {
					fmt.Fprintf(&b, "floor %s %d→%d\n", f.Kind, f.Anchor, f.Storage)
				}
				for i, p := range r.parts {
					fmt.Fprintf(&b, "part %d:", i)
					for _, pt := range p.points {
						if pt.Kind == Snapshot {
							fmt.Fprintf(&b, " s%d→%d..%d", pt.Anchor, pt.Low, pt.Storage)
						} else {
							fmt.Fprintf(&b, " c%d→%d", pt.Anchor, pt.Storage)
						}
					}
					b.WriteString("\n")
				}
				return b.String()
			}
			return "unknown command " + d.Cmd
		})
	})
}
