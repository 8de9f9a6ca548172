package visibility

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
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

// idle reports that every handed-out timestamp is committed.
func (m *mvcc) idle() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hwm == m.next
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

// TestConcurrentDeletesReadsAndGC runs writers appending out-of-order deletes
// of every tuple, eight readers checking bitmaps at random snapshots in
// [LWM, HWM) and a GC goroutine advancing LWM, all at once; every bitmap is
// checked. The run ends when the writers have deleted every tuple and each
// reader and the collector have done their share of rounds, however long
// that takes on the machine.
func TestConcurrentDeletesReadsAndGC(t *testing.T) {
	rounds := int64(400)
	if testing.Short() {
		rounds = 100
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

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var writing, wg sync.WaitGroup
	var checks, gcs atomic.Int64
	errc := make(chan error, writers+readers+1)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
		cancel()
	}
	// done tells a reader or the collector to stop: every tuple is deleted
	// and it did its rounds, or the test failed.
	done := func(did int64) bool {
		if ctx.Err() != nil {
			return true
		}
		return claimed.Load() >= rows && did >= rounds && m.idle()
	}

	for w := range writers {
		writing.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for ctx.Err() == nil {
				i := claimed.Add(1) - 1
				if i >= rows {
					return
				}
				ts := m.begin()
				off := uint32(perm[i])
				// Stagger so commits and deletes interleave out of order.
				for range rng.IntN(4) {
					runtime.Gosched()
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
			last := int64(-1)
			for did := int64(0); !done(did); did++ {
				// While writers run, check once per few of their deletes so
				// readers do not starve them.
				c := claimed.Load()
				if c < rows && c-last < 16 {
					did--
					runtime.Gosched()
					continue
				}
				last = c
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
		for did := int64(0); !done(did); did++ {
			g.Collect(m.advanceLWM())
			gcs.Add(1)
			time.Sleep(200 * time.Microsecond) // pacing only: leave the writers room
		}
	})
	writing.Wait()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	// Every tuple is deleted: the bitmap at the last timestamp is all ones.
	g.Collect(m.advanceLWM())
	dst := make([]uint64, g.BitmapWords())
	if err := g.Bitmap(m.hwm-1, dst); err != nil {
		t.Fatal(err)
	}
	for off := range rows {
		if dst[off/64]>>(off%64)&1 == 0 {
			t.Fatalf("offset %d not deleted at the end", off)
		}
	}
	t.Logf("%d deletes, %d checked bitmaps, %d collects", rows, checks.Load(), gcs.Load())
}

// TestConcurrentDuplicateDeletes: racing deletes of the same tuples while GC
// retires and rebuilds duplicate filters; exactly one delete of each tuple
// wins and every other is refused as a duplicate. GC follows a real low
// watermark (below every delete still in flight), so no delete is ever too
// old to be accepted.
func TestConcurrentDuplicateDeletes(t *testing.T) {
	const (
		rows    = 4096
		writers = 4
	)
	g := mustRowGroup(t, rows, WithTileSize(256))
	var wins [rows]atomic.Int32
	var dups atomic.Int64
	var ts atomic.Uint64
	// inflight[w] is a lower bound of the timestamp writer w is deleting
	// with, published before the timestamp is taken; MaxUint64 when idle.
	var inflight [writers]atomic.Uint64
	for w := range inflight {
		inflight[w].Store(math.MaxUint64)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var gcWG sync.WaitGroup
	gcWG.Go(func() {
		for ctx.Err() == nil {
			wm := ts.Load()
			for w := range inflight {
				wm = min(wm, inflight[w].Load())
			}
			g.Collect(wm)
		}
	})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 5))
			for _, off := range rng.Perm(rows) {
				inflight[w].Store(ts.Load())
				err := g.Delete(uint32(off), ts.Add(1))
				inflight[w].Store(math.MaxUint64)
				switch {
				case err == nil:
					wins[off].Add(1)
				case errors.Is(err, ErrAlreadyDeleted):
					dups.Add(1)
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
		if n := wins[off].Load(); n != 1 {
			t.Fatalf("offset %d: %d deletes accepted, want exactly 1", off, n)
		}
	}
	if want := int64((writers - 1) * rows); dups.Load() != want {
		t.Fatalf("%d deletes refused as duplicates, want %d", dups.Load(), want)
	}
}
