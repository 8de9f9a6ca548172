package txn

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"testing"
	"time"
)

func newTestLocal(t testing.TB, store Store, reserve uint64) *Local {
	t.Helper()
	s, err := NewLocal(t.Context(), store, Options{ReserveSize: reserve, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func openFileStore(t testing.TB, dir string) *FileStore {
	t.Helper()
	fs, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	return fs
}

func TestHWMMovesOverGapFreePrefix(t *testing.T) {
	ctx := t.Context()
	s := newTestLocal(t, openFileStore(t, t.TempDir()), 16)
	r, err := s.BeginMirror(ctx, 5)
	if err != nil || r.First != 1 || r.N != 5 {
		t.Fatalf("first range %+v, %v", r, err)
	}
	hwm := func() uint64 {
		w, _ := s.Watermarks(ctx)
		return w.HWM
	}
	if err := s.CommitMirror(ctx, 3, 2); err != nil {
		t.Fatal(err)
	}
	if hwm() != 1 {
		t.Fatalf("HWM %d passed uncommitted ts 1", hwm())
	}
	if err := s.AbandonMirror(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if hwm() != 4 {
		t.Fatalf("HWM %d, want 4", hwm())
	}
	q, _ := s.BeginQuery(ctx)
	if q.Snapshot != 3 {
		t.Fatalf("snapshot %d, want 3", q.Snapshot)
	}
	if err := s.CommitMirror(ctx, 5, 4); err != nil {
		t.Fatal(err)
	}
	w, _ := s.Watermarks(ctx)
	if w.HWM != 6 || w.LWM != 3 || w.Running != 1 {
		t.Fatalf("watermarks %+v, want HWM 6 LWM 3 running 1", w)
	}
	if err := s.EndQuery(ctx, q.Handle); err != nil {
		t.Fatal(err)
	}
	if w, _ = s.Watermarks(ctx); w.LWM != 5 {
		t.Fatalf("idle LWM %d, want HWM−1 = 5", w.LWM)
	}
	// Ranges beyond the reservation size force further reservations.
	for range 10 {
		r, err := s.BeginMirror(ctx, 7)
		if err != nil {
			t.Fatal(err)
		}
		ts := make([]uint64, r.N)
		for i := range ts {
			ts[i] = r.First + uint64(i)
		}
		if err := s.CommitMirror(ctx, ts...); err != nil {
			t.Fatal(err)
		}
	}
	if w, _ = s.Watermarks(ctx); w.HWM != 76 || w.Next != 76 {
		t.Fatalf("after 70 more: %+v", w)
	}
}

func TestBadUse(t *testing.T) {
	ctx := t.Context()
	s := newTestLocal(t, openFileStore(t, t.TempDir()), 100)
	r, _ := s.BeginMirror(ctx, 3)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"commit never allocated", s.CommitMirror(ctx, r.Last()+1), ErrNotAllocated},
		{"commit zero", s.CommitMirror(ctx, 0), ErrNotAllocated},
		{"repeat within one call", s.CommitMirror(ctx, 2, 2), ErrAlreadyCommitted},
		{"end unknown query", s.EndQuery(ctx, 42), ErrUnknownQuery},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.err, c.want)
		}
	}
	// The failed calls changed nothing: 2 is still uncommitted.
	if err := s.CommitMirror(ctx, 1, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitMirror(ctx, 2); !errors.Is(err, ErrAlreadyCommitted) {
		t.Errorf("double commit above HWM: %v", err)
	}
	if err := s.CommitMirror(ctx, 1); !errors.Is(err, ErrAlreadyCommitted) {
		t.Errorf("double commit below HWM: %v", err)
	}
	if err := s.AbandonMirror(ctx, 2); !errors.Is(err, ErrAlreadyCommitted) {
		t.Errorf("abandon of a committed ts: %v", err)
	}
	// A failing multi-timestamp commit leaves no partial marks.
	if err := s.CommitMirror(ctx, 3, 99); !errors.Is(err, ErrNotAllocated) {
		t.Fatalf("mixed commit: %v", err)
	}
	if err := s.CommitMirror(ctx, 3); err != nil {
		t.Fatalf("ts 3 marked by a failed call: %v", err)
	}
	q, _ := s.BeginQuery(ctx)
	if err := s.EndQuery(ctx, q.Handle); err != nil {
		t.Fatal(err)
	}
	if err := s.EndQuery(ctx, q.Handle); !errors.Is(err, ErrUnknownQuery) {
		t.Errorf("second EndQuery: %v", err)
	}
	for _, n := range []int{0, -1, maxGroup + 1} {
		if _, err := s.BeginMirror(ctx, n); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("BeginMirror(%d): %v", n, err)
		}
	}
	s.Close()
	if _, err := s.BeginMirror(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("after close: %v", err)
	}
	if _, err := s.BeginQuery(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("query after close: %v", err)
	}
}

