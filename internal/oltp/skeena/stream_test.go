package skeena

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"testing"

	"github.com/retinadb/retina/internal/oltp/engine"
)

// TestCommitStreamPrefixesAreConsistent moves money between accounts in
// both engines from several goroutines, each transaction attaching its
// writes. Applying the stream in delivery order must keep the total at
// every step (each prefix is a state a snapshot could read: no
// transaction half-applied, no engine's order broken) and end equal to the
// store.
func TestCommitStreamPrefixesAreConsistent(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir(), func(o *Options) { o.Stream = true })
	defer s.Close()
	const accounts, start = 6, 100
	key := func(i int) (table, k string) {
		if i%2 == 0 {
			return "m", "a" + strconv.Itoa(i)
		}
		return "d", "a" + strconv.Itoa(i)
	}
	type write struct{ table, key, val string }
	seedTx := s.Begin()
	var seedWrites []write
	for i := range accounts {
		tb, k := key(i)
		mustPut(t, seedTx, tb, k, strconv.Itoa(start))
		seedWrites = append(seedWrites, write{tb, k, strconv.Itoa(start)})
	}
	seedTx.Attach(seedWrites)
	mustCommit(t, seedTx)

	model := map[string]int{}
	total := func() int {
		n := 0
		for _, v := range model {
			n += v
		}
		return n
	}
	const workers, perWorker = 4, 150
	var wg sync.WaitGroup
	var committed sync.Map
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < perWorker; i++ {
				a, b := rng.Intn(accounts), rng.Intn(accounts)
				if a == b {
					continue
				}
				tx := s.Begin()
				ta, ka := key(a)
				tb, kb := key(b)
				va, vb := mustGet(t, tx, ta, ka), mustGet(t, tx, tb, kb)
				x, _ := strconv.Atoi(va)
				y, _ := strconv.Atoi(vb)
				amt := rng.Intn(10)
				ws := []write{{ta, ka, strconv.Itoa(x - amt)}, {tb, kb, strconv.Itoa(y + amt)}}
				err := tx.Put(ctx, ta, []byte(ka), []byte(ws[0].val))
				if err == nil {
					err = tx.Put(ctx, tb, []byte(kb), []byte(ws[1].val))
				}
				if err == nil {
					tx.Attach(ws)
					err = tx.Commit(ctx)
				}
				if err != nil {
					tx.Rollback()
					if !engine.Retryable(err) {
						t.Error(err)
						return
					}
					continue
				}
				committed.Store(fmt.Sprint(w, i), true)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	n, want := 0, -1
	for want < 0 || n < want {
		select {
		case <-done:
			want = 1
			committed.Range(func(_, _ any) bool { want++; return true })
			done = nil
			continue
		case c, ok := <-s.Commits():
			if !ok {
				t.Fatalf("stream closed: %v", s.StreamErr())
			}
			for _, w := range c.Payload.([]write) {
				v, _ := strconv.Atoi(w.val)
				model[w.table+"/"+w.key] = v
			}
			n++
			if n > 1 && total() != accounts*start {
				t.Fatalf("after %d commits (last %s) the stream's total is %d, want %d", n, c, total(), accounts*start)
			}
		}
	}
	tx := s.Begin()
	defer tx.Rollback()
	for i := range accounts {
		tb, k := key(i)
		if got := mustGet(t, tx, tb, k); got != strconv.Itoa(model[tb+"/"+k]) {
			t.Errorf("%s/%s: store %s, stream %d", tb, k, got, model[tb+"/"+k])
		}
	}
}

// TestStopStreamHoldsNothing: a consumer that goes away stops the stream;
// the store keeps committing, holds none of those commits, and Commits
// closes with the reason.
func TestStopStreamHoldsNothing(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Stream = true })
	defer s.Close()
	commit := func(i int) {
		tx := s.Begin()
		mustPut(t, tx, "m", "k"+strconv.Itoa(i), "v")
		mustPut(t, tx, "d", "k"+strconv.Itoa(i), "v")
		tx.Attach(i)
		mustCommit(t, tx)
	}
	commit(0)
	if c := <-s.Commits(); c.Payload != 0 {
		t.Fatalf("first streamed commit carries %v, want 0", c.Payload)
	}
	gone := fmt.Errorf("consumer gone")
	s.StopStream(gone)
	for i := 1; i <= 50; i++ {
		commit(i)
	}
	for c := range s.Commits() {
		t.Fatalf("commit %v delivered after StopStream", c.Payload)
	}
	if err := s.StreamErr(); err != gone {
		t.Fatalf("StreamErr = %v, want the reason given to StopStream", err)
	}
	s.stream.mu.Lock()
	held := s.stream.merger.Pending()
	s.stream.mu.Unlock()
	if held != 0 {
		t.Fatalf("the stopped stream holds %d commits", held)
	}
	s.StopStream(nil) // a second stop is harmless
}
