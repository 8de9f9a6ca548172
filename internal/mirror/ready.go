package mirror

import (
	"fmt"
	"strings"

	"github.com/retinadb/retina/internal/change"
)

// Ready is what the driver does after an event, in this order: write the
// dead letters (durably), hand commits and aborts to the transaction
// service in order, queue the sends, tell every bucket to roll back (after
// what it was sent), ask for timestamps, persist the checkpoint, collect, purge,
// and stop when Done.
type Ready struct {
	// DeadLetters are transactions set aside whole.
	DeadLetters []Rejected
	// Commit and Abort are timestamps to commit and to abort (abandon).
	Commit, Abort []uint64
	// Sends are operations to queue on their buckets, in order.
	Sends []Send
	// Rollback, when not 0, asks every bucket to undo everything from this
	// timestamp on, after what it was sent, and to report it.
	Rollback uint64
	// Request asks the transaction service for this many timestamps.
	Request int
	// Checkpoint, when set, is every source's resume point to persist.
	Checkpoint []change.Checkpoint
	// Persist, when set, asks for a replay checkpoint at its timestamp:
	// nothing is in flight, so the state holds every transaction up to it
	// and none above. The driver captures it, reports Sealed (dispatch then
	// goes on), writes it out and reports Persisted.
	Persist *Persist
	// Collect, when not 0, is a low watermark to run memory GC below.
	Collect uint64
	// Purge, when not 0, is a low watermark to purge index versions below.
	Purge uint64
	// Done says the core is finished; Err is why it stopped (nil after a
	// clean stop or the end of every source).
	Done bool
	Err  error
}

// Persist is a replay checkpoint to take.
type Persist struct {
	TS      uint64
	Sources []change.Checkpoint // each source's resume point at TS
}

// Send is one transaction's operations for one bucket.
type Send struct {
	Bucket int
	TS     uint64
	TxnID  string
	Ops    []change.Op
	// Stable: every transaction below it has committed.
	Stable uint64
}

// Rejected is a transaction set aside and why.
type Rejected struct {
	Txn Txn
	TS  uint64
	Err error
}

// Empty says there is nothing to do.
func (r Ready) Empty() bool {
	return len(r.DeadLetters) == 0 && len(r.Commit) == 0 && len(r.Abort) == 0 && r.Rollback == 0 &&
		len(r.Sends) == 0 && r.Request == 0 && r.Checkpoint == nil && r.Persist == nil && r.Collect == 0 && r.Purge == 0 && !r.Done
}

// String renders the Ready one item a line, for traces and tests.
func (r Ready) String() string {
	var b strings.Builder
	for _, d := range r.DeadLetters {
		fmt.Fprintf(&b, "dead-letter %s ts=%d: %v\n", d.Txn.ID, d.TS, d.Err)
	}
	if len(r.Commit) > 0 {
		fmt.Fprintf(&b, "commit %s\n", tsList(r.Commit))
	}
	if len(r.Abort) > 0 {
		fmt.Fprintf(&b, "abort %s\n", tsList(r.Abort))
	}
	for _, s := range r.Sends {
		kinds := make([]string, len(s.Ops))
		for i, op := range s.Ops {
			kinds[i] = op.Kind.String()
		}
		fmt.Fprintf(&b, "send b%d ts=%d %s [%s] stable=%d\n", s.Bucket, s.TS, s.TxnID, strings.Join(kinds, " "), s.Stable)
	}
	if r.Rollback != 0 {
		fmt.Fprintf(&b, "rollback from=%d\n", r.Rollback)
	}
	if r.Request > 0 {
		fmt.Fprintf(&b, "request %d\n", r.Request)
	}
	for i, cp := range r.Checkpoint {
		fmt.Fprintf(&b, "checkpoint source=%d %s\n", i, cp)
	}
	if p := r.Persist; p != nil {
		fmt.Fprintf(&b, "persist ts=%d", p.TS)
		for i, cp := range p.Sources {
			fmt.Fprintf(&b, " source=%d %s", i, cp)
		}
		b.WriteByte('\n')
	}
	if r.Collect != 0 {
		fmt.Fprintf(&b, "collect below=%d\n", r.Collect)
	}
	if r.Purge != 0 {
		fmt.Fprintf(&b, "purge below=%d\n", r.Purge)
	}
	if r.Done {
		if r.Err != nil {
			fmt.Fprintf(&b, "done: %v\n", r.Err)
		} else {
			b.WriteString("done\n")
		}
	}
	return b.String()
}

func tsList(ts []uint64) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = fmt.Sprint(t)
	}
	return strings.Join(s, ",")
}
