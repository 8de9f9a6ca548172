package iceberg

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestPolicies runs the scripts in testdata: the publisher's decisions
// that need no I/O (which pieces a publication merges, which snapshots it
// expires, which rows of a piece it masks). Regenerate with -rewrite.
//
//	merge live=<sizes, oldest first> fresh=<rows> max=<pieces>
//	expire retention=<duration> now=<seconds>
//	<seconds of each snapshot, oldest first, one a line>
//	mask virtual=<file:rows:deleted offsets;…>
//	<segments of a piece: file lo hi written-offsets, one a line>
func TestPolicies(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			switch td.Cmd {
			case "merge":
				var fresh int64
				var maxPieces int
				var live []int64
				for _, a := range td.CmdArgs {
					switch a.Key {
					case "live":
						for _, v := range a.Vals {
							for _, n := range strings.Split(v, ",") {
								if n != "" {
									live = append(live, atoi(t, n))
								}
							}
						}
					case "fresh":
						fresh = atoi(t, a.Vals[0])
					case "max":
						maxPieces = int(atoi(t, a.Vals[0]))
					}
				}
				from := mergeFrom(live, fresh, maxPieces)
				kept := live[:from]
				merged := fresh
				for _, n := range live[from:] {
					merged += n
				}
				return fmt.Sprintf("keep %v, rewrite %d rows (%d pieces and the fresh rows) into one\n", kept, merged, len(live)-from)
			case "expire":
				var retention time.Duration
				var now int64
				for _, a := range td.CmdArgs {
					switch a.Key {
					case "retention":
						d, err := time.ParseDuration(a.Vals[0])
						if err != nil {
							t.Fatal(err)
						}
						retention = d
					case "now":
						now = atoi(t, a.Vals[0])
					}
				}
				var snaps []snapTime
				for i, line := range strings.Fields(td.Input) {
					snaps = append(snaps, snapTime{ID: int64(i + 1), At: time.Unix(atoi(t, line), 0)})
				}
				gone := expired(snaps, time.Unix(now, 0), retention)
				var kept []string
				for _, s := range snaps {
					if !containsID(gone, s.ID) {
						kept = append(kept, fmt.Sprint(s.At.Unix()))
					}
				}
				return fmt.Sprintf("keep %s\n", strings.Join(kept, " "))
			case "mask":
				virtual := map[uint64]virtualAt{}
				for _, a := range td.CmdArgs {
					for _, v := range strings.Split(strings.Join(a.Vals, ","), ",") {
						parts := strings.Split(v, ":")
						rows := atoi(t, parts[1])
						bm := make([]uint64, words(rows))
						if len(parts) > 2 && parts[2] != "" {
							for _, o := range strings.Split(parts[2], "/") {
								setBit(bm, atoi(t, o))
							}
						}
						virtual[uint64(atoi(t, parts[0]))] = virtualAt{Rows: rows, Deleted: bm}
					}
				}
				pc := &piece{entry: &entry{}}
				for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
					f := strings.Fields(line)
					s := segment{File: uint64(atoi(t, f[0])), Lo: atoi(t, f[1]), Hi: atoi(t, f[2])}
					s.Written = make([]uint64, words(s.Hi-s.Lo))
					for _, o := range f[3:] {
						setBit(s.Written, atoi(t, o)-s.Lo)
						s.Rows++
					}
					pc.Segs = append(pc.Segs, s)
					pc.Records += s.Rows
				}
				bm, live := pc.masked(virtual)
				var pos []string
				eachSet(bm, func(i int64) { pos = append(pos, fmt.Sprint(i)) })
				return fmt.Sprintf("masked positions [%s] of %d, %d live\n", strings.Join(pos, " "), pc.Records, live)
			}
			td.Fatalf(t, "unknown command %s", td.Cmd)
			return ""
		})
	})
}

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return n
}

func containsID(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
