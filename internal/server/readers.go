package server

import (
	"context"
	"sync/atomic"
	"time"
)

// ReaderStats count visibility checkpoints of long-running readers.
type ReaderStats struct {
	Checkpoints, Errors atomic.Uint64
	FrozenBytes         atomic.Int64 // bitmaps the checkpointed readers hold now
}

// Readers counts the visibility checkpoints taken so far.
func (n *Node) Readers() *ReaderStats { return &n.readers }

// RunVisibilityCheckpoints checkpoints queries and read transactions older
// than the configured age until ctx ends, so a long reader never holds LWM
// (and with it memory GC, index purge and storage GC) back for longer.
func (n *Node) RunVisibilityCheckpoints(ctx context.Context) {
	age := n.Config.VisibilityCheckpointAfter
	if age <= 0 {
		return
	}
	every := max(min(age/4, 5*time.Second), 10*time.Millisecond)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		n.CheckpointReaders(ctx, age)
	}
}

// CheckpointReaders checkpoints the readers older than age now.
func (n *Node) CheckpointReaders(ctx context.Context, age time.Duration) {
	st, err := n.Engine.CheckpointOldViews(ctx, age)
	n.readers.Checkpoints.Add(uint64(st.Frozen))
	n.readers.FrozenBytes.Store(st.FrozenBytes)
	if err != nil && ctx.Err() == nil {
		n.readers.Errors.Add(1)
		n.log.Warn("visibility checkpoint failed; the reader keeps holding LWM until the next try", "err", err)
	}
}

// RunHistory keeps the SQL sessions' time-travel history (query_history)
// until ctx ends.
func (n *Node) RunHistory(ctx context.Context) {
	if n.Config.QueryHistory <= 0 {
		return
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if err := n.Engine.TickHistory(ctx, time.Now()); err != nil && ctx.Err() == nil {
			n.log.Warn("time-travel history: a tick failed; the next one retries", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
