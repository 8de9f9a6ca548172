package server

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/mirror"
	"github.com/retinadb/retina/internal/replay"
)

// Storage GC, the node's part: a loop rewrites the files whose versions
// are mostly stale (and combines small ones) in the background, the next
// replay checkpoint switches the rewritten file in while replay is
// quiesced, and once that checkpoint is durable and no query can read the
// old files any more, they are dropped. See package replay for the steps.

// StorageGCConfig tunes storage GC.
type StorageGCConfig struct {
	// Interval is how often the files are examined (default 2s: a look is
	// cheap, and a hot table's stale versions pile up fast; negative turns
	// storage GC off).
	Interval time.Duration
	// StaleShare is the share of a file's versions that must be stale
	// (deleted below every running query's snapshot) before it is
	// rewritten (default 0.5).
	StaleShare float64
	// Duty is the share of one core a rewrite may take (default 0.5): the
	// rest is left to replay and queries.
	Duty float64
}

func (c *StorageGCConfig) defaults() {
	if c.Interval == 0 {
		c.Interval = 2 * time.Second
	}
	if c.StaleShare <= 0 || c.StaleShare > 1 {
		c.StaleShare = 0.5
	}
	if c.Duty <= 0 || c.Duty > 1 {
		c.Duty = 0.5
	}
}

// GCStats count storage GC's work.
type GCStats struct {
	Rewrites, FilesRewritten, FilesDropped, VersionsDropped, EarlySeals, Errors atomic.Uint64
	BytesReclaimed                                                              atomic.Int64
}

// storageGC is the node's storage-GC state.
type storageGC struct {
	mu       sync.Mutex
	ready    []*replay.Rewritten // written, waiting for a checkpoint to switch them in
	switched []switched          // switched in, old files waiting to be dropped
	busy     map[uint64]bool     // files in a rewrite, ready or switched
	durable  uint64              // timestamp of the newest durable checkpoint
	stats    GCStats
	// lastRewrite is when a rewrite of each table was last switched in.
	lastRewrite map[uint32]time.Time
}

type switched struct {
	ts  uint64 // the checkpoint that took the switch
	old []*catalog.File
}

// GCStats counts storage GC's work so far.
func (n *Node) GCStats() *GCStats { return &n.gc.stats }

// RunStorageGC rewrites stale and small files until ctx ends.
func (n *Node) RunStorageGC(ctx context.Context) {
	cfg := n.Config.StorageGC
	if cfg.Interval < 0 {
		return
	}
	wait := cfg.Interval
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if err := n.StorageGCRound(ctx); err != nil && ctx.Err() == nil {
			n.gc.stats.Errors.Add(1)
			n.log.Warn("storage GC round failed; the next one tries again", "err", err)
		}
		// While there is work (a rewrite waiting for its switch, files
		// waiting to be dropped), look again soon; else at the interval.
		wait = cfg.Interval
		if n.GCPending() || n.gcDropsWaiting() {
			wait = min(wait, time.Second)
		}
	}
}

func (n *Node) gcDropsWaiting() bool {
	n.gc.mu.Lock()
	defer n.gc.mu.Unlock()
	return len(n.gc.switched) > 0
}

// StorageGCRound drops the files replaced earlier that nothing needs any
// more, then rewrites the most worthwhile files, if any; the next replay
// checkpoint switches the rewrite in.
func (n *Node) StorageGCRound(ctx context.Context) error {
	return errors.Join(n.dropRetired(ctx), n.sealStaleFilling(ctx), n.rewriteDue(ctx))
}

// sealStaleFilling ends early every virtual file still receiving rows whose
// versions went stale while it filled (a hot table's file is mostly old
// versions of the same few rows long before it is full): sealed, it is
// combined into a regular file, which the next rounds rewrite.
func (n *Node) sealStaleFilling(ctx context.Context) error {
	w, err := n.Txn.Watermarks(ctx)
	if err != nil {
		return err
	}
	at := n.gcBound(w.LWM)
	capacity := int64(n.Config.BlockRows) * int64(n.Config.FileBlocks)
	counter := &staleCounter{at: at}
	for _, rp := range n.Replayers {
		for _, b := range rp.Buffers() {
			id, rows, ok := b.Filling()
			if !ok || int64(rows) < mostlyStaleMinRows(capacity) {
				continue
			}
			vis, ok := rp.FileVisibility(id)
			if !ok {
				continue
			}
			stale, err := counter.countAtBound(vis, 0, rows, n.gcBoundNow(ctx))
			if err != nil {
				return fmt.Errorf("file %d: %w", id, err)
			}
			if sealEarly(int64(rows), stale, capacity, n.Config.StorageGC.StaleShare) && b.SealFile(id) {
				n.gc.stats.EarlySeals.Add(1)
				n.log.Debug("storage GC sealed a stale virtual file early", "file", id, "rows", rows, "stale", stale)
			}
		}
	}
	return nil
}

