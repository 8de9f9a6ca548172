package skeena

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/retinadb/retina/internal/oltp/csr"
	"github.com/retinadb/retina/internal/oltp/engine"
)

// Tx is a transaction over both engines. It is not safe for concurrent use.
type Tx struct {
	s        *Store
	iso      engine.Isolation
	anchor   uint64 // anchor (memory) snapshot
	mem      engine.Tx
	memUsed  bool // mem was read or written
	disk     engine.Tx
	storage  uint64 // selected storage snapshot (valid when disk != nil)
	selected bool   // registered in Store.active
	c1, c2   uint64 // cross-engine commit timestamps while in flight
	done     bool
	payload  any // delivered with the commit on the commit stream

	lastTable string // placement of the last table touched
	lastPlace Placement
}

// TxOptions override the store's defaults for one transaction.
type TxOptions struct {
	Isolation engine.Isolation
}

// Begin starts a transaction at the newest anchor snapshot with the store's
// isolation level.
func (s *Store) Begin() *Tx {
	return s.BeginTx(TxOptions{Isolation: s.iso})
}

// BeginTx starts a transaction with opts.
// The memory sub-transaction begins at once, so the anchor snapshot stays
// readable (version GC) however long the storage part takes.
func (s *Store) BeginTx(opts TxOptions) *Tx {
	a := s.mem.LatestSnapshot()
	return &Tx{s: s, iso: opts.Isolation, anchor: a, mem: s.mem.Begin(a, opts.Isolation)}
}

// AnchorSnapshot is the memory-engine snapshot the transaction reads.
func (tx *Tx) AnchorSnapshot() uint64 { return tx.anchor }

// sub returns the sub-transaction of the engine holding table, starting it
// (and, for storage, selecting its snapshot) on first use.
func (tx *Tx) sub(ctx context.Context, table string) (engine.Tx, error) {
	if tx.done {
		return nil, engine.ErrTxDone
	}
	// Transactions mostly touch one table again and again.
	if table != tx.lastTable {
		p, err := tx.s.engineOf(table)
		if err != nil {
			return nil, err
		}
		tx.lastTable, tx.lastPlace = table, p
	}
	if tx.lastPlace == Memory {
		tx.memUsed = true
		return tx.mem, nil
	}
	if err := tx.beginStorage(ctx); err != nil {
		return nil, err
	}
	return tx.disk, nil
}

// beginStorage starts the storage sub-transaction at the snapshot the
// registry selects for the anchor, unless it has started.
func (tx *Tx) beginStorage(ctx context.Context) error {
	if tx.disk != nil {
		return nil
	}
	v, err := tx.s.selectSnapshot(ctx, tx.anchor)
	if err != nil {
		return err
	}
	tx.storage, tx.selected = v, !tx.s.noCSR
	tx.disk = tx.s.disk.Begin(v, tx.iso)
	return nil
}

// selectSnapshot picks the storage snapshot for anchor snapshot a through
// the registry and records it; the caller must release it (unselect).
func (s *Store) selectSnapshot(ctx context.Context, a uint64) (uint64, error) {
	if s.noCSR {
		return s.disk.LatestSnapshot(), nil
	}
	for {
		s.csrMu.Lock()
		b, err := s.reg.Bounds(a)
		if err != nil {
			s.csrMu.Unlock()
			return 0, fmt.Errorf("skeena: anchor snapshot %d: %w (%v)", a, engine.ErrSnapshotUnavailable, err)
		}
		latest := s.disk.LatestSnapshot()
		if latest < b.Lower {
			// A cross-engine commit the anchor snapshot includes is still
			// being applied in storage.
			s.csrMu.Unlock()
			if err := s.disk.WaitVisible(ctx, b.Lower); err != nil {
				return 0, fmt.Errorf("skeena: wait for storage snapshot %d: %w", b.Lower, err)
			}
			continue
		}
		v := min(latest, b.Upper)
		if err := s.reg.Select(a, v); err != nil {
			s.csrMu.Unlock()
			return 0, fmt.Errorf("skeena: anchor snapshot %d: %w (%v)", a, engine.ErrSnapshotUnavailable, err)
		}
		s.active[a]++
		s.csrMu.Unlock()
		return v, nil
	}
}

func (tx *Tx) unselect() {
	if !tx.selected {
		return
	}
	tx.selected = false
	s := tx.s
	s.csrMu.Lock()
	if s.active[tx.anchor]--; s.active[tx.anchor] <= 0 {
		delete(s.active, tx.anchor)
	}
	s.csrMu.Unlock()
}

// Get reads the row under key.
func (tx *Tx) Get(ctx context.Context, table string, key []byte) ([]byte, bool, error) {
	sub, err := tx.sub(ctx, table)
	if err != nil {
		return nil, false, err
	}
	return sub.Get(table, key)
}

