package skeena

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/retinadb/retina/internal/oltp/engine"
)

// Recovery is the normal start path. Each engine recovers alone (memory:
// checkpoint and redo log; storage: Pebble's WAL) and lists its logged
// transactions that carry a tag. The store then decides, as a pure
// function of the two lists (decide), what to drop so that:
//
//   - a cross-engine transaction is in both engines or in neither: a tag
//     found in one engine only is dropped, unless the other engine already
//     folded it into a checkpoint (memory) or forgot its record (storage),
//     which both happen only once both halves are durable;
//   - nothing that read a dropped transaction survives: in the engine of a
//     dropped transaction every transaction whose snapshot is at or above
//     its commit timestamp is dropped too, and so is every transaction of
//     the other engine that read such a snapshot (tags 'r' and 'w'), to a
//     fixed point.
//
// Acknowledged transactions are never dropped: acknowledgement waits until
// everything they read is durable in both engines (Store.ack).
//
// Storage starts first: its drops are synced before the memory engine's
// checkpoint records its own, so a crash between the two repeats the same
// decision.

// decision is what recovery drops in each engine.
type decision struct {
	mem, disk engine.Discard
}

// decide computes the drops from the recovered lists. memBase is the
// memory checkpoint's timestamp, diskBase the storage engine's
// forgotten-through mark.
func decide(memRecs, diskRecs []engine.Recovered, memBase, diskBase uint64) (decision, error) {
	inMem := make(map[string]bool, len(memRecs))
	inDisk := make(map[string]bool, len(diskRecs))
	for _, r := range memRecs {
		inMem[string(r.Tag)] = true
	}
	for _, r := range diskRecs {
		inDisk[string(r.Tag)] = true
	}
	d := decision{mem: engine.Discard{Tags: map[string]bool{}}, disk: engine.Discard{Tags: map[string]bool{}}}
	m1, m2 := uint64(math.MaxUint64), uint64(math.MaxUint64) // lowest dropped commit per engine
	dropCross := func(tag []byte) {
		c1 := binary.BigEndian.Uint64(tag[1:9])
		c2 := binary.BigEndian.Uint64(tag[9:17])
		d.mem.Tags[string(tag)], d.disk.Tags[string(tag)] = true, true
		m1, m2 = min(m1, c1), min(m2, c2)
	}
	check := func(r engine.Recovered) error {
		if len(r.Tag) == 0 {
			return nil
		}
		switch r.Tag[0] {
		case tagCross, tagReadMemory, tagReadStorage:
			if len(r.Tag) == tagLen {
				return nil
			}
		}
		return fmt.Errorf("skeena: recovered transaction %d carries a malformed tag %x; the data directory is not Skeena's or is corrupt", r.CommitTS, r.Tag)
	}
	for _, r := range append(append([]engine.Recovered(nil), memRecs...), diskRecs...) {
		if err := check(r); err != nil {
			return d, err
		}
	}
	for _, r := range memRecs {
		if r.Tag[0] == tagCross && !inDisk[string(r.Tag)] && binary.BigEndian.Uint64(r.Tag[9:17]) > diskBase {
			dropCross(r.Tag)
		}
	}
	for _, r := range diskRecs {
		if r.Tag[0] == tagCross && !inMem[string(r.Tag)] && binary.BigEndian.Uint64(r.Tag[1:9]) > memBase {
			dropCross(r.Tag)
		}
	}
	for changed := true; changed; {
		changed = false
		pass := func(recs []engine.Recovered, own *engine.Discard, ownMin, otherMin *uint64, readsOther byte) {
			for _, r := range recs {
				if own.Tags[string(r.Tag)] {
					if r.CommitTS < *ownMin {
						*ownMin, changed = r.CommitTS, true
					}
					continue
				}
				drop := r.Snapshot >= *ownMin ||
					(r.Tag[0] == readsOther && binary.BigEndian.Uint64(r.Tag[1:9]) >= *otherMin)
				if !drop {
					continue
				}
				changed = true
				if r.Tag[0] == tagCross {
					dropCross(r.Tag)
				} else {
					own.Tags[string(r.Tag)] = true
					*ownMin = min(*ownMin, r.CommitTS)
				}
			}
		}
		pass(memRecs, &d.mem, &m1, &m2, tagReadStorage)
		pass(diskRecs, &d.disk, &m2, &m1, tagReadMemory)
	}
	if m1 != math.MaxUint64 {
		d.mem.FromSnapshot = m1
	}
	if m2 != math.MaxUint64 {
		d.disk.FromSnapshot = m2
	}
	return d, nil
}

func (s *Store) recover(ctx context.Context) error {
	d, err := decide(s.mem.Recovered(), s.disk.Recovered(), s.mem.CheckpointTS(), s.disk.ForgottenThrough())
	if err != nil {
		return err
	}
	if n := len(d.mem.Tags) + len(d.disk.Tags); n > 0 {
		s.logger.Info("skeena recovery drops transactions not durable in both engines (never acknowledged)",
			"memory_tags", len(d.mem.Tags), "storage_tags", len(d.disk.Tags),
			"memory_from_snapshot", d.mem.FromSnapshot, "storage_from_snapshot", d.disk.FromSnapshot)
	}
	if err := s.disk.Start(ctx, d.disk); err != nil {
		return fmt.Errorf("skeena: %w", err)
	}
	if err := s.mem.Start(ctx, d.mem); err != nil {
		return fmt.Errorf("skeena: %w", err)
	}
	return nil
}
