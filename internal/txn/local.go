package txn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
)

// ErrFenced reports that another service raised the shared reserved bound:
// this one may no longer hand out timestamps.
var ErrFenced = errors.New("txn: fenced: another transaction service owns the timestamp store")

// DefaultReserveSize is how many timestamps one durable reservation covers.
const DefaultReserveSize = 1 << 20

// maxGroup bounds one group begin.
const maxGroup = 1 << 20

// Options configure a Local service.
type Options struct {
	ReserveSize uint64 // timestamps per reservation; DefaultReserveSize when 0
	Logger      *slog.Logger
}

// Local is the in-process transaction service. It is safe for concurrent use.
type Local struct {
	store       Store
	reserveSize uint64
	log         *slog.Logger

	mu        sync.Mutex // allocation, commits, HWM waiters
	win       commitWindow
	reserved  uint64 // durable bound: nothing ≥ it handed out
	reserving bool   // a reservation is in flight
	reserveCh chan struct{}
	reserveEr error // last failed reservation, reported to the next caller
	fenced    bool
	closed    bool
	hwmCh     chan struct{} // closed when HWM moves, if anyone waits
	waiters   int
	abandoned uint64

	hwm        atomic.Uint64 // mirror of win.hwm for lock-free readers
	closedFlag atomic.Bool   // mirror of closed for the query paths

	qmu     sync.Mutex // running queries and LWM
	queries map[uint64]uint64
	counts  map[uint64]int // snapshot → running queries
	order   []uint64       // snapshots with queries, increasing; ended ones linger behind the oldest running
	ended   int            // entries of order whose queries all ended
	handles uint64

	bg sync.WaitGroup
}

// NewLocal opens the service on store: it loads the reserved bound, starts
// handing out timestamps from there and reserves its first range.
func NewLocal(ctx context.Context, store Store, opts Options) (*Local, error) {
	if opts.ReserveSize == 0 {
		opts.ReserveSize = DefaultReserveSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	// Take the store over: load the bound and raise it. A service still
	// running on the same store makes the raise conflict; try again from the
	// new bound, which fences that service at its next reservation.
	var bound, next uint64
	for attempt := 0; ; attempt++ {
		var err error
		if bound, err = store.Load(ctx); err != nil {
			return nil, err
		}
		if bound > MaxTimestamp {
			return nil, fmt.Errorf("%w: stored bound %d", ErrExhausted, bound)
		}
		next = min(max(bound, 1)+opts.ReserveSize, MaxTimestamp+1)
		err = store.Raise(ctx, bound, next)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrConflict) || attempt == 4 {
			return nil, fmt.Errorf("txn: first reservation: %w", err)
		}
	}
	start := max(bound, 1)
	s := &Local{
		store:       store,
		reserveSize: opts.ReserveSize,
		log:         opts.Logger,
		win:         newCommitWindow(start),
		reserved:    next,
		hwmCh:       make(chan struct{}),
		queries:     map[uint64]uint64{},
		counts:      map[uint64]int{},
	}
	s.hwm.Store(start)
	s.log.Info("transaction service started", "hwm", start, "reserved", next)
	return s, nil
}

// BeginMirror hands out n consecutive timestamps.
func (s *Local) BeginMirror(ctx context.Context, n int) (Range, error) {
	if n <= 0 || n > maxGroup {
		return Range{}, fmt.Errorf("%w: group size %d (want 1..%d)", ErrInvalidArgument, n, maxGroup)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.win.next+uint64(n) > s.reserved {
		if err := s.usable(); err != nil {
			return Range{}, err
		}
		if s.win.next+uint64(n) > MaxTimestamp+1 {
			return Range{}, fmt.Errorf("%w: %d more after %d", ErrExhausted, n, s.win.next)
		}
		if s.reserveEr != nil {
			err := s.reserveEr
			s.reserveEr = nil
			return Range{}, err
		}
		ch := s.startReserve()
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			s.mu.Lock()
			return Range{}, ctx.Err()
		}
		s.mu.Lock()
	}
	if err := s.usable(); err != nil {
		return Range{}, err
	}
	first := s.win.allocate(n)
	if s.reserved-s.win.next < s.reserveSize/2 {
		s.startReserve() // top up ahead of need, off the hot path
	}
	return Range{First: first, N: n}, nil
}

func (s *Local) usable() error {
	switch {
	case s.closed:
		return ErrClosed
	case s.fenced:
		return ErrFenced
	}
	return nil
}

