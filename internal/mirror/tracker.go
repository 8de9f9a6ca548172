package mirror

import (
	"slices"

	"github.com/retinadb/retina/internal/cdc"
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

// tracker follows every message of one source from read to applied (or set
// aside for good).
type tracker struct {
	streams map[string]*streamState
	applied map[string]map[string]int64
	base    map[string]int64 // resume offsets of the checkpoint we started from
}

type streamState struct {
	pending []int64 // offsets seen and not yet applied, ascending
	done    map[int64]bool
	next    int64 // one past the last offset seen
}

func newTracker(cp Checkpoint) *tracker {
	t := &tracker{streams: map[string]*streamState{}, applied: map[string]map[string]int64{}, base: map[string]int64{}}
	for s, off := range cp.Resume {
		t.base[s] = off
		t.streams[s] = &streamState{done: map[int64]bool{}, next: off}
	}
	for _, a := range cp.Applied {
		t.applied[a.ID] = a.Max
	}
	return t
}

func (t *tracker) stream(name string) *streamState {
	st := t.streams[name]
	if st == nil {
		st = &streamState{done: map[int64]bool{}}
		t.streams[name] = st
	}
	return st
}

// below reports a message the start checkpoint already covers: a
// redelivery of something applied, never pending again.
func (t *tracker) below(p cdc.Position) bool {
	base, ok := t.base[p.Stream]
	return ok && p.Offset < base
}

// seen registers messages read from the source.
func (t *tracker) seen(ps []cdc.Position) {
	for _, p := range ps {
		if t.below(p) {
			continue
		}
		st := t.stream(p.Stream)
		st.pending = append(st.pending, p.Offset)
		st.next = max(st.next, p.Offset+1)
	}
}

// done marks messages applied, or set aside for good.
func (t *tracker) done(ps []cdc.Position) {
	for _, p := range ps {
		if !t.below(p) {
			t.stream(p.Stream).done[p.Offset] = true
		}
	}
}

// duplicate reports a transaction that was applied before.
func (t *tracker) duplicate(id string, ps []cdc.Position) bool {
	if _, ok := t.applied[id]; ok {
		return true
	}
	for _, p := range ps {
		if base, ok := t.base[p.Stream]; !ok || p.Offset >= base {
			return false
		}
	}
	return len(ps) > 0
}

// applyTxn records a transaction applied (or set aside) for good.
func (t *tracker) applyTxn(id string, ps []cdc.Position) {
	reach := map[string]int64{}
	for _, p := range ps {
		reach[p.Stream] = max(reach[p.Stream], p.Offset)
	}
	t.applied[id] = reach
	t.done(ps)
}

// compact drops what every later checkpoint would drop: the applied prefix
// of each stream and the transactions wholly below it.
func (t *tracker) compact() {
	resume := map[string]int64{}
	for name, st := range t.streams {
		i := 0
		for i < len(st.pending) && st.done[st.pending[i]] {
			delete(st.done, st.pending[i])
			i++
		}
		if i > 0 {
			st.pending = slices.Delete(st.pending, 0, i)
		}
		resume[name] = st.resumeAt()
	}
	for id, reach := range t.applied {
		keep := false
		for s, off := range reach {
			keep = keep || off >= resume[s]
		}
		if !keep {
			delete(t.applied, id)
		}
	}
}

func (st *streamState) resumeAt() int64 {
	for _, off := range st.pending {
		if !st.done[off] {
			return off
		}
	}
	return st.next
}

// checkpoint is the current resume point.
func (t *tracker) checkpoint() Checkpoint {
	cp := Checkpoint{Resume: map[string]int64{}}
	for name, st := range t.streams {
		cp.Resume[name] = st.resumeAt()
	}
	ids := make([]string, 0, len(t.applied))
	for id, reach := range t.applied {
		for s, off := range reach {
			if off >= cp.Resume[s] {
				ids = append(ids, id)
				break
			}
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		cp.Applied = append(cp.Applied, AppliedTxn{ID: id, Max: t.applied[id]})
	}
	return cp
}
