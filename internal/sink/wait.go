package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/retinadb/retina/internal/mirror"
)

// ErrStopped is returned to a wait the sink can no longer satisfy.
var ErrStopped = errors.New("sink: stopped")

// waiter is one WaitApplied call.
type waiter struct {
	source int
	stream string
	off    int64
	done   chan error
}

// waiters are the pending WaitApplied calls, which the driver wakes, and
// the watched streams' resume offsets, which it publishes.
type waiters struct {
	mu      sync.Mutex
	list    []*waiter
	stopped bool
	watched map[streamKey]int64
	// positions are the sources' committed offsets by stream, copied at
	// most every positionsEvery (release runs for every Ready).
	positions   []map[string]int64
	positionsAt time.Time
}

const positionsEvery = 100 * time.Millisecond

type streamKey struct {
	source int
	stream string
}

// Watch makes Applied report a stream's progress.
func (s *Sink) Watch(source int, stream string) {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	if s.waits.watched == nil {
		s.waits.watched = map[streamKey]int64{}
	}
	if _, ok := s.waits.watched[streamKey{source, stream}]; !ok {
		s.waits.watched[streamKey{source, stream}] = -1
	}
	s.wake()
}

// Applied is where a watched stream resumes: every message before it is
// committed. ok is false before the stream has delivered anything.
func (s *Sink) Applied(source int, stream string) (off int64, ok bool) {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	off, ok = s.waits.watched[streamKey{source, stream}]
	return off, ok && off >= 0
}

// Positions is, for every source, the highest offset of each stream a
// committed transaction carried.
func (s *Sink) Positions() []map[string]int64 {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	return s.waits.positions
}

// WaitApplied returns once every message of the source's stream before off
// is committed (or set aside for good), so a query snapshot taken after it
// returns includes those transactions.
func (s *Sink) WaitApplied(ctx context.Context, source int, stream string, off int64) error {
	if source < 0 || source >= len(s.cfg.Sources) {
		return fmt.Errorf("sink: no source %d", source)
	}
	w := &waiter{source: source, stream: stream, off: off, done: make(chan error, 1)}
	s.waits.mu.Lock()
	if s.waits.stopped {
		s.waits.mu.Unlock()
		return ErrStopped
	}
	s.waits.list = append(s.waits.list, w)
	s.waits.mu.Unlock()
	s.wake()
	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
		s.waits.mu.Lock()
		s.waits.list = slices.DeleteFunc(s.waits.list, func(x *waiter) bool { return x == w })
		s.waits.mu.Unlock()
		return ctx.Err()
	}
}

// wake asks the driver to check the waiters now (a new one may already be
// satisfied).
func (s *Sink) wake() {
	select {
	case s.wakeup <- struct{}{}:
	default:
	}
}

// release ends the waits the core's progress satisfies; on the driver's
// goroutine.
func (s *Sink) release(core *mirror.Core) {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	if now := time.Now(); now.Sub(s.waits.positionsAt) >= positionsEvery {
		s.waits.positions, s.waits.positionsAt = core.Positions(), now
	}
	for k := range s.waits.watched {
		if off, ok := core.Resume(k.source, k.stream); ok {
			s.waits.watched[k] = off
		}
	}
	if len(s.waits.list) == 0 {
		return
	}
	s.waits.list = slices.DeleteFunc(s.waits.list, func(w *waiter) bool {
		if off, ok := core.Resume(w.source, w.stream); ok && off >= w.off {
			w.done <- nil
			return true
		}
		return false
	})
}

// stopWaits fails every pending and later wait.
func (s *Sink) stopWaits() {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	s.waits.stopped = true
	for _, w := range s.waits.list {
		w.done <- ErrStopped
	}
	s.waits.list = nil
}
