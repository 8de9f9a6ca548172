// Package txn is the transaction service: the one authority for mirror
// transaction timestamps and for the high and low watermarks of Retina's MVCC.
//
// # Rules
//
//   - Timestamps are 1 ≤ ts < 2^52, handed out in increasing order and never
//     reused, also across restarts: ranges are reserved durably in a Store
//     before any timestamp from them is handed out.
//   - HWM is the smallest timestamp not yet committed (or abandoned): every
//     allocated timestamp below it is done. Commits arrive in any order; HWM
//     only moves over a gap-free prefix.
//   - A query's snapshot is HWM − 1 when it begins. LWM is the smallest
//     snapshot of a running query, or HWM − 1 when none runs; it never
//     decreases. Memory and storage GC work strictly below LWM.
//
// # Abandoning a timestamp
//
// AbandonMirror marks timestamps as committed-empty so HWM can pass them.
// The sink may call it for a timestamp only when no operation of its
// transaction has been applied under it and none ever will be:
//
//   - the timestamp was allocated (group begin hands out several at once) but
//     the transaction's operations were never sent to a replayer: the sink
//     stopped, its context was cancelled, or the transaction turned out to be
//     a duplicate or empty after allocation;
//   - the operations were sent, but every replayer that received them has
//     discarded them (rolled back to a replay checkpoint below the timestamp)
//     before the call.
//
// After recovery such a transaction is replayed again under a new timestamp.
// Abandoning a timestamp whose operations were partly applied would make that
// half transaction visible once HWM passes it; the service cannot detect this.
//
// # Restart
//
// The durable state is only the reserved bound. A new service on the same
// store starts with next = HWM = the reserved bound: every timestamp handed
// out before the restart counts as abandoned. The sink resumes from its replay
// checkpoint and replays everything after it under new timestamps, and the
// replayers restore state from that checkpoint, so nothing half-replayed under
// an old timestamp survives a restart.
package txn

import (
	"context"
	"errors"
)

// MaxTimestamp is the largest timestamp the service hands out (52 bits).
const MaxTimestamp = 1<<52 - 1

// Errors callers branch on. Every error the service returns wraps one of them
// (or a context error, or a store error).
var (
	ErrNotAllocated     = errors.New("txn: timestamp was never allocated")
	ErrAlreadyCommitted = errors.New("txn: timestamp already committed or abandoned")
	ErrUnknownQuery     = errors.New("txn: unknown query handle")
	ErrInvalidArgument  = errors.New("txn: invalid argument")
	ErrExhausted        = errors.New("txn: timestamp space exhausted")
	ErrClosed           = errors.New("txn: service closed")
)

// Range is a run of consecutive timestamps [First, First+N).
type Range struct {
	First uint64
	N     int
}

// Last is the largest timestamp of the range.
func (r Range) Last() uint64 { return r.First + uint64(r.N) - 1 }

// Query is a registered read snapshot.
type Query struct {
	Snapshot uint64 // HWM − 1 at begin: every ts ≤ Snapshot is committed
	Handle   uint64 // pass to EndQuery
}

// Watermarks is a consistent reading of the MVCC state.
type Watermarks struct {
	HWM     uint64 // every allocated ts < HWM is committed or abandoned
	LWM     uint64 // every query with a snapshot < LWM has ended
	Next    uint64 // the next timestamp BeginMirror will hand out
	Running int    // queries registered and not ended
}

// Service is the transaction service, in process or over gRPC.
type Service interface {
	// BeginMirror hands out n consecutive timestamps (group begin).
	BeginMirror(ctx context.Context, n int) (Range, error)
	// CommitMirror marks the timestamps replayed. All or none are applied:
	// an unallocated, already committed or repeated timestamp fails the call.
	CommitMirror(ctx context.Context, ts ...uint64) error
	// AbandonMirror marks timestamps whose transactions will never be
	// replayed under them as committed-empty; see the package documentation
	// for when that is allowed.
	AbandonMirror(ctx context.Context, ts ...uint64) error
	// BeginQuery registers a query at snapshot HWM − 1.
	BeginQuery(ctx context.Context) (Query, error)
	// EndQuery unregisters a query so LWM can move past its snapshot.
	EndQuery(ctx context.Context, handle uint64) error
	// Watermarks reads HWM, LWM and the allocation position.
	Watermarks(ctx context.Context) (Watermarks, error)
	// WaitHWM blocks until HWM > ts, i.e. ts and everything before it is
	// committed, and returns the watermarks seen then.
	WaitHWM(ctx context.Context, ts uint64) (Watermarks, error)
}