// sealEarly is the policy for a virtual file still filling: seal it once a
// sixteenth of a file at least holds the rewrite threshold's share of stale
// versions, or earlier, from two blocks on, once it is mostly stale (a
// small table churning through inserts and deletes would otherwise fill a
// sixteenth of a file with versions many times its live rows). Smaller
// files would flood the lake with objects, each costing a rewrite.
func sealEarly(rows, stale, capacity int64, share float64) bool {
	switch {
	case rows >= capacity/16:
		return staleEnough(rows, stale, share)
	case rows >= mostlyStaleMinRows(capacity):
		return staleEnough(rows, stale, max(share, mostlyStale))
	}
	return false
}

// mostlyStale is the stale share that seals a small filling file.
const mostlyStale = 0.8

// mostlyStaleMinRows is the smallest filling file sealEarly seals: two
// blocks of the default shape (an eighth of a sixteenth of a file).
func mostlyStaleMinRows(capacity int64) int64 { return max(1, capacity/64) }

// staleEnough says stale of rows versions reach the rewrite threshold.
func staleEnough(rows, stale int64, share float64) bool {
	return rows > 0 && float64(stale) >= share*float64(rows)
}

// maxReady bounds the rewrites waiting for a checkpoint to switch them in.
const maxReady = 8

// rewriteDue rewrites the most worthwhile sets of files, one after the
// other, until none is left or maxReady wait for the next checkpoint to
// switch them in. Each is paced, so together they take no more of the
// cores than one.
func (n *Node) rewriteDue(ctx context.Context) error {
	for {
		n.gc.mu.Lock()
		full := len(n.gc.ready) >= maxReady
		n.gc.mu.Unlock()
		if full {
			return nil
		}
		did, err := n.rewriteOnce(ctx)
		if err != nil || !did {
			return err
		}
	}
}

// rewriteOnce rewrites the most worthwhile set of files, if any, and
// leaves it for the next checkpoint to switch in.
func (n *Node) rewriteOnce(ctx context.Context) (bool, error) {
	w, err := n.Txn.Watermarks(ctx)
	if err != nil {
		return false, err
	}
	at := n.gcBound(w.LWM)
	t, rp, files, err := n.pickRewrite(ctx, at)
	if err != nil || files == nil {
		return false, err
	}
	for _, f := range files {
		n.gc.mark(f.ID, true)
	}
	duty := n.Config.StorageGC.Duty
	pace := func(ctx context.Context, worked time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(float64(worked) * (1/duty - 1))):
			return nil
		}
	}
	rw, err := rp.Rewrite(ctx, t, files, at, pace)
	if err != nil {
		for _, f := range files {
			n.gc.mark(f.ID, false)
		}
		return false, fmt.Errorf("table %s: %w", t.Name, err)
	}
	n.log.Info("storage GC rewrote files", "table", t.Name, "files", len(files), "new_file", rw.New.ID,
		"versions_kept", rw.Rows, "versions_dropped", rw.Dropped, "at_ts", at)
	n.gc.mu.Lock()
	n.gc.ready = append(n.gc.ready, rw)
	n.gc.mu.Unlock()
	return true, nil
}

func (g *storageGC) mark(id uint64, busy bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy == nil {
		g.busy = map[uint64]bool{}
	}
	if busy {
		g.busy[id] = true
	} else {
		delete(g.busy, id)
	}
}

// fileStat is what the rewrite policy knows of a file.
type fileStat struct {
	id          uint64
	rows, stale int64
}

