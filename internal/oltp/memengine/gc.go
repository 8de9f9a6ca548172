package memengine

import "time"

// Version GC. Old versions are unlinked when a record gets a new one: the
// chain is cut below the newest version at or below the prune bound, the
// oldest snapshot any transaction may still read. Records not written keep
// what they have (at most the versions written since the bound passed).
//
// The bound comes from tsorder.Readers: transactions register their
// snapshot at Begin and release it when they finish; Begin refuses a
// snapshot below the horizon (the transaction fails with
// ErrSnapshotUnavailable, a retryable error). The horizon lags one GC pass
// (100 ms by default) behind the watermark.

// gcPass advances the horizon and the prune bound.
func (e *Engine) gcPass() { e.readers.Advance(e.clock.Visible()) }

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
