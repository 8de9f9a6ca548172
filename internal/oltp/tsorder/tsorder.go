// Package tsorder hands out an engine's commit timestamps and tracks two
// marks over them: the visible watermark (every timestamp at or below it is
// finished: committed and installed, or aborted) and the durable mark
// (every commit at or below it is on stable storage).
//
// Allocation is one atomic add; finishing is one atomic store into a ring
// slot plus a compare-and-swap walk that moves the watermark over finished
// slots. Nothing takes a lock unless someone waits for a mark.
package tsorder

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
)

// ringSize bounds how far allocation may run ahead of the watermark.
const ringSize = 1 << 16

// Clock is one engine's timestamp order.
type Clock struct {
	last    atomic.Uint64 // last timestamp handed out
	visible atomic.Uint64
	durable atomic.Uint64
	slots   [ringSize]atomic.Uint64

	waiters atomic.Int32
	mu      sync.Mutex
	changed chan struct{}
}

// New starts a clock whose timestamps so far end at last: all of them are
// finished and durable (the state recovery leaves behind).
func New(last uint64) *Clock {
	c := &Clock{changed: make(chan struct{})}
	c.last.Store(last)
	c.visible.Store(last)
	c.durable.Store(last)
	return c
}

// Next allocates a timestamp. Callers must Finish it.
func (c *Clock) Next() uint64 {
	ts := c.Reserve()
	c.WaitRoom(ts)
	return ts
}

// Reserve allocates a timestamp without waiting; the caller must WaitRoom
// before it Finishes it. Split from Next for callers that must publish the
// timestamp before they may block.
func (c *Clock) Reserve() uint64 { return c.last.Add(1) }

// WaitRoom waits until ts's ring slot is free: a timestamp far ahead of the
// watermark waits for it to move. Rare.
func (c *Clock) WaitRoom(ts uint64) {
	for ts-c.visible.Load() >= ringSize {
		runtime.Gosched()
	}
}

// Last is the last timestamp handed out.
func (c *Clock) Last() uint64 { return c.last.Load() }

// Finish marks ts finished (committed and installed, or aborted).
func (c *Clock) Finish(ts uint64) {
	c.slots[ts&(ringSize-1)].Store(ts)
	moved := false
	for {
		v := c.visible.Load()
		n := v + 1
		if c.slots[n&(ringSize-1)].Load() != n {
			break
		}
		if c.visible.CompareAndSwap(v, n) {
			moved = true
		}
	}
	if moved {
		c.broadcast()
	}
}

// Visible is the watermark: every timestamp ≤ it is finished.
func (c *Clock) Visible() uint64 { return c.visible.Load() }

// Durable is the durable mark.
func (c *Clock) Durable() uint64 { return c.durable.Load() }

// SetDurable raises the durable mark to ts (never lowers it).
func (c *Clock) SetDurable(ts uint64) {
	for {
		d := c.durable.Load()
		if ts <= d {
			return
		}
		if c.durable.CompareAndSwap(d, ts) {
			c.broadcast()
			return
		}
	}
}

// WaitVisible blocks until the watermark reaches ts.
func (c *Clock) WaitVisible(ctx context.Context, ts uint64) error {
	return c.wait(ctx, func() bool { return c.visible.Load() >= ts })
}

// WaitDurable blocks until the durable mark reaches ts.
func (c *Clock) WaitDurable(ctx context.Context, ts uint64) error {
	return c.wait(ctx, func() bool { return c.durable.Load() >= ts })
}

// Wait blocks until done() holds, checking again whenever either mark
// moves. poke (may be nil) runs before each sleep, for a driver that must
// be nudged to move a mark; abort (may be nil) ends the wait with errAbort.
func (c *Clock) Wait(ctx context.Context, done func() bool, poke func(), abort <-chan struct{}, errAbort error) error {
	if done() {
		return nil
	}
	c.waiters.Add(1)
	defer c.waiters.Add(-1)
	for {
		c.mu.Lock()
		ch := c.changed
		c.mu.Unlock()
		if done() {
			return nil
		}
		if poke != nil {
			poke()
		}
		select {
		case <-ch:
		case <-abort:
			return errAbort
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *Clock) wait(ctx context.Context, done func() bool) error {
	return c.Wait(ctx, done, nil, nil, nil)
}

func (c *Clock) broadcast() {
	if c.waiters.Load() == 0 {
		return
	}
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}
