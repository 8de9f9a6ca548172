package mirror

import (
	"slices"

	"github.com/retinadb/retina/internal/change"
)

// tracker follows every message of one source from read to applied (or set
// aside for good).
type tracker struct {
	streams map[string]*streamState
	applied map[string]map[string]int64
	base    map[string]int64 // resume offsets of the checkpoint we started from
}

// streamState holds one stream's offsets seen and not yet compacted away,
// ascending and unique, each with whether it is done. Offsets of a stream
// mostly come in order, so this is appends and binary searches rather than
// a map entry per message.
type streamState struct {
	offs []int64
	done []bool
	next int64 // one past the last offset seen
	// lo is a lower bound of the first offset not done: every entry below
	// it is done, so resumeAt scans on from there rather than over every
	// done entry waiting for compaction (waits ask it at every Ready).
	lo int
}

// find is the index of off in offs, or where it goes.
func (st *streamState) find(off int64) (int, bool) {
	if n := len(st.offs); n > 0 && st.offs[n-1] == off {
		return n - 1, true
	}
	return slices.BinarySearch(st.offs, off)
}

// add records off (seen, or done without having been seen).
func (st *streamState) add(off int64, done bool) {
	if n := len(st.offs); n == 0 || off > st.offs[n-1] {
		st.offs, st.done = append(st.offs, off), append(st.done, done)
		return
	}
	i, found := st.find(off)
	if found {
		st.done[i] = st.done[i] || done
		return
	}
	st.offs, st.done = slices.Insert(st.offs, i, off), slices.Insert(st.done, i, done)
	if i < st.lo {
		if done {
			st.lo++
		} else {
			st.lo = i
		}
	}
}

func newTracker(cp change.Checkpoint) *tracker {
	t := &tracker{streams: map[string]*streamState{}, applied: map[string]map[string]int64{}, base: map[string]int64{}}
	for s, off := range cp.Resume {
		t.base[s] = off
		t.streams[s] = &streamState{next: off}
	}
	for _, a := range cp.Applied {
		t.applied[a.ID] = a.Max
	}
	return t
}

func (t *tracker) stream(name string) *streamState {
	st := t.streams[name]
	if st == nil {
		st = &streamState{}
		t.streams[name] = st
	}
	return st
}

// below reports a message the start checkpoint already covers: a
// redelivery of something applied, never pending again.
func (t *tracker) below(p change.Position) bool {
	base, ok := t.base[p.Stream]
	return ok && p.Offset < base
}

// seen registers messages read from the source.
func (t *tracker) seen(ps []change.Position) {
	for _, p := range ps {
		if t.below(p) {
			continue
		}
		st := t.stream(p.Stream)
		st.add(p.Offset, false)
		st.next = max(st.next, p.Offset+1)
	}
}

// done marks messages applied, or set aside for good.
func (t *tracker) done(ps []change.Position) {
	for _, p := range ps {
		if t.below(p) {
			continue
		}
		st := t.stream(p.Stream)
		if i, found := st.find(p.Offset); found {
			st.done[i] = true
		} else {
			st.add(p.Offset, true)
		}
	}
}

// duplicate reports a transaction that was applied before.
func (t *tracker) duplicate(id string, ps []change.Position) bool {
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
func (t *tracker) applyTxn(id string, ps []change.Position) {
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
		for i < len(st.offs) && st.done[i] {
			i++
		}
		if i > 0 {
			st.offs, st.done = slices.Delete(st.offs, 0, i), slices.Delete(st.done, 0, i)
			st.lo = max(0, st.lo-i)
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
	for st.lo < len(st.offs) && st.done[st.lo] {
		st.lo++
	}
	if st.lo < len(st.offs) {
		return st.offs[st.lo]
	}
	return st.next
}

// checkpoint is the current resume point.
func (t *tracker) checkpoint() change.Checkpoint {
	cp := change.Checkpoint{Resume: map[string]int64{}}
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
		cp.Applied = append(cp.Applied, change.AppliedTxn{ID: id, Max: t.applied[id]})
	}
	return cp
}
