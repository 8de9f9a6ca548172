package tsorder

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestWatermarkWaitsForEveryEarlierTimestamp(t *testing.T) {
	c := New(10)
	a, b, d := c.Next(), c.Next(), c.Next()
	if a != 11 || b != 12 || d != 13 {
		t.Fatalf("timestamps %d %d %d", a, b, d)
	}
	c.Finish(d)
	c.Finish(b)
	if got := c.Visible(); got != 10 {
		t.Fatalf("visible %d with 11 unfinished, want 10", got)
	}
	c.Finish(a)
	if got := c.Visible(); got != 13 {
		t.Fatalf("visible %d, want 13", got)
	}
}

func TestConcurrentFinishesReachTheLastTimestamp(t *testing.T) {
	c := New(0)
	const workers, each = 8, 5000
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				c.Finish(c.Next())
			}
		}()
	}
	wg.Wait()
	if got := c.Visible(); got != workers*each {
		t.Fatalf("visible %d, want %d", got, workers*each)
	}
}

func TestWaitsWakeOnTheirMark(t *testing.T) {
	c := New(0)
	ts := c.Next()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- c.WaitVisible(ctx, ts) }()
	go func() { errs <- c.WaitDurable(ctx, ts) }()
	c.Finish(ts)
	c.SetDurable(ts)
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	c.SetDurable(ts - 1)
	if c.Durable() != ts {
		t.Fatalf("durable mark went back to %d", c.Durable())
	}
	short, stop := context.WithCancel(context.Background())
	stop()
	if err := c.WaitVisible(short, ts+5); err == nil {
		t.Fatal("wait for an unreached mark returned without error on a cancelled context")
	}
}

func TestReadersBound(t *testing.T) {
	var r Readers
	old, ok := r.Register(5)
	if !ok {
		t.Fatal("a reader above a zero horizon was refused")
	}
	if b := r.Advance(10); b != 0 {
		t.Fatalf("first pass bound %d, want 0 (the horizon lags a pass)", b)
	}
	if b := r.Advance(20); b != 5 {
		t.Fatalf("bound %d with a reader at 5, want 5", b)
	}
	// The horizon is held at the reader at 5, though the mark passed it.
	if h := r.Horizon(); h != 5 {
		t.Fatalf("horizon %d with a reader at 5, want 5", h)
	}
	above, ok := r.Register(9)
	if !ok {
		t.Fatal("a reader at 9 was refused though the horizon is held at 5")
	}
	below, ok := r.Register(4)
	if ok {
		t.Fatal("a reader below the horizon 5 was admitted")
	}
	r.Release(old)
	if b := r.Advance(30); b != 5 {
		t.Fatalf("bound %d, want 5: the refused reader at 4 holds the horizon but the bound never goes back", b)
	}
	r.Release(below)
	if b := r.Advance(40); b != 9 {
		t.Fatalf("bound %d, want 9: the reader at 9 holds it", b)
	}
	r.Release(above)
	if b := r.Advance(50); b != 40 {
		t.Fatalf("bound %d with no reader, want the previous pass's mark 40", b)
	}
}
