// Package txntest checks any txn.Service implementation against the MVCC
// rules with concurrent writers, queries and an observer.
package txntest

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/txn"
)

// CheckInvariants runs writers that begin and commit (out of order, some
// abandoned), queries that begin and end, and an observer, all at once, and
// fails the test if a snapshot covers a timestamp nobody committed, LWM
// passes a running query, or a watermark moves backwards. The work is
// counted, not timed: writers do their rounds, and the queries and the
// observer go on until the writers are done and they did theirs, however
// slow the machine is.
func CheckInvariants(t *testing.T, s txn.Service) {
	rounds, queryRounds, checkRounds := 300, 400, 50
	if testing.Short() {
		rounds, queryRounds, checkRounds = 80, 100, 20
	}
	const maxTS = 1 << 24
	// Set just before CommitMirror/AbandonMirror.
	finishing := make([]atomic.Bool, maxTS)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var endMu sync.RWMutex
	var running sync.Map // handle → snapshot, for queries known to run
	var wg, writing sync.WaitGroup
	var commits, queries, checks atomic.Int64
	fail := func(format string, args ...any) {
		t.Errorf(format, args...)
		cancel()
	}
	writersDone := make(chan struct{})
	more := func(did, want int) bool {
		if ctx.Err() != nil {
			return false
		}
		select {
		case <-writersDone:
			return did < want
		default:
			return true
		}
	}
	for w := range 4 {
		writing.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var held []uint64
			for round := 0; round < rounds && ctx.Err() == nil; round++ {
				r, err := s.BeginMirror(ctx, 1+rng.IntN(64))
				if err != nil {
					if ctx.Err() == nil {
						fail("begin: %v", err)
					}
					break
				}
				for i := range r.N {
					held = append(held, r.First+uint64(i))
				}
				if r.Last() >= maxTS {
					break
				}
				rng.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
				// Finish a random part now, keep the rest for later.
				k := rng.IntN(len(held) + 1)
				batch := held[:k]
				for _, ts := range batch {
					finishing[ts].Store(true)
				}
				// Finishing is not cancelled with the test's context: a
				// cancelled commit has an unknown outcome.
				if rng.IntN(10) == 0 {
					err = s.AbandonMirror(context.Background(), batch...)
				} else {
					err = s.CommitMirror(context.Background(), batch...)
				}
				if err != nil {
					fail("finish: %v", err)
					return
				}
				commits.Add(int64(k))
				held = append(held[:0], held[k:]...)
			}
			for _, ts := range held {
				if ts < maxTS {
					finishing[ts].Store(true)
				}
			}
			if err := s.CommitMirror(context.Background(), held...); err != nil {
				fail("final commit: %v", err)
			}
		})
	}
	go func() { writing.Wait(); close(writersDone) }()
	for range 4 {
		wg.Go(func() {
			var verified uint64 // every ts ≤ verified was seen being finished
			for did := 0; more(did, queryRounds); did++ {
				q, err := s.BeginQuery(ctx)
				if err != nil {
					if ctx.Err() == nil {
						fail("begin query: %v", err)
					}
					return
				}
				// Admission: every ts ≤ snapshot was being finished.
				for ; verified < min(q.Snapshot, maxTS-1); verified++ {
					if !finishing[verified+1].Load() {
						fail("snapshot %d covers uncommitted ts %d", q.Snapshot, verified+1)
						return
					}
				}
				running.Store(q.Handle, q.Snapshot)
				queries.Add(1)
				endMu.RLock()
				running.Delete(q.Handle)
				err = s.EndQuery(context.Background(), q.Handle)
				endMu.RUnlock()
				if err != nil {
					fail("end query: %v", err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		var lastHWM, lastLWM uint64
		for did := 0; more(did, checkRounds); did++ {
			endMu.Lock()
			oldest := uint64(1<<63 - 1)
			running.Range(func(_, v any) bool {
				oldest = min(oldest, v.(uint64))
				return true
			})
			w, err := s.Watermarks(ctx)
			endMu.Unlock()
			if err != nil {
				if ctx.Err() == nil {
					fail("watermarks: %v", err)
				}
				return
			}
			if w.LWM > oldest {
				fail("LWM %d passed running snapshot %d", w.LWM, oldest)
			}
			if w.HWM < lastHWM || w.LWM < lastLWM {
				fail("watermarks went back: HWM %d→%d LWM %d→%d", lastHWM, w.HWM, lastLWM, w.LWM)
			}
			if w.LWM >= w.HWM {
				fail("LWM %d not below HWM %d", w.LWM, w.HWM)
			}
			lastHWM, lastLWM = w.HWM, w.LWM
			checks.Add(1)
		}
	})
	writing.Wait()
	wg.Wait()
	if t.Failed() {
		return
	}
	// Every caller has returned; a remote service may still be undoing
	// begins whose callers were cancelled, so rest must come, not be there.
	var w txn.Watermarks
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if w, err = s.Watermarks(context.Background()); err != nil {
			t.Fatal(err)
		}
		if w.HWM == w.Next && w.LWM == w.HWM-1 && w.Running == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not at rest 10s after the last caller returned: %+v (want HWM = next, LWM = HWM−1, nothing running)", w)
		}
	}
	t.Logf("%d commits, %d queries, %d observations, final %+v", commits.Load(), queries.Load(), checks.Load(), w)
}