func TestWaitHWM(t *testing.T) {
	ctx := t.Context()
	s := newTestLocal(t, openFileStore(t, t.TempDir()), 100)
	r, _ := s.BeginMirror(ctx, 2)
	done := make(chan Watermarks, 1)
	go func() {
		w, err := s.WaitHWM(ctx, r.Last())
		if err != nil {
			t.Error(err)
		}
		done <- w
	}()
	// The waiter is registered and blocked before the commits start.
	for waiting := false; !waiting; {
		s.mu.Lock()
		waiting = s.waiters == 1
		s.mu.Unlock()
		runtime.Gosched()
	}
	// Committing the later timestamp alone does not move HWM past it, and a
	// waiter returns only once HWM is past its timestamp (the watermarks it
	// returns are read after that): a wake-up on this commit would return
	// with HWM ≤ r.Last() below.
	s.CommitMirror(ctx, r.Last())
	if w, _ := s.Watermarks(ctx); w.HWM > r.Last() {
		t.Fatalf("HWM %d passed %d with %d uncommitted", w.HWM, r.Last(), r.First)
	}
	s.CommitMirror(ctx, r.First)
	select {
	case w := <-done:
		if w.HWM <= r.Last() {
			t.Fatalf("woke with HWM %d", w.HWM)
		}
	case <-time.After(time.Minute):
		t.Fatal("WaitHWM did not wake")
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := s.WaitHWM(short, 1000); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait past deadline: %v", err)
	}
}

// TestShortQueriesBehindALongOneLeaveNothing: while one query stays open,
// many short ones at ever newer snapshots begin and end; what the service
// keeps for them stays bounded, and LWM stays at the long one's snapshot
// until it ends.
func TestShortQueriesBehindALongOneLeaveNothing(t *testing.T) {
	ctx := t.Context()
	s := newTestLocal(t, openFileStore(t, t.TempDir()), 1024)
	long, err := s.BeginQuery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var open []Query
	for i := range 5000 {
		r, err := s.BeginMirror(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.CommitMirror(ctx, r.First); err != nil {
			t.Fatal(err)
		}
		q, err := s.BeginQuery(ctx)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, q)
		if i%3 != 0 { // end most at once, some a little later
			for _, q := range open {
				if err := s.EndQuery(ctx, q.Handle); err != nil {
					t.Fatal(err)
				}
			}
			open = open[:0]
		}
		s.qmu.Lock()
		kept := len(s.order)
		s.qmu.Unlock()
		if kept > 8 {
			t.Fatalf("after %d short queries the service keeps %d snapshots", i+1, kept)
		}
		if w, _ := s.Watermarks(ctx); w.LWM != long.Snapshot {
			t.Fatalf("LWM %d, want the long query's snapshot %d", w.LWM, long.Snapshot)
		}
	}
	for _, q := range append(open, long) {
		if err := s.EndQuery(ctx, q.Handle); err != nil {
			t.Fatal(err)
		}
	}
	if w, _ := s.Watermarks(ctx); w.LWM != w.HWM-1 || w.Running != 0 {
		t.Fatalf("with nothing running: %+v", w)
	}
}
