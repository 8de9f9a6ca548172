package writebuffer

import "sync/atomic"

// CombineLimit bounds how many files a node's buffers combine at once.
// A combination is seconds of CPU (reading blocks, Parquet encoding);
// several tables filling files together would otherwise take every core
// and stall replay behind them, which readers see as stale snapshots.
// With fewer slots than cores, ingest keeps the rest.
type CombineLimit struct {
	slots   chan struct{}
	waiting atomic.Int64
}

// NewCombineLimit allows n combinations at once (at least one).
func NewCombineLimit(n int) *CombineLimit {
	return &CombineLimit{slots: make(chan struct{}, max(n, 1))}
}

// Waiting is how many combinations wait for a slot: a backlog that keeps
// growing means files fill faster than the slots combine them.
func (l *CombineLimit) Waiting() int64 {
	if l == nil {
		return 0
	}
	return l.waiting.Load()
}

// acquire waits for a slot; a nil limit has slots for all.
func (l *CombineLimit) acquire() {
	if l == nil {
		return
	}
	l.waiting.Add(1)
	l.slots <- struct{}{}
	l.waiting.Add(-1)
}

func (l *CombineLimit) release() {
	if l != nil {
		<-l.slots
	}
}
