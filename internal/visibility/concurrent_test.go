package visibility

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// mvcc is a minimal model of the transaction service for the test: it hands
// out timestamps, tracks commits (HWM over the gap-free prefix) and running
// queries (LWM), as internal/txn does for real.
type mvcc struct {
	mu        sync.Mutex
	next      uint64          // next timestamp to hand out
	hwm       uint64          // every ts < hwm committed
	committed map[uint64]bool // committed above hwm
	running   map[uint64]int  // snapshot → running queries
	lwm       uint64
}

func newMVCC() *mvcc {
	return &mvcc{next: 1, hwm: 1, committed: map[uint64]bool{}, running: map[uint64]int{}}
}

func (m *mvcc) begin() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	ts := m.next
	m.next++
	return ts
}

func (m *mvcc) commit(ts uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.committed[ts] = true
	for m.committed[m.hwm] {
		delete(m.committed, m.hwm)
		m.hwm++
	}
}

// beginQuery picks a random snapshot in [LWM, HWM) and registers it.
func (m *mvcc) beginQuery(rng *rand.Rand) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.lwm + rng.Uint64N(m.hwm-m.lwm)
	m.running[s]++
	return s
}

func (m *mvcc) endQuery(s uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running[s]--; m.running[s] == 0 {
		delete(m.running, s)
	}
}

// advanceLWM moves LWM to the oldest running snapshot, or HWM−1.
func (m *mvcc) advanceLWM() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	low := m.hwm - 1
	for s := range m.running {
		low = min(low, s)
	}
	if low < m.lwm {
		panic("LWM would move backwards")
	}
	m.lwm = low
	return low
}

// TestConcurrentDeletesReadsAndGC runs writers appending out-of-order deletes,
// eight readers checking bitmaps at random snapshots in [LWM, HWM) and a GC
// goroutine advancing LWM, all at once; every bitmap is checked.
func TestConcurrentDeletesReadsAndGC(t *testing.T) {
	dur := 3 * time.Second
	if testing.Short() {
		dur = time.Second
	}
	const (
		rows    = 3*4096 + 500 // a few tiles so writers collide on them
		writers = 3
		readers = 8
	)
	g := mustRowGroup(t, rows)
	m := newMVCC()
	deletedAt := make([]atomic.Uint64, rows) // the oracle: written before commit
	var claimed atomic.Int64
	perm := rand.New(rand.NewPCG(3, 3)).Perm(rows)

	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	var checks, gcs atomic.Int64
	errc := make(chan error, writers+readers+1)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
		cancel()
	}

	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for ctx.Err() == nil {
				i := claimed.Add(1) - 1
				if i >= rows {
					return
				}
				ts := m.begin()
				off := uint32(perm[i])
				// Stagger so commits and deletes interleave out of order.
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(50)) * time.Microsecond)
				}
				deletedAt[off].Store(ts)
				if err := g.Delete(off, ts); err != nil {
					fail(err)
					return
				}
				if rng.IntN(16) == 0 {
					if err := g.Delete(off, ts+1); !errors.Is(err, ErrAlreadyDeleted) {
						fail(errors.New("duplicate delete not refused"))
						return
					}
				}
				m.commit(ts)
			}
		})
	}
	for r := range readers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 22))
			dst := make([]uint64, g.BitmapWords())
			want := make([]uint64, g.BitmapWords())
			for ctx.Err() == nil {
				s := m.beginQuery(rng)
				err := g.Bitmap(s, dst)
				if err == nil {
					clear(want)
					for off := range deletedAt {
						if d := deletedAt[off].Load(); d != 0 && d <= s {
							want[off/64] |= 1 << (off % 64)
						}
					}
					if diff := diffBitmaps(dst, want); diff != "" {
						err = fmt.Errorf("snapshot %d: %s", s, diff)
					}
				}
				m.endQuery(s)
				if err != nil {
					fail(err)
					return
				}
				checks.Add(1)
			}
		})
	}
	wg.Go(func() {
		for ctx.Err() == nil {
			g.Collect(m.advanceLWM())
			gcs.Add(1)
			time.Sleep(200 * time.Microsecond)
		}
	})
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if checks.Load() < 100 || gcs.Load() < 10 {
		t.Fatalf("too little work to mean anything: %d checks, %d collects", checks.Load(), gcs.Load())
	}
	t.Logf("%d deletes, %d checked bitmaps, %d collects", min(claimed.Load(), rows), checks.Load(), gcs.Load())
}

// TestConcurrentDuplicateDeletes: racing deletes of the same tuples while GC
// retires and rebuilds duplicate filters; exactly one delete of each wins.
func TestConcurrentDuplicateDeletes(t *testing.T) {
	const rows = 4096
	g := mustRowGroup(t, rows, WithTileSize(256))
	var wins [rows]atomic.Int32
	var ts atomic.Uint64
	ctx, cancel := context.WithCancel(context.Background())
	var gcWG sync.WaitGroup
	gcWG.Go(func() {
		for ctx.Err() == nil {
			// Everything handed out is applied in this test, so any
			// timestamp below the issued ones is a safe watermark only once
			// its delete returned; collect behind a conservative margin.
			if cur := ts.Load(); cur > 64 {
				g.Collect(cur - 64)
			}
		}
	})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 5))
			for _, off := range rng.Perm(rows) {
				err := g.Delete(uint32(off), ts.Add(1))
				switch {
				case err == nil:
					wins[off].Add(1)
				case errors.Is(err, ErrAlreadyDeleted), errors.Is(err, ErrBelowBase):
				default:
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	cancel()
	gcWG.Wait()
	for off := range wins {
		if n := wins[off].Load(); n > 1 {
			t.Fatalf("offset %d deleted %d times", off, n)
		}
	}
}
