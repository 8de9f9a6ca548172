package tsorder

import (
	"sync"
	"sync/atomic"
)

// Readers decides how far version GC may go: it counts running readers
// per snapshot and keeps a horizon below which new readers are refused.
//
// Each GC pass (Advance) first publishes, as the horizon, the visible mark
// it was given on the previous pass, held at or below the oldest
// registered snapshot, then reads the registered snapshots again: a reader
// registering concurrently either sees the new horizon or is seen by the
// read. The bound, below which no reader can ever look, is the smaller of
// the horizon and the oldest registered snapshot. Because the horizon lags
// one pass behind the watermark, a reader that registers within one pass
// of choosing its snapshot is never refused; because it never passes a
// registered reader, a reader at or above a running one (or a pin, which
// is a reader that reads nothing) is not refused either, short of a
// registration racing a pass (a retryable refusal, never a wrong read).
type Readers struct {
	next    atomic.Uint32
	shards  [16]readerShard
	horizon atomic.Uint64
	bound   atomic.Uint64
	pending uint64 // the GC pass's caller only
}

type readerShard struct {
	mu sync.Mutex
	m  map[uint64]int32
	_  [40]byte // keep shards on separate cache lines
}

// Reader is a registration; Release it when the reader finishes.
type Reader struct {
	snap  uint64
	shard uint8
}

// Register records a reader at snap. ok is false when snap is below the
// horizon: the reader must not read (and still must Release).
func (r *Readers) Register(snap uint64) (rd Reader, ok bool) {
	i := uint8(r.next.Add(1) % uint32(len(r.shards)))
	sh := &r.shards[i]
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = make(map[uint64]int32)
	}
	sh.m[snap]++
	sh.mu.Unlock()
	return Reader{snap: snap, shard: i}, snap >= r.horizon.Load()
}

// Release ends a registration.
func (r *Readers) Release(rd Reader) {
	sh := &r.shards[rd.shard]
	sh.mu.Lock()
	if sh.m[rd.snap]--; sh.m[rd.snap] <= 0 {
		delete(sh.m, rd.snap)
	}
	sh.mu.Unlock()
}

// Horizon is the snapshot below which readers are refused.
func (r *Readers) Horizon() uint64 { return r.horizon.Load() }

// Bound is the snapshot below which no reader looks: versions older than
// the newest one at or below it may go.
func (r *Readers) Bound() uint64 { return r.bound.Load() }

// Advance is one GC pass given the current visible mark; it returns the
// new bound. Calls must not overlap.
func (r *Readers) Advance(visible uint64) uint64 {
	if h := r.Oldest(r.pending); h > r.horizon.Load() {
		r.horizon.Store(h)
	}
	b := r.Oldest(r.horizon.Load())
	if b > r.bound.Load() {
		r.bound.Store(b)
	}
	r.pending = visible
	return r.bound.Load()
}

// Oldest is the oldest snapshot registered now, or none when no reader is
// registered.
func (r *Readers) Oldest(none uint64) uint64 {
	oldest := none
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for s := range sh.m {
			oldest = min(oldest, s)
		}
		sh.mu.Unlock()
	}
	return oldest
}
