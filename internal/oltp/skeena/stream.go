package skeena

import (
	"context"
	"sync"
	"time"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/streamorder"
)

// The commit stream. With Options.Stream on, every committing transaction
// that carries a payload (Tx.Attach) is added to a streamorder.Merger after
// its commit timestamps are assigned and before either can become visible;
// a driver goroutine advances the merger's marks to what each engine has
// both visible and durable and delivers the released commits, in one global
// order, on Store.Commits. A commit is delivered only once recovery can no
// longer drop it, so a consumer never shows what a crash would undo.

// commitStream is the store's side of the stream.
type commitStream struct {
	mu      sync.Mutex
	merger  streamorder.Merger
	stopped bool // by StopStream: commits are no longer held
	wake    chan struct{}
	quit    chan struct{} // closed by StopStream
	out     chan streamorder.Commit
	err     error // why the stream stopped
}

func newCommitStream() *commitStream {
	return &commitStream{wake: make(chan struct{}, 1), quit: make(chan struct{}), out: make(chan streamorder.Commit, 1024)}
}

// StreamBacklog is how many commits the stream holds that its consumer has
// not taken yet (ordered and waiting, and queued for delivery).
func (s *Store) StreamBacklog() int {
	if s.stream == nil {
		return 0
	}
	s.stream.mu.Lock()
	n := s.stream.merger.Pending()
	s.stream.mu.Unlock()
	return n + len(s.stream.out)
}

// add registers a committing transaction's timestamps and payload. Once
// the stream is stopped it holds nothing: a store whose consumer went away
// must not grow without bound.
func (cs *commitStream) add(c streamorder.Commit) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.stopped {
		return nil
	}
	return cs.merger.Add(c)
}

// StopStream stops the commit stream for the rest of this store's life,
// for a consumer that will not read it any more: held commits are dropped,
// later commits are not held, and Commits closes; StreamErr reports why
// (reason, unless the stream had already failed). The store itself keeps
// running. Only a store opened again streams again, and its consumer copies
// the store first, as every start does.
func (s *Store) StopStream(reason error) {
	cs := s.stream
	if cs == nil {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.stopped {
		return
	}
	cs.stopped = true
	cs.merger = streamorder.Merger{}
	if cs.err == nil {
		cs.err = reason
	}
	close(cs.quit)
}

func (cs *commitStream) poke() {
	select {
	case cs.wake <- struct{}{}:
	default:
	}
}

// Attach gives the transaction a payload that the commit stream delivers
// with its commit timestamps. A transaction without one is not streamed.
func (tx *Tx) Attach(payload any) { tx.payload = payload }

// Attached is the payload given to Attach, nil if none.
func (tx *Tx) Attached() any { return tx.payload }

// streamAdd adds the committing transaction to the stream; it is called
// between pre-commit and post-commit. A single-engine commit names the
// snapshot it read of the other engine (the one its read tag records), so
// that the stream never shows it without what it read.
func (tx *Tx) streamAdd(c1, c2 uint64) error {
	cs := tx.s.stream
	if cs == nil || tx.payload == nil {
		return nil
	}
	c := streamorder.Commit{Mem: c1, Storage: c2, Payload: tx.payload}
	switch {
	case c1 == 0 && tx.memUsed:
		c.ReadMem = tx.anchor
	case c2 == 0 && tx.disk != nil:
		c.ReadStorage = tx.storage
	}
	return cs.add(c)
}

// Commits delivers committed transactions with payloads in global commit
// order (nil unless Options.Stream). It closes when the store closes, the
// stream fails or StopStream stops it (StreamErr says why).
func (s *Store) Commits() <-chan streamorder.Commit {
	if s.stream == nil {
		return nil
	}
	return s.stream.out
}

// StreamErr is why the commit stream stopped, nil while it runs or after a
// clean close.
func (s *Store) StreamErr() error {
	if s.stream == nil {
		return nil
	}
	s.stream.mu.Lock()
	defer s.stream.mu.Unlock()
	return s.stream.err
}

// runStream is the stream's driver.
func (s *Store) runStream() {
	cs := s.stream
	defer close(cs.out)
	// Marks move when commits become visible and durable, which happens on
	// other goroutines; while commits are held back the driver looks again
	// every millisecond.
	poll := time.NewTicker(time.Millisecond)
	defer poll.Stop()
	for {
		cs.mu.Lock()
		waiting := cs.merger.Pending() > 0
		cs.mu.Unlock()
		if waiting {
			select {
			case <-s.stop:
				return
			case <-cs.quit:
				return
			case <-cs.wake:
			case <-poll.C:
			}
		} else {
			select {
			case <-s.stop:
				return
			case <-cs.quit:
				return
			case <-cs.wake:
			}
		}
		mem := min(s.mem.LatestSnapshot(), s.mem.DurableTS())
		disk := min(s.disk.LatestSnapshot(), s.disk.DurableTS())
		cs.mu.Lock()
		cs.merger.Advance(mem, disk)
		ready, err := cs.merger.Ready()
		if err != nil {
			cs.err = err
		}
		cs.mu.Unlock()
		for _, c := range ready {
			select {
			case cs.out <- c:
			case <-s.stop:
				return
			case <-cs.quit:
				return
			}
		}
		if err != nil {
			s.logger.Error("skeena: commit stream stopped", "err", err)
			return
		}
	}
}

// streamed tells the driver a streamed commit was installed.
func (tx *Tx) streamed() {
	if tx.s.stream != nil && tx.payload != nil {
		tx.s.stream.poke()
	}
}

// Snapshots returns the transaction's anchor snapshot and its storage
// snapshot, selecting the latter now if no storage table was touched yet.
// A commit on the stream is in what the transaction reads iff its memory
// timestamp is at or below the anchor or its storage timestamp at or below
// the storage snapshot.
func (tx *Tx) Snapshots(ctx context.Context) (anchor, storage uint64, err error) {
	if tx.done {
		return 0, 0, engine.ErrTxDone
	}
	if err := tx.beginStorage(ctx); err != nil {
		return 0, 0, err
	}
	tx.memUsed = true
	return tx.anchor, tx.storage, nil
}

// Streaming reports whether the store has a commit stream, so that the
// transaction should attach what it changes.
func (tx *Tx) Streaming() bool { return tx.s.stream != nil }