// Scan calls fn for the rows with lo ≤ key < hi (hi nil: no bound) in key
// order, by primary key (index "") or by a secondary index's key.
func (tx *Tx) Scan(ctx context.Context, table, index string, lo, hi []byte, fn func(key, row []byte) bool) error {
	sub, err := tx.sub(ctx, table)
	if err != nil {
		return err
	}
	return sub.Scan(table, index, lo, hi, fn)
}

// Put writes row under key.
func (tx *Tx) Put(ctx context.Context, table string, key, row []byte) error {
	sub, err := tx.sub(ctx, table)
	if err != nil {
		return err
	}
	return sub.Put(table, key, row)
}

// Delete removes the row under key.
func (tx *Tx) Delete(ctx context.Context, table string, key []byte) error {
	sub, err := tx.sub(ctx, table)
	if err != nil {
		return err
	}
	return sub.Delete(table, key)
}

// Rollback discards the transaction; a no-op after Commit.
func (tx *Tx) Rollback() {
	if tx.done {
		return
	}
	tx.done = true
	tx.mem.Abort()
	if tx.disk != nil {
		tx.disk.Abort()
	}
	tx.unselect()
}

// Tags label what recovery must know of a logged sub-transaction:
//
//	'x' c1 c2    a cross-engine commit: present in both engines or dropped
//	'r' a cts    a storage-only writer (at cts) that read the anchor at a
//	'w' v cts    a memory-only writer (at cts) that read storage at v
const (
	tagCross       = 'x'
	tagReadMemory  = 'r'
	tagReadStorage = 'w'
	tagLen         = 17
)

func crossTag(c1, c2 uint64) []byte {
	b := make([]byte, 0, tagLen)
	b = append(b, tagCross)
	b = binary.BigEndian.AppendUint64(b, c1)
	return binary.BigEndian.AppendUint64(b, c2)
}

func readTag(kind byte, read, cts uint64) []byte {
	b := make([]byte, 0, tagLen)
	b = append(b, kind)
	b = binary.BigEndian.AppendUint64(b, read)
	return binary.BigEndian.AppendUint64(b, cts)
}

// Commit commits the transaction and returns once it is durable in every
// engine it wrote and everything it read is durable too. A retryable
// failure (engine.Retryable) means nothing was committed. An
// *UnacknowledgedError means the outcome is unknown: the writes are
// visible but were not seen durable before ctx ended or a log failed; do
// not retry blindly.
func (tx *Tx) Commit(ctx context.Context) (err error) {
	if tx.done {
		return engine.ErrTxDone
	}
	defer tx.unselect()
	defer func() {
		if err == nil {
			tx.s.commits.Add(1)
		} else {
			tx.s.aborts.Add(1)
		}
	}()
	defer func() {
		if err != nil {
			// No-ops for a sub-transaction already finished.
			tx.mem.Abort()
			if tx.disk != nil {
				tx.disk.Abort()
			}
		}
	}()
	memW := tx.memUsed && tx.mem.Writes()
	diskW := tx.disk != nil && tx.disk.Writes()
	both := tx.memUsed && tx.disk != nil
	if both && (memW && diskW || tx.iso == engine.Serializable) {
		return tx.commitCross(ctx)
	}
	tx.done = true
	// One engine to commit (or none); the other, if read, is released.
	var readMem, readDisk uint64
	if tx.memUsed {
		readMem = tx.anchor
	}
	if tx.disk != nil {
		readDisk = tx.storage
	}
	switch {
	case diskW:
		tx.mem.Abort()
		// What it read of the anchor must be durable before it can be: a
		// crash that loses that memory commit must not keep this one.
		if tx.memUsed {
			if err := tx.s.mem.WaitDurable(ctx, tx.anchor); err != nil {
				return fmt.Errorf("skeena: wait for the memory snapshot this transaction read to be durable: %w", err)
			}
		}
		c2, err := tx.disk.PreCommit()
		if err != nil {
			return err
		}
		var tag []byte
		if tx.memUsed {
			tag = readTag(tagReadMemory, tx.anchor, c2)
		}
		if err := tx.streamAdd(0, c2); err != nil {
			return err
		}
		if err := tx.disk.PostCommit(tag); err != nil {
			return &UnacknowledgedError{Err: err}
		}
		tx.streamed()
		return tx.s.ack(ctx, readMem, max(c2, readDisk), readMem, readDisk)
	default:
		if tx.disk != nil {
			tx.disk.Abort()
		}
		if !tx.memUsed {
			tx.mem.Abort()
			return tx.s.ack(ctx, 0, readDisk, 0, readDisk)
		}
		if memW && tx.disk != nil {
			// As above, the other way round.
			if err := tx.s.disk.WaitDurable(ctx, tx.storage); err != nil {
				return fmt.Errorf("skeena: wait for the storage snapshot this transaction read to be durable: %w", err)
			}
		}
		c1, err := tx.mem.PreCommit()
		if err != nil {
			return err
		}
		var tag []byte
		if memW && tx.disk != nil {
			tag = readTag(tagReadStorage, tx.storage, c1)
		}
		if memW {
			if err := tx.streamAdd(c1, 0); err != nil {
				return err
			}
		}
		if err := tx.mem.PostCommit(tag); err != nil {
			return &UnacknowledgedError{Err: err}
		}
		tx.streamed()
		return tx.s.ack(ctx, max(c1, readMem), readDisk, readMem, readDisk)
	}
}