// chooseRewrite is the policy: among one table's regular files of one
// replayer, take the stalest files whose stale share reaches share, and
// fill up with files that are small (under half of capacity live) while
// the live rows fit in one file of capacity rows. It returns nothing
// unless a file is stale enough or at least two small files combine.
func chooseRewrite(files []fileStat, share float64, capacity int64) []uint64 {
	var cands []fileStat
	for _, f := range files {
		if f.rows > 0 && (staleEnough(f.rows, f.stale, share) || f.rows-f.stale < capacity/2) {
			cands = append(cands, f)
		}
	}
	slices.SortStableFunc(cands, func(a, b fileStat) int {
		// Stalest first (compare stale/rows without dividing), then oldest.
		if d := b.stale*a.rows - a.stale*b.rows; d != 0 {
			if d > 0 {
				return 1
			}
			return -1
		}
		return int(int64(a.id) - int64(b.id))
	})
	var pick []uint64
	live, anyStale := int64(0), false
	for _, f := range cands {
		if live+f.rows-f.stale > capacity {
			continue
		}
		live += f.rows - f.stale
		pick = append(pick, f.id)
		anyStale = anyStale || staleEnough(f.rows, f.stale, share)
	}
	if !anyStale && len(pick) < 2 {
		return nil
	}
	return pick
}

// pickRewrite finds the next files to rewrite, with their table and owner.
func (n *Node) pickRewrite(ctx context.Context, at uint64) (*catalog.Table, *replay.Replayer, []*catalog.File, error) {
	capacity := int64(n.Config.BlockRows) * int64(n.Config.FileBlocks)
	snap := n.Catalog.Snapshot()
	n.gc.mu.Lock()
	busy := copyBusy(n.gc.busy)
	n.gc.mu.Unlock()
	counter := &staleCounter{at: at}
	for _, t := range snap.Tables() {
		byOwner := map[uint32][]fileStat{}
		for _, f := range snap.LiveFiles(t.ID) {
			if f.State != catalog.Regular || busy[f.ID] || int(f.Replayer) >= len(n.Replayers) {
				continue
			}
			vis, ok := n.Replayers[f.Replayer].FileVisibility(f.ID)
			rows := int(f.Rows())
			if !ok || rows == 0 {
				continue
			}
			stale, err := counter.countAtBound(vis, 0, rows, n.gcBoundNow(ctx))
			if err != nil {
				return nil, nil, nil, fmt.Errorf("file %d of %s: %w", f.ID, t.Name, err)
			}
			byOwner[f.Replayer] = append(byOwner[f.Replayer], fileStat{id: f.ID, rows: int64(rows), stale: stale})
		}
		for owner, stats := range byOwner {
			ids := chooseRewrite(stats, n.Config.StorageGC.StaleShare, capacity)
			if ids == nil {
				continue
			}
			files := make([]*catalog.File, len(ids))
			for i, id := range ids {
				files[i], _ = snap.File(id)
			}
			return t, n.Replayers[owner], files, nil
		}
	}
	return nil, nil, nil, nil
}

