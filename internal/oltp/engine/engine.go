// Package engine is the narrow interface between the cross-engine layer and
// each storage engine. An engine knows nothing about other engines: it
// offers transactions at a snapshot of its own timestamps, a split commit
// (pre-commit assigns the commit timestamp and validates, post-commit makes
// the writes visible and logs them) and a durable mark. The cross-engine
// layer composes two engines through this interface only.
package engine

import (
	"context"
	"errors"
	"fmt"
)

// Isolation is the isolation level a sub-transaction validates for.
type Isolation uint8

const (
	// SnapshotIsolation reads one snapshot and aborts on write-write
	// conflicts (first committer wins).
	SnapshotIsolation Isolation = iota
	// Serializable additionally validates at pre-commit that nothing the
	// sub-transaction read (keys and scanned ranges) was changed by a
	// transaction ordered before it: the commit order is the dependency
	// order (commit ordering), which composes across engines.
	Serializable
)

func (i Isolation) String() string {
	if i == Serializable {
		return "serializable"
	}
	return "snapshot"
}

// TableSpec declares a table: rows are opaque bytes under a primary key;
// each secondary index derives its key from the row.
type TableSpec struct {
	Name    string
	Indexes []IndexSpec
}

// IndexSpec is a secondary index: Key returns the index key of a row (nil:
// the row is not in the index). Index keys need not be unique.
type IndexSpec struct {
	Name string
	Key  func(row []byte) []byte
}

// Engine is one storage engine as the cross-engine layer sees it.
type Engine interface {
	// Name is a short label used in errors ("memory", "storage").
	Name() string
	// LatestSnapshot is the newest snapshot: every commit at or below it is
	// complete and visible. Cheap; never blocks.
	LatestSnapshot() uint64
	// Begin starts a sub-transaction reading at snapshot, which must not be
	// above LatestSnapshot (see WaitVisible).
	Begin(snapshot uint64, iso Isolation) Tx
	// WaitVisible blocks until LatestSnapshot() ≥ ts.
	WaitVisible(ctx context.Context, ts uint64) error
	// DurableTS is the durable mark: every commit at or below it is in the
	// engine's log on stable storage.
	DurableTS() uint64
	// WaitDurable blocks until DurableTS() ≥ ts.
	WaitDurable(ctx context.Context, ts uint64) error
}

// Tx is a sub-transaction of one engine.
type Tx interface {
	Snapshot() uint64
	// Get reads the row under key at the snapshot (and the transaction's
	// own writes).
	Get(table string, key []byte) (row []byte, ok bool, err error)
	// Scan calls fn for the rows with lo ≤ key < hi (hi nil: no bound) in
	// key order, by primary key (index "") or a secondary index's key.
	// fn returning false stops the scan.
	Scan(table, index string, lo, hi []byte, fn func(key, row []byte) bool) error
	// Put writes row under key; Delete removes key. A write conflict fails
	// at once with ErrWriteConflict.
	Put(table string, key, row []byte) error
	Delete(table string, key []byte) error
	// Writes reports whether the transaction wrote anything.
	Writes() bool
	// PreCommit validates and assigns the commit timestamp. After it
	// succeeds the transaction must be finished with PostCommit or Abort;
	// when it fails the transaction is aborted.
	PreCommit() (cts uint64, err error)
	// PostCommit installs the writes (visible once the watermark passes
	// cts) and logs them with tag, an opaque label recovery reports back.
	PostCommit(tag []byte) error
	// Abort discards the transaction at any point before PostCommit.
	Abort()
}

// Recovered describes one logged transaction found at recovery whose fate
// the cross-engine layer decides.
type Recovered struct {
	CommitTS uint64
	Snapshot uint64
	Tag      []byte
}

// Discard says which logged transactions recovery drops: those whose tag
// is in Tags and every transaction that read at a snapshot at or above
// FromSnapshot (it may have seen a dropped one). FromSnapshot 0 drops none
// on that ground.
type Discard struct {
	Tags         map[string]bool
	FromSnapshot uint64
}

// Drops reports whether d drops r.
func (d Discard) Drops(r Recovered) bool {
	if d.Tags[string(r.Tag)] {
		return true
	}
	return d.FromSnapshot != 0 && r.Snapshot >= d.FromSnapshot
}

// Typed errors: callers retry the whole transaction on ErrWriteConflict,
// ErrValidation, ErrCommitCheck and ErrSnapshotUnavailable.
var (
	ErrWriteConflict       = errors.New("write conflict: another transaction wrote this row after this transaction's snapshot or holds it")
	ErrValidation          = errors.New("serializable validation failed: a row this transaction read was changed by an earlier-ordered transaction")
	ErrCommitCheck         = errors.New("cross-engine commit check failed: committing would order this transaction differently in the two engines")
	ErrSnapshotUnavailable = errors.New("no consistent snapshot is available in the other engine for this transaction's snapshot")
	ErrUnknownTable        = errors.New("unknown table")
	ErrUnknownIndex        = errors.New("unknown index")
	ErrTxDone              = errors.New("transaction already finished")
	ErrClosed              = errors.New("engine closed")
)

// Retryable reports whether err means "run the transaction again".
func Retryable(err error) bool {
	return errors.Is(err, ErrWriteConflict) || errors.Is(err, ErrValidation) ||
		errors.Is(err, ErrCommitCheck) || errors.Is(err, ErrSnapshotUnavailable)
}

// ConflictError names the engine, table and key of a conflict.
type ConflictError struct {
	Engine string
	Table  string
	Key    []byte
	Err    error // ErrWriteConflict or ErrValidation
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%s engine, table %s, key %x: %v", e.Engine, e.Table, e.Key, e.Err)
}

func (e *ConflictError) Unwrap() error { return e.Err }
