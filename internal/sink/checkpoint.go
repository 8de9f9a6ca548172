package sink

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/durable"
)

// Checkpoint is what the sink needs to resume without duplicates: per
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

// tracker follows every message from read to commit.
type tracker struct {
	mu      sync.Mutex
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

// seen registers a message read from the source.
func (t *tracker) seen(p cdc.Position) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stream(p.Stream)
	st.pending = append(st.pending, p.Offset)
	st.next = max(st.next, p.Offset+1)
}

// done marks messages applied (or skipped for good).
func (t *tracker) done(ps []cdc.Position) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range ps {
		t.stream(p.Stream).done[p.Offset] = true
	}
}

// duplicate reports a transaction that was applied before.
func (t *tracker) duplicate(tx Txn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.applied[tx.ID]; ok {
		return true
	}
	for _, p := range tx.Positions {
		if base, ok := t.base[p.Stream]; !ok || p.Offset >= base {
			return false
		}
	}
	return len(tx.Positions) > 0
}

// applyTxn records a committed transaction.
func (t *tracker) applyTxn(tx Txn) {
	t.mu.Lock()
	reach := map[string]int64{}
	for _, p := range tx.Positions {
		reach[p.Stream] = max(reach[p.Stream], p.Offset)
	}
	t.applied[tx.ID] = reach
	t.mu.Unlock()
	t.done(tx.Positions)
}

// checkpoint computes the current resume offsets and trims what no
// redelivery can bring back.
func (t *tracker) checkpoint() Checkpoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	cp := Checkpoint{Resume: map[string]int64{}}
	for name, st := range t.streams {
		i := 0
		for i < len(st.pending) && st.done[st.pending[i]] {
			delete(st.done, st.pending[i])
			i++
		}
		st.pending = st.pending[i:]
		if len(st.pending) > 0 {
			cp.Resume[name] = st.pending[0]
		} else {
			cp.Resume[name] = st.next
		}
	}
	for id, reach := range t.applied {
		keep := false
		for s, off := range reach {
			keep = keep || off >= cp.Resume[s]
		}
		if !keep {
			delete(t.applied, id)
			continue
		}
		cp.Applied = append(cp.Applied, AppliedTxn{ID: id, Max: reach})
	}
	return cp
}

// CheckpointStore persists checkpoints.
type CheckpointStore interface {
	Load() (Checkpoint, error)
	Save(Checkpoint) error
}

// FileCheckpoints keeps the checkpoint in one JSON file, replaced by
// write-to-temp, fsync and rename.
type FileCheckpoints struct{ Path string }

// Load reads the checkpoint; a missing file is an empty checkpoint.
func (f FileCheckpoints) Load() (Checkpoint, error) {
	data, err := os.ReadFile(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return Checkpoint{}, nil
	}
	if err != nil {
		return Checkpoint{}, fmt.Errorf("sink: read checkpoint: %w", err)
	}
	var cp Checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return Checkpoint{}, fmt.Errorf("sink: checkpoint %s is corrupt: %w", f.Path, err)
	}
	return cp, nil
}

// Save replaces the checkpoint durably.
func (f FileCheckpoints) Save(cp Checkpoint) error {
	data, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	if err := durable.WriteFile(f.Path, data); err != nil {
		return fmt.Errorf("sink: save checkpoint: %w", err)
	}
	return nil
}