// startReserve launches a reservation unless one runs; it returns a channel
// closed when the running one finishes. Called with mu held.
func (s *Local) startReserve() <-chan struct{} {
	if s.reserving {
		return s.reserveCh
	}
	s.reserving = true
	s.reserveCh = make(chan struct{})
	prev := s.reserved
	next := min(max(s.reserved, s.win.next)+s.reserveSize, MaxTimestamp+1)
	s.bg.Go(func() {
		err := s.store.Raise(context.Background(), prev, next)
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case err == nil:
			s.reserved = next
		case errors.Is(err, ErrConflict):
			s.fenced = true
			s.log.Error("transaction service fenced", "err", err)
		default:
			s.reserveEr = err
			s.log.Warn("timestamp reservation failed", "err", err)
		}
		s.reserving = false
		close(s.reserveCh)
	})
	return s.reserveCh
}

// CommitMirror marks timestamps replayed and advances HWM.
func (s *Local) CommitMirror(_ context.Context, ts ...uint64) error {
	return s.finish(ts, false)
}

// AbandonMirror marks timestamps committed-empty.
func (s *Local) AbandonMirror(_ context.Context, ts ...uint64) error {
	return s.finish(ts, true)
}

func (s *Local) finish(ts []uint64, abandon bool) error {
	if len(ts) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.win.markDone(ts); err != nil {
		return err
	}
	if abandon {
		s.abandoned += uint64(len(ts))
	}
	if s.win.advance() {
		s.hwm.Store(s.win.hwm)
		if s.waiters > 0 {
			close(s.hwmCh)
			s.hwmCh = make(chan struct{})
		}
	}
	return nil
}

// BeginQuery registers a query at snapshot HWM − 1.
func (s *Local) BeginQuery(context.Context) (Query, error) {
	if s.closedFlag.Load() {
		return Query{}, ErrClosed
	}
	s.qmu.Lock()
	defer s.qmu.Unlock()
	// HWM is read under qmu so LWM, also computed under qmu, can never pass
	// a snapshot that is about to be registered.
	snap := s.hwm.Load() - 1
	s.handles++
	h := s.handles
	s.queries[h] = snap
	if s.counts[snap] == 0 {
		// snap is the newest snapshot: if it is in order, it is the last.
		if k := len(s.order); k > 0 && s.order[k-1] == snap {
			s.ended--
		} else {
			s.order = append(s.order, snap)
		}
	}
	s.counts[snap]++
	return Query{Snapshot: snap, Handle: h}, nil
}

// EndQuery unregisters a query.
func (s *Local) EndQuery(_ context.Context, handle uint64) error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	snap, ok := s.queries[handle]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownQuery, handle)
	}
	delete(s.queries, handle)
	if s.counts[snap]--; s.counts[snap] == 0 {
		delete(s.counts, snap)
		s.ended++
		i := 0
		for i < len(s.order) && s.counts[s.order[i]] == 0 {
			i++
		}
		s.order, s.ended = s.order[i:], s.ended-i
		switch {
		case len(s.order) == 0:
			s.order = nil // let the backing array go
		case s.ended > len(s.order)/2:
			// Short queries that end behind a long one would otherwise
			// pile up here until it ends.
			s.order = slices.DeleteFunc(slices.Clone(s.order), func(snap uint64) bool { return s.counts[snap] == 0 })
			s.ended = 0
		}
	}
	return nil
}

// Watermarks reads HWM, LWM and the allocation position. Reading changes
// nothing: LWM is the oldest running snapshot, or HWM − 1 when none runs,
// which never decreases because a new query's snapshot is HWM − 1, read
// under the same lock.
func (s *Local) Watermarks(context.Context) (Watermarks, error) {
	s.qmu.Lock()
	hwm := s.hwm.Load()
	low := hwm - 1
	if len(s.order) > 0 {
		low = s.order[0]
	}
	w := Watermarks{HWM: hwm, LWM: low, Running: len(s.queries)}
	s.qmu.Unlock()
	s.mu.Lock()
	w.Next = s.win.next
	s.mu.Unlock()
	return w, nil
}

// WaitHWM blocks until HWM > ts.
func (s *Local) WaitHWM(ctx context.Context, ts uint64) (Watermarks, error) {
	s.mu.Lock()
	for s.win.hwm <= ts {
		if s.closed {
			s.mu.Unlock()
			return Watermarks{}, ErrClosed
		}
		ch := s.hwmCh
		s.waiters++
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			s.mu.Lock()
			s.waiters--
			s.mu.Unlock()
			return Watermarks{}, ctx.Err()
		}
		s.mu.Lock()
		s.waiters--
	}
	s.mu.Unlock()
	return s.Watermarks(ctx)
}

// Abandoned is how many timestamps were abandoned since start.
func (s *Local) Abandoned() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.abandoned
}

// Close stops the service: later calls fail with ErrClosed and waiters wake.
// It waits for an in-flight reservation; it does not close the store.
func (s *Local) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		s.closedFlag.Store(true)
		close(s.hwmCh)
		s.hwmCh = make(chan struct{})
	}
	s.mu.Unlock()
	s.bg.Wait()
	return nil
}
