package change

import (
	"fmt"
	"slices"
	"strings"
)

// Checkpoint is what one source needs to resume without duplicates: per
// stream the first offset not yet applied, and the applied transactions
// that have messages at or beyond those offsets (a redelivered copy of one
// is dropped). A transaction whose every message lies below the resume
// offsets is known applied too.
type Checkpoint struct {
	Resume  map[string]int64 `json:"resume"`
	Applied []AppliedTxn     `json:"applied,omitempty"`
}

// AppliedTxn is one applied transaction and how far its messages reach.
type AppliedTxn struct {
	ID  string           `json:"id"`
	Max map[string]int64 `json:"max"`
}

// String renders a checkpoint with its streams and applied ids sorted.
func (cp Checkpoint) String() string {
	var b strings.Builder
	b.WriteString("resume=")
	names := make([]string, 0, len(cp.Resume))
	for n := range cp.Resume {
		names = append(names, n)
	}
	slices.Sort(names)
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s@%d", n, cp.Resume[n])
	}
	if len(cp.Applied) > 0 {
		b.WriteString(" applied=")
		for i, a := range cp.Applied {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(a.ID)
		}
	}
	return b.String()
}