// commitCross is the pipelined commit of a transaction over both engines.
func (tx *Tx) commitCross(ctx context.Context) error {
	tx.done = true
	abort := func() {
		tx.mem.Abort()
		tx.disk.Abort()
	}
	c1, err := tx.mem.PreCommit()
	if err != nil {
		abort()
		return err
	}
	c2, err := tx.disk.PreCommit()
	if err != nil {
		abort()
		return err
	}
	tx.c1, tx.c2 = c1, c2
	if !tx.s.noCSR {
		tx.s.csrMu.Lock()
		err = tx.s.reg.CommitCheck(c1, c2)
		tx.s.csrMu.Unlock()
		if err != nil {
			abort()
			if errors.Is(err, csr.ErrTooOld) {
				return fmt.Errorf("skeena: commit %d→%d: %w (%v)", c1, c2, engine.ErrSnapshotUnavailable, err)
			}
			return fmt.Errorf("skeena: commit %d→%d: %w (%v)", c1, c2, engine.ErrCommitCheck, err)
		}
	}
	if err := tx.streamAdd(c1, c2); err != nil {
		abort()
		return err
	}
	// In flight from before either half is visible until both are durable.
	tx.s.cross.add(tx)
	tag := crossTag(c1, c2)
	// Storage first: a reader whose anchor snapshot includes c1 must find
	// c2 applied; the anchor makes the pair visible last.
	if err := tx.disk.PostCommit(tag); err != nil {
		// The storage engine failed; whether the batch reached its log is
		// unknown, so it stays in flight (safe points hold below it).
		tx.mem.Abort()
		return &UnacknowledgedError{Err: fmt.Errorf("cross-engine commit %d→%d: %w", c1, c2, err)}
	}
	if tx.s.hook != nil {
		tx.s.hook()
	}
	if err := tx.mem.PostCommit(tag); err != nil {
		return &UnacknowledgedError{Err: fmt.Errorf("cross-engine commit %d→%d: %w", c1, c2, err)}
	}
	tx.streamed()
	errMem := tx.s.mem.WaitDurable(ctx, max(c1, tx.anchor))
	errDisk := tx.s.disk.WaitDurable(ctx, max(c2, tx.storage))
	if errMem != nil || errDisk != nil {
		// In flight until both logs have it: nothing that saw it is
		// acknowledged before that, and recovery decides its fate.
		go tx.s.settleLater(tx, max(c1, tx.anchor), max(c2, tx.storage))
		return &UnacknowledgedError{Err: fmt.Errorf("cross-engine commit %d→%d: %w", c1, c2, errors.Join(errMem, errDisk))}
	}
	tx.s.cross.remove(tx)
	if err := tx.s.cross.waitSettled(ctx, tx.anchor, tx.storage); err != nil {
		return &UnacknowledgedError{Err: err}
	}
	return nil
}

// ack waits until the memory engine is durable through mem and storage
// through disk (0: nothing to wait for), and no cross-engine transaction
// the snapshots read (anchor sRead, storage vRead; 0: not read) saw is
// still half-durable.
func (s *Store) ack(ctx context.Context, mem, disk, sRead, vRead uint64) error {
	if mem > 0 && s.mem.DurableTS() < mem {
		if err := s.mem.WaitDurable(ctx, mem); err != nil {
			return &UnacknowledgedError{Err: err}
		}
	}
	if disk > 0 && s.disk.DurableTS() < disk {
		if err := s.disk.WaitDurable(ctx, disk); err != nil {
			return &UnacknowledgedError{Err: err}
		}
	}
	if err := s.cross.waitSettled(ctx, sRead, vRead); err != nil {
		return &UnacknowledgedError{Err: err}
	}
	return nil
}

// UnacknowledgedError reports a commit whose writes were installed but not
// seen durable: after a crash they may or may not be there (recovery keeps
// a cross-engine transaction whole either way).
type UnacknowledgedError struct{ Err error }

func (e *UnacknowledgedError) Error() string {
	return "skeena: commit outcome unknown (installed, not acknowledged durable): " + e.Err.Error()
}

func (e *UnacknowledgedError) Unwrap() error { return e.Err }

// settleLater takes a cross-engine transaction whose committer stopped
// waiting out of flight once both logs have it. If a log fails it stays in
// flight: nothing that read it can be acknowledged any more.
func (s *Store) settleLater(tx *Tx, mem, disk uint64) {
	if s.mem.WaitDurable(s.life, mem) == nil && s.disk.WaitDurable(s.life, disk) == nil {
		s.cross.remove(tx)
	}
}