func copyBusy(m map[uint64]bool) map[uint64]bool {
	out := make(map[uint64]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// countBits counts the set bits [bit, bit+n) of bm.
func countBits(bm []uint64, bit, n int) int64 {
	var c int
	for i := bit; i < bit+n; {
		w := bm[i/64] >> (i % 64)
		k := min(64-i%64, bit+n-i)
		if k < 64 {
			w &= 1<<k - 1
		}
		c += bits.OnesCount64(w)
		i += k
	}
	return int64(c)
}

// switchRewrites switches every rewritten file in: called by Seal, while
// nothing is applied, so the checkpoint at ts takes the switch. Every
// rewrite's catalog swap goes in one catalog change: replay waits for one
// durable write, not one per rewrite. A failure before that change
// abandons the rewrites it concerns; one after it leaves the replay state
// inconsistent, which stops ingestion (ErrUnclean) so the next start
// restores the last checkpoint.
func (n *Node) switchRewrites(ts uint64) error {
	n.gc.mu.Lock()
	ready := n.gc.ready
	n.gc.ready = nil
	n.gc.mu.Unlock()
	if len(ready) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := n.Txn.Watermarks(ctx)
	if err != nil {
		n.gc.mu.Lock()
		n.gc.ready = append(ready, n.gc.ready...)
		n.gc.mu.Unlock()
		return nil // the next checkpoint tries again
	}
	lwm := min(w.LWM, ts)
	var prepared []*replay.Rewritten
	var swaps []catalog.FileSwap
	for _, rw := range ready {
		sw, err := n.rewriteOwner(rw).PrepareSwitch(rw, lwm)
		if err != nil {
			n.abandonRewrite(ctx, rw, err)
			continue
		}
		prepared = append(prepared, rw)
		swaps = append(swaps, sw)
	}
	if len(swaps) == 0 {
		return nil
	}
	if _, err := n.Catalog.SwapAll(ctx, swaps); err != nil {
		for _, rw := range prepared {
			n.rewriteOwner(rw).AbandonSwitch(rw)
			n.abandonRewrite(ctx, rw, err)
		}
		return nil
	}
	n.Config.Failpoints.Hit(failpoint.GCSwapped)
	for _, rw := range prepared {
		if err := n.rewriteOwner(rw).FinishSwitch(ctx, rw); err != nil {
			return fmt.Errorf("%w: %w", mirror.ErrUnclean, err)
		}
		n.gc.stats.Rewrites.Add(1)
		n.gc.stats.FilesRewritten.Add(uint64(len(rw.Old)))
		n.gc.stats.VersionsDropped.Add(uint64(rw.Dropped))
		n.gc.mu.Lock()
		if n.gc.lastRewrite == nil {
			n.gc.lastRewrite = map[uint32]time.Time{}
		}
		n.gc.lastRewrite[rw.Table.ID] = time.Now()
		n.gc.switched = append(n.gc.switched, switched{ts: ts, old: rw.Old})
		n.gc.mu.Unlock()
	}
	return nil
}

// rewriteOwner is the replayer whose files a rewrite replaced.
func (n *Node) rewriteOwner(rw *replay.Rewritten) *replay.Replayer {
	return n.Replayers[rw.Old[0].Replayer]
}

// abandonRewrite gives up a rewrite that could not be switched in: its
// object goes and its files may be rewritten again.
func (n *Node) abandonRewrite(ctx context.Context, rw *replay.Rewritten, err error) {
	n.gc.stats.Errors.Add(1)
	n.log.Warn("storage GC: switch failed; the rewrite is abandoned", "table", rw.Table.Name, "new_file", rw.New.ID, "err", err)
	if rw.New.ID != 0 {
		if derr := n.Lake.Delete(ctx, rw.New.Key); derr != nil {
			n.log.Warn("storage GC: the abandoned file stays in the lake until the next start", "key", rw.New.Key, "err", derr)
		}
	}
	for _, f := range rw.Old {
		n.gc.mark(f.ID, false)
	}
}

// GCPending says a rewrite waits for a checkpoint to switch it in.
func (n *Node) GCPending() bool {
	n.gc.mu.Lock()
	defer n.gc.mu.Unlock()
	return len(n.gc.ready) > 0
}

// checkpointed records that the checkpoint at ts is durable.
func (n *Node) checkpointed(ts uint64) {
	n.gc.mu.Lock()
	n.gc.durable = max(n.gc.durable, ts)
	n.gc.mu.Unlock()
}

// dropRetired drops the files a switch replaced once the checkpoint that
// took it is durable (a restore no longer needs them) and every query that
// could have planned with them ended (LWM passed the switch).
func (n *Node) dropRetired(ctx context.Context) error {
	w, err := n.Txn.Watermarks(ctx)
	if err != nil {
		return err
	}
	n.gc.mu.Lock()
	var due []switched
	keep := n.gc.switched[:0]
	frozen, anyFrozen := n.Engine.OldestFrozen()
	for _, s := range n.gc.switched {
		// A checkpointed reader older than the switch plans with the
		// files it replaced.
		if s.ts <= n.gc.durable && w.LWM > s.ts && (!anyFrozen || frozen > s.ts) {
			due = append(due, s)
		} else {
			keep = append(keep, s)
		}
	}
	n.gc.switched = keep
	n.gc.mu.Unlock()
	var errs []error
	for i, s := range due {
		for _, f := range s.old {
			cur, ok := n.Catalog.Snapshot().File(f.ID)
			if !ok {
				continue
			}
			size, _ := n.Lake.Size(ctx, cur.Key)
			if err := n.Replayers[cur.Replayer].DropRetired(ctx, cur); err != nil {
				errs = append(errs, err)
				n.gc.mu.Lock()
				n.gc.switched = append(n.gc.switched, due[i:]...) // retried next round
				n.gc.mu.Unlock()
				return errors.Join(errs...)
			}
			n.gc.stats.FilesDropped.Add(1)
			n.gc.stats.BytesReclaimed.Add(size)
			n.gc.mark(f.ID, false)
		}
	}
	return nil
}
