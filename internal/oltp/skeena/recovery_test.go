package skeena

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/retinadb/retina/internal/oltp/engine"
)

func TestDecide(t *testing.T) {
	x := func(c1, c2, snap uint64) engine.Recovered {
		return engine.Recovered{CommitTS: c1, Snapshot: snap, Tag: crossTag(c1, c2)}
	}
	xd := func(c1, c2, snap uint64) engine.Recovered {
		return engine.Recovered{CommitTS: c2, Snapshot: snap, Tag: crossTag(c1, c2)}
	}
	rd := func(kind byte, cts, snap, other uint64) engine.Recovered {
		return engine.Recovered{CommitTS: cts, Snapshot: snap, Tag: readTag(kind, other, cts)}
	}
	show := func(d engine.Discard) string {
		var tags []string
		for tag := range d.Tags {
			b := []byte(tag)
			if b[0] == tagCross {
				tags = append(tags, fmt.Sprintf("x%d→%d", beUint(b[1:9]), beUint(b[9:17])))
			} else {
				tags = append(tags, fmt.Sprintf("%c%d", b[0], beUint(b[1:9])))
			}
		}
		sort.Strings(tags)
		return fmt.Sprintf("from=%d [%s]", d.FromSnapshot, strings.Join(tags, " "))
	}
	for _, tc := range []struct {
		name              string
		mem, disk         []engine.Recovered
		memBase, diskBase uint64
		wantMem, wantDisk string
	}{
		{name: "both halves present",
			mem: []engine.Recovered{x(10, 5, 9)}, disk: []engine.Recovered{xd(10, 5, 4)},
			wantMem: "from=0 []", wantDisk: "from=0 []"},
		{name: "memory half only",
			mem:     []engine.Recovered{x(10, 5, 9)},
			wantMem: "from=10 [x10→5]", wantDisk: "from=5 [x10→5]"},
		{name: "memory half only, storage forgot the record (durable there)",
			mem: []engine.Recovered{x(10, 5, 9)}, diskBase: 5,
			wantMem: "from=0 []", wantDisk: "from=0 []"},
		{name: "storage half only, memory checkpointed it",
			disk: []engine.Recovered{xd(10, 5, 4)}, memBase: 12,
			wantMem: "from=0 []", wantDisk: "from=0 []"},
		{name: "cascade through snapshots and cross reads",
			// X (10→5) is in storage only: storage drops from snapshot 5,
			// memory from 10. Y read storage at 6 ≥ 5: dropped in both. W
			// wrote memory after reading storage at 7: dropped. R wrote
			// storage after reading the anchor at 20 ≥ 10: dropped. K read
			// storage at 3 and the anchor at 8: kept.
			mem: []engine.Recovered{x(15, 8, 14), rd(tagReadStorage, 16, 15, 7), x(12, 4, 8)},
			disk: []engine.Recovered{xd(10, 5, 4), xd(15, 8, 6), rd(tagReadMemory, 9, 8, 20),
				xd(12, 4, 3)},
			wantMem:  "from=10 [w7 x10→5 x15→8]",
			wantDisk: "from=5 [r20 x10→5 x15→8]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := decide(tc.mem, tc.disk, tc.memBase, tc.diskBase)
			if err != nil {
				t.Fatal(err)
			}
			if got := show(d.mem); got != tc.wantMem {
				t.Errorf("memory drops %s, want %s", got, tc.wantMem)
			}
			if got := show(d.disk); got != tc.wantDisk {
				t.Errorf("storage drops %s, want %s", got, tc.wantDisk)
			}
		})
	}
	if _, err := decide([]engine.Recovered{{CommitTS: 3, Tag: []byte("junk")}}, nil, 0, 0); err == nil {
		t.Fatal("a malformed tag must fail recovery with an error")
	}
}

func beUint(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}
