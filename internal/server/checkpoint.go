package server

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/checkpoint"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/writebuffer"
)

// Replay checkpoints, the write side. The sink quiesces (nothing in
// flight, every transaction up to ts committed and none above) and calls
// Seal, which only seals the write buffers and records which files exist
// with how many rows: the state at ts. Dispatch then goes on while Write
// waits for the sealed blocks to be durable, takes every file's deleted
// set at ts (memory GC is held at or below ts meanwhile, so it is exact),
// and replaces the checkpoint. Rows and deletes that come after ts are not
// in it; a restore drops them.

// Sealed is the replay state captured at one timestamp, on its way to disk.
type Sealed struct {
	n        *Node
	manifest *checkpoint.Manifest
	buffers  []*writebuffer.Sealed
	clean    bool
	// snap is the catalog at the seal and sealed its time: with the
	// deleted sets, what an Iceberg publication of the state needs.
	snap   *catalog.Snapshot
	sealed time.Time
	// publishNow publishes the state before Write returns (a clean stop's
	// last checkpoint) instead of handing it to the publisher's loop.
	publishNow bool
}

// Seal captures the state at ts. The caller keeps every write away while
// it runs (the sink is quiesced).
func (n *Node) Seal(ts uint64) (*Sealed, error) {
	if err := n.switchRewrites(ts); err != nil {
		return nil, err
	}
	n.pinGC(ts)
	st := &Sealed{n: n, manifest: &checkpoint.Manifest{TS: ts, Buckets: n.Config.Buckets, Replayers: n.Config.Replayers}, sealed: time.Now()}
	virtual := map[uint64]int{} // file → rows sealed
	for _, rp := range n.Replayers {
		for _, b := range rp.Buffers() {
			s := b.Seal()
			st.buffers = append(st.buffers, s)
			for id, rows := range s.Files {
				virtual[id] = rows
			}
		}
	}
	// Taken after sealing: a file the buffers no longer hold is regular by
	// now (a combination marks it regular before the buffer forgets it).
	snap := n.Catalog.Snapshot()
	st.snap = snap
	for _, t := range snap.Tables() {
		for _, f := range snap.LiveFiles(t.ID) {
			rows, isVirtual := virtual[f.ID]
			if isVirtual && rows == 0 {
				continue // every row it will hold comes after ts
			}
			if !isVirtual && f.State == catalog.Virtual {
				n.unpinGC()
				return nil, fmt.Errorf("server: checkpoint: file %d of %s is virtual, but no write buffer holds it", f.ID, t.Name)
			}
			if int(f.Replayer) >= len(n.Replayers) {
				n.unpinGC()
				return nil, fmt.Errorf("server: checkpoint: file %d belongs to replayer %d of %d", f.ID, f.Replayer, len(n.Replayers))
			}
			vis, ok := n.Replayers[f.Replayer].FileVisibility(f.ID)
			if !ok {
				n.unpinGC()
				return nil, fmt.Errorf("server: checkpoint: replayer %d does not hold the visibility of file %d", f.Replayer, f.ID)
			}
			cf := checkpoint.File{ID: f.ID, Table: t.ID, Replayer: f.Replayer, Virtual: isVirtual, Capacity: vis.Rows()}
			if isVirtual {
				cf.Rows = int64(rows)
			} else {
				cf.Rows = f.Rows()
			}
			st.manifest.Files = append(st.manifest.Files, cf)
		}
	}
	return st, nil
}

// Write makes the sealed state and the sources' resume points durable.
func (s *Sealed) Write(ctx context.Context, sources []checkpoint.Source) error {
	n := s.n
	vis, deleted, err := s.deletes()
	n.unpinGC()
	if err != nil {
		return err
	}
	for _, b := range s.buffers {
		if err := b.Wait(ctx); err != nil {
			return fmt.Errorf("server: checkpoint: wait for sealed blocks: %w", err)
		}
	}
	n.Config.Failpoints.Hit(failpoint.CheckpointBeforeVis)
	m := s.manifest
	m.Sources, m.Clean = sources, s.clean
	n.ckptMu.Lock()
	defer n.ckptMu.Unlock()
	if err := n.ckpts.Write(m, vis); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if n.Iceberg != nil {
		// Offered before GC learns the checkpoint is durable: the files
		// the state names stay until it is published or superseded.
		st := icebergState(m, s.snap, s.sealed, deleted)
		st.Final = s.clean
		if s.publishNow {
			if err := n.Iceberg.Publish(ctx, st); err != nil {
				n.log.Warn("could not publish the last checkpoint to Iceberg; the next start publishes it", "snapshot_ts", m.TS, "err", err)
			}
		} else {
			n.Iceberg.Offer(st)
		}
	}
	n.checkpointed(m.TS)
	return nil
}

// deletes encodes every file's deleted set at the checkpoint's timestamp,
// for the files that have any, and returns the sets themselves too.
func (s *Sealed) deletes() (map[uint64][]byte, map[uint64][]uint64, error) {
	out := map[uint64][]byte{}
	sets := map[uint64][]uint64{}
	for _, f := range s.manifest.Files {
		rg, ok := s.n.Replayers[f.Replayer].FileVisibility(f.ID)
		if !ok {
			return nil, nil, fmt.Errorf("server: checkpoint: visibility of file %d is gone", f.ID)
		}
		cp, err := rg.Checkpoint(s.manifest.TS)
		if err != nil {
			return nil, nil, fmt.Errorf("server: checkpoint: deletes of file %d at %d: %w", f.ID, s.manifest.TS, err)
		}
		if !slices.ContainsFunc(cp.Bitmap, func(w uint64) bool { return w != 0 }) {
			continue
		}
		data, err := cp.MarshalBinary()
		if err != nil {
			return nil, nil, err
		}
		out[f.ID] = data
		sets[f.ID] = cp.Bitmap
	}
	return out, sets, nil
}

// pinGC keeps memory GC at or below ts until unpinGC, so the deleted sets
// at ts can still be taken exactly.
func (n *Node) pinGC(ts uint64) { n.gcPin.Store(ts + 1) }

func (n *Node) unpinGC() { n.gcPin.Store(0) }

// gcBoundNow reads how far memory GC may collect at the moment.
func (n *Node) gcBoundNow(ctx context.Context) func() (uint64, error) {
	return func() (uint64, error) {
		w, err := n.Txn.Watermarks(ctx)
		if err != nil {
			return 0, err
		}
		return n.gcBound(w.LWM), nil
	}
}

// gcBound caps a low watermark by the pin.
func (n *Node) gcBound(lwm uint64) uint64 {
	if p := n.gcPin.Load(); p != 0 {
		return min(lwm, p-1)
	}
	return lwm
}
