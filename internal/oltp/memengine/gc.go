package memengine

import (
	"sync"
	"sync/atomic"
	"time"
)

// Version GC. Old versions are unlinked when a record gets a new one: the
// chain is cut below the newest version at or below the prune bound, the
// oldest snapshot any transaction may still read. Records not written keep
// what they have (at most the versions written since the bound passed).
//
// The bound comes from the snapshots of running transactions (registered
// at Begin, released when they finish) and a horizon: Begin refuses a
// snapshot below the horizon (the transaction fails with
// ErrSnapshotUnavailable, a retryable error). Each GC pass first publishes
// the visible mark it saw on the previous pass as the new horizon, then
// reads the registry: a transaction registering concurrently either sees
// the new horizon or is seen by the read. The horizon lags one pass (100
// ms by default) behind the watermark, so a transaction that begins within
// that time of choosing its snapshot is never refused.

// snapRegistry counts running transactions per snapshot, in shards so
// Begin and finish rarely contend.
type snapRegistry struct {
	next   atomic.Uint32
	shards [16]snapShard
}

type snapShard struct {
	mu sync.Mutex
	m  map[uint64]int32
	_  [40]byte // keep shards on separate cache lines
}

func (r *snapRegistry) add(snap uint64) uint8 {
	i := uint8(r.next.Add(1) % uint32(len(r.shards)))
	sh := &r.shards[i]
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = make(map[uint64]int32)
	}
	sh.m[snap]++
	sh.mu.Unlock()
	return i
}

func (r *snapRegistry) remove(i uint8, snap uint64) {
	sh := &r.shards[i]
	sh.mu.Lock()
	if sh.m[snap]--; sh.m[snap] <= 0 {
		delete(sh.m, snap)
	}
	sh.mu.Unlock()
}

// min is the oldest registered snapshot (ok false: none).
func (r *snapRegistry) min() (m uint64, ok bool) {
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for s := range sh.m {
			if !ok || s < m {
				m, ok = s, true
			}
		}
		sh.mu.Unlock()
	}
	return m, ok
}

// gcPass advances the horizon and the prune bound.
func (e *Engine) gcPass() {
	h := e.nextHorizon
	if h > e.horizon.Load() {
		e.horizon.Store(h)
	}
	bound := e.horizon.Load()
	if m, ok := e.active.min(); ok && m < bound {
		bound = m
	}
	if bound > e.pruneBound.Load() {
		e.pruneBound.Store(bound)
	}
	e.nextHorizon = e.clock.Visible()
}

func (e *Engine) gcLoop() {
	defer close(e.gcDone)
	if e.gcInterval < 0 {
		<-e.gcStop
		return
	}
	tick := time.NewTicker(e.gcInterval)
	defer tick.Stop()
	for {
		select {
		case <-e.gcStop:
			return
		case <-tick.C:
			e.gcPass()
		}
	}
}

// prune unlinks the versions of r no snapshot at or above bound can read.
func (r *record) prune(bound uint64) {
	for v := r.head.Load(); v != nil; v = v.next.Load() {
		if v.cts <= bound {
			v.next.Store(nil)
			return
		}
	}
}

// versions counts r's chain (tests).
func (r *record) versions() int {
	n := 0
	for v := r.head.Load(); v != nil; v = v.next.Load() {
		n++
	}
	return n
}
