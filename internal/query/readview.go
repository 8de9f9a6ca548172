package query

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/visibility"
)

// readView is what a statement, or an explicit transaction, reads at: a
// snapshot registered with the transaction service, which holds LWM, until
// it is checkpointed. A visibility checkpoint (the paper's) materializes
// the deleted bitmaps of every file at the snapshot and pins the catalog
// state they describe; the snapshot is then released, so LWM, memory GC and
// index purge move on, while the view keeps reading exactly what it read
// before. Storage GC keeps the files such a view names (OldestFrozen).
type readView struct {
	ts     uint64
	handle uint64
	began  time.Time

	mu     sync.RWMutex // held shared while a scan reads visibility; freeze takes it
	frozen *frozenState
	ended  bool
}

// frozenState is a checkpointed view: the catalog it plans with and each
// file's deleted bitmap at the snapshot.
type frozenState struct {
	catalog *catalog.Snapshot
	deleted map[uint64][]uint64
	bytes   int64
}

// catalogFor is the catalog a statement of the view plans with: the pinned
// one once frozen (rewritten files would miss versions deleted after the
// snapshot), else the current one.
func (v *readView) catalogFor(c Catalog) *catalog.Snapshot {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.frozen != nil {
		return v.frozen.catalog
	}
	return c.Snapshot()
}

// DeletedRange is the scan's visibility read: the deleted bits of rows
// [offset, offset+rows) of a file at the view's snapshot, from the frozen
// bitmap once there is one, else from the file's visibility structure,
// which stays exact while the snapshot is registered (the shared lock keeps
// a freeze from releasing it mid-read).
func (v *readView) DeletedRange(file uint64, vis *visibility.RowGroup, offset, rows int, buf []uint64) ([]uint64, int, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.frozen != nil {
		bm, ok := v.frozen.deleted[file]
		if !ok {
			return nil, 0, fmt.Errorf("query: file %d is not in the checkpointed snapshot %d", file, v.ts)
		}
		if bm == nil { // no row of the file is visible at the snapshot
			return allDeleted(buf, rows), 0, nil
		}
		// A copy: the caller reuses what it gets as its next buffer.
		lo, hi := offset/64, min((offset+rows+63)/64, len(bm))
		return append(buf[:0], bm[lo:hi]...), offset % 64, nil
	}
	return vis.BitmapRange(v.ts, offset, rows, buf)
}

// isFrozen reports a checkpointed view.
func (v *readView) isFrozen() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.frozen != nil
}

// readViews tracks the engine's read views, for checkpoints and GC.
type readViews struct {
	mu  sync.Mutex
	all map[*readView]struct{}
}

// begin registers a new view at HWM − 1.
func (e *Engine) beginView(ctx context.Context) (*readView, error) {
	q, err := e.cfg.Txn.BeginQuery(ctx)
	if err != nil {
		return nil, err
	}
	v := &readView{ts: q.Snapshot, handle: q.Handle, began: time.Now()}
	e.readers.add(v)
	return v, nil
}

// add tracks a view until endView.
func (r *readViews) add(v *readView) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.all == nil {
		r.all = map[*readView]struct{}{}
	}
	r.all[v] = struct{}{}
}

// endView ends a view: its snapshot, unless a checkpoint released it, and
// its frozen bitmaps. It is idempotent.
func (e *Engine) endView(ctx context.Context, v *readView) error {
	v.mu.Lock()
	if v.ended {
		v.mu.Unlock()
		return nil
	}
	v.ended = true
	frozen := v.frozen != nil
	v.frozen = nil
	v.mu.Unlock()
	e.readers.mu.Lock()
	delete(e.readers.all, v)
	e.readers.mu.Unlock()
	if frozen {
		return nil
	}
	return e.cfg.Txn.EndQuery(context.WithoutCancel(ctx), v.handle)
}

// CheckpointStats describe the visibility checkpoints taken.
type CheckpointStats struct {
	Frozen      int   // views checkpointed now
	FrozenBytes int64 // their bitmaps' memory
}

