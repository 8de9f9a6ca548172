package server_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPostgresMillionRowTransaction: one PostgreSQL transaction of a
// million rows is applied whole (no snapshot sees part of it) without the
// sink holding it: the source sends it at its commit, the sink proposes it
// in parts as it arrives, and the heap grows by a small multiple of what
// the same rows take when they come in small transactions.
func TestPostgresMillionRowTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("a million rows through PostgreSQL and Retina: not in -short")
	}
	_, dsn, pg := startPostgres(t)
	exec(t, pg, `CREATE TABLE big (id int PRIMARY KEY, a int, b text)`, `INSERT INTO big VALUES (0, 0, 'before')`)
	r := startRetina(t, t.TempDir(), dsn+"&slot=big")
	defer r.close(t)
	retina := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	caughtUp(t, r, pg, retina)
	exec(t, pg, `CREATE TABLE small (id int PRIMARY KEY, a int, b text)`)
	// The heap a million rows take when they come in transactions of 4000
	// rows (each whole, below a part) is the yardstick: a transaction of a
	// million rows must not take much more than its rows do.
	smallGrowth := peakGrowth(t, func() {
		exec(t, pg, `DO $$ BEGIN FOR k IN 0..249 LOOP
			INSERT INTO small SELECT i, i, 'row number ' || i FROM generate_series(k * 4000 + 1, k * 4000 + 4000) i; COMMIT; END LOOP; END $$`)
		caughtUp(t, r, pg, retina)
	})
	// Whole or nothing: a reader never sees part of it.
	reader := connect(t, "postgres://retina@"+r.srv.SQLAddr()+"/retina?sslmode=disable")
	partial := make(chan int64, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		seen := int64(-1)
		for {
			select {
			case <-stop:
				partial <- seen
				return
			default:
			}
			var n int64
			if err := reader.QueryRow(context.Background(), "SELECT count(*) FROM big").Scan(&n); err == nil && n != 1 && n != 1000001 {
				seen = n
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	bigGrowth := peakGrowth(t, func() {
		exec(t, pg, `INSERT INTO big SELECT i, i, 'row number ' || i FROM generate_series(1, 1000000) i`)
		caughtUp(t, r, pg, retina)
	})
	close(stop)
	wg.Wait()
	if n := <-partial; n >= 0 {
		t.Errorf("a snapshot saw %d rows of the transaction: half of it", n)
	}
	sameTables(t, pg, retina, map[string]string{"big": "SELECT count(*), sum(a)::bigint, max(b) FROM big"})
	// Holding the transaction whole took about 2 GB of heap here (eight
	// times what its rows take). In parts, with the replayers' undo records
	// beyond a bound spilled to disk, it takes what its rows take in the
	// index and the write buffer (the peak also has the garbage the heap
	// may hold, which grows with the live heap the first phase left).
	t.Logf("peak heap growth: %d MB for 1M rows in 250 transactions, %d MB for 1M rows in one", smallGrowth>>20, bigGrowth>>20)
	if bigGrowth > smallGrowth*2+(128<<20) {
		t.Errorf("one transaction of a million rows grew the heap by %d MB, the same rows in small transactions by %d MB", bigGrowth>>20, smallGrowth>>20)
	}
}

// peakGrowth runs f and returns how far the heap grew above where it
// started, sampled every 20 ms.
func peakGrowth(t *testing.T, f func()) int64 {
	t.Helper()
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	f()
	close(stop)
	wg.Wait()
	return int64(peak.Load()) - int64(base.HeapAlloc)
}