// CheckpointOldViews checkpoints every view older than age (statements and
// explicit transactions alike) so it stops holding LWM back.
func (e *Engine) CheckpointOldViews(ctx context.Context, age time.Duration) (CheckpointStats, error) {
	var st CheckpointStats
	e.readers.mu.Lock()
	var old []*readView
	for v := range e.readers.all {
		if time.Since(v.began) >= age {
			old = append(old, v)
		}
	}
	e.readers.mu.Unlock()
	for _, v := range old {
		done, err := e.freeze(ctx, v)
		if err != nil {
			return st, err
		}
		if done {
			st.Frozen++
		}
	}
	e.readers.mu.Lock()
	for v := range e.readers.all {
		v.mu.RLock()
		if v.frozen != nil {
			st.FrozenBytes += v.frozen.bytes
		}
		v.mu.RUnlock()
	}
	e.readers.mu.Unlock()
	return st, nil
}

// freeze checkpoints one view: it reports false when the view ended or was
// frozen already.
func (e *Engine) freeze(ctx context.Context, v *readView) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ended || v.frozen != nil {
		return false, nil
	}
	fs, err := e.frozenAt(v.ts)
	if err != nil {
		return false, err
	}
	v.frozen = fs
	if err := e.cfg.Txn.EndQuery(context.WithoutCancel(ctx), v.handle); err != nil {
		v.frozen = nil
		return false, fmt.Errorf("query: checkpoint of snapshot %d: %w", v.ts, err)
	}
	e.log.Info("visibility checkpoint: a long-running reader no longer holds LWM",
		"snapshot", v.ts, "age", time.Since(v.began).Round(time.Second), "files", len(fs.deleted), "bitmap_bytes", fs.bytes)
	return true, nil
}

// frozenAt materializes the deleted bitmaps of every file at snapshot ts,
// which must be at or above LWM while it runs.
func (e *Engine) frozenAt(ts uint64) (*frozenState, error) {
	// Every file the catalog still has, retired ones included: a statement
	// running now may have planned with a file a rewrite replaced since.
	snap := e.cfg.Catalog.Snapshot()
	fs := &frozenState{catalog: snap, deleted: map[uint64][]uint64{}}
	for _, t := range snap.Tables() {
		for _, f := range snap.Files(t.ID) {
			vis, err := e.cfg.Scanner.Visibility(f)
			if err != nil {
				// Its owner does not hold it (yet): a virtual file gets its
				// visibility before its first row, so it had no row then,
				// and every row it gets later is newer than the snapshot.
				fs.deleted[f.ID] = nil
				continue
			}
			bm, bit, err := vis.BitmapRange(ts, 0, vis.Rows(), nil)
			if err != nil {
				return nil, fmt.Errorf("query: checkpoint of snapshot %d: file %d of %s: %w", ts, f.ID, t.Name, err)
			}
			if bit != 0 {
				return nil, fmt.Errorf("query: checkpoint of snapshot %d: file %d: bitmap starts at bit %d", ts, f.ID, bit)
			}
			fs.deleted[f.ID] = bm
			fs.bytes += int64(len(bm)) * 8
		}
	}
	return fs, nil
}

// OldestFrozen is the oldest snapshot of a checkpointed view, if any:
// storage GC must keep the files a switch after it replaced.
func (e *Engine) OldestFrozen() (uint64, bool) {
	e.readers.mu.Lock()
	defer e.readers.mu.Unlock()
	var oldest uint64
	found := false
	for v := range e.readers.all {
		if v.isFrozen() && (!found || v.ts < oldest) {
			oldest, found = v.ts, true
		}
	}
	return oldest, found
}

// allDeleted is a bitmap of rows set bits in buf.
func allDeleted(buf []uint64, rows int) []uint64 {
	buf = buf[:0]
	for n := rows; n > 0; n -= 64 {
		buf = append(buf, ^uint64(0))
	}
	return buf
}
