package sink

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/retinadb/retina/internal/cdc"
)

// Txn is one rebuilt source transaction.
type Txn struct {
	// ID identifies it for de-duplication: the source transaction id, or
	// the position of its first message when there is no metadata.
	ID string
	// Changes in commit order within the transaction.
	Changes []cdc.Record
	// Positions of every message that belongs to it (changes, BEGIN, END).
	Positions []cdc.Position
	// Raw are those messages, when the records carried them.
	Raw []cdc.Message
}

type pendingTxn struct {
	id        string
	changes   []cdc.Record // by total_order; a redelivered one replaces its first copy
	positions []cdc.Position
	raw       []cdc.Message
	end       *cdc.Record
	since     time.Time
}

// add places a change by its total_order. Changes arrive in order almost
// always: then it is an append.
func (p *pendingTxn) add(r cdc.Record) {
	n := len(p.changes)
	if n == 0 || p.changes[n-1].TotalOrder < r.TotalOrder {
		p.changes = append(p.changes, r)
		return
	}
	i, found := slices.BinarySearchFunc(p.changes, r.TotalOrder, func(c cdc.Record, o int64) int { return cmp.Compare(c.TotalOrder, o) })
	if found {
		p.changes[i] = r
		return
	}
	p.changes = slices.Insert(p.changes, i, r)
}

func (p *pendingTxn) complete() (bool, error) {
	if p.end == nil || int64(len(p.changes)) < p.end.EventCount {
		return false, nil
	}
	if int64(len(p.changes)) > p.end.EventCount {
		return false, fmt.Errorf("transaction %s: %d events, END says %d", p.id, len(p.changes), p.end.EventCount)
	}
	got := map[string]int64{}
	for _, c := range p.changes {
		got[c.Table]++
	}
	for table, n := range p.end.PerTable {
		if got[table] != n {
			return false, nil
		}
	}
	return true, nil
}

// assembler rebuilds source transactions from decoded records that may
// arrive interleaved across topics, before their BEGIN, and more than once.
//
// Grouping rule: a change with transaction metadata joins its transaction,
// which is complete when its END has arrived and the per-table event counts
// match; completed transactions are released in END order (the source's
// commit order). Snapshot events (op r) without metadata are grouped into
// batches of up to snapshotBatch events. Any other change without metadata
// is a transaction of its own.
type assembler struct {
	snapshotBatch int
	open          map[string]*pendingTxn
	ends          []string // transaction ids in END order
	snapshot      []cdc.Record
	out           []Txn
	// Recently released transactions: a late redelivered message of one is
	// dropped instead of opening the transaction again.
	released map[string]struct{}
	fifo     []string
	dropped  []cdc.Position
	// spare holds change slices handed back by recycle, for new
	// transactions to fill instead of growing their own; spareSnapshot is
	// a snapshot batch's, for the next batch of a copy.
	spare         [][]cdc.Record
	spareSnapshot []cdc.Record
}

// maxSpare bounds the recycled change slices kept, and maxSpareCap their
// size: a large transaction's (or snapshot batch's) slice is left to the
// collector.
const maxSpare, maxSpareCap = 64, 256

// recycle takes back a released transaction's changes once nothing reads
// them any more. A spare slice is all zero: it was zero when new, and
// only its first len(changes) records were ever set.
func (a *assembler) recycle(changes []cdc.Record) {
	if cap(changes) > maxSpareCap && cap(changes) <= a.snapshotBatch && a.spareSnapshot == nil {
		clear(changes)
		a.spareSnapshot = changes[:0]
		return
	}
	if cap(changes) == 0 || cap(changes) > maxSpareCap {
		return
	}
	if len(a.spare) < maxSpare {
		clear(changes) // drop the rows they point to
		a.spare = append(a.spare, changes[:0])
	}
}

func (a *assembler) spareChanges() []cdc.Record {
	if n := len(a.spare); n > 0 {
		c := a.spare[n-1]
		a.spare = a.spare[:n-1]
		return c
	}
	return nil
}

// rememberReleased bounds the set of released transaction ids.
const rememberReleased = 1 << 16

func newAssembler(snapshotBatch int) *assembler {
	return &assembler{snapshotBatch: snapshotBatch, open: map[string]*pendingTxn{}, released: map[string]struct{}{}}
}

// add takes one record; completed transactions accumulate in a.out.
func (a *assembler) add(r cdc.Record) error {
	if r.Kind == cdc.Change && r.TxID == "" && r.Op == cdc.OpRead {
		if a.snapshot == nil {
			if a.spareSnapshot != nil {
				a.snapshot, a.spareSnapshot = a.spareSnapshot, nil
			} else {
				a.snapshot = make([]cdc.Record, 0, 64)
			}
		}
		a.snapshot = append(a.snapshot, r)
		if len(a.snapshot) >= a.snapshotBatch {
			a.flushSnapshot()
		}
		return nil
	}
	a.flushSnapshot() // keep snapshot batches in stream order
	switch {
	case r.Kind == cdc.Change && r.TxID == "":
		t := Txn{ID: r.Pos.String(), Changes: []cdc.Record{r}, Positions: []cdc.Position{r.Pos}}
		if r.Raw != nil {
			t.Raw = []cdc.Message{*r.Raw}
		}
		a.out = append(a.out, t)
		return nil
	case r.Kind == cdc.Skip:
		return nil
	}
	if _, done := a.released[r.TxID]; done {
		a.dropped = append(a.dropped, r.Pos)
		return nil
	}
	p := a.open[r.TxID]
	if p == nil {
		p = &pendingTxn{id: r.TxID, since: time.Now(), changes: a.spareChanges()}
		a.open[r.TxID] = p
	}
	p.positions = append(p.positions, r.Pos)
	if r.Raw != nil {
		p.raw = append(p.raw, *r.Raw)
	}
	switch r.Kind {
	case cdc.Change:
		p.add(r)
	case cdc.End:
		if p.end == nil {
			rr := r
			p.end = &rr
			a.ends = append(a.ends, r.TxID)
		}
	}
	return a.release()
}

// release moves completed transactions at the head of the END order out.
func (a *assembler) release() error {
	for len(a.ends) > 0 {
		p := a.open[a.ends[0]]
		done, err := p.complete()
		if err != nil {
			return err
		}
		if !done {
			return nil
		}
		a.out = append(a.out, Txn{ID: p.id, Changes: p.changes, Positions: p.positions, Raw: p.raw})
		delete(a.open, p.id)
		a.ends = a.ends[1:]
		a.released[p.id] = struct{}{}
		a.fifo = append(a.fifo, p.id)
		if len(a.fifo) > rememberReleased {
			delete(a.released, a.fifo[0])
			a.fifo = a.fifo[1:]
		}
	}
	return nil
}

// flushSnapshot releases a partial batch of snapshot events.
func (a *assembler) flushSnapshot() {
	if len(a.snapshot) == 0 {
		return
	}
	t := Txn{ID: a.snapshot[0].Pos.String(), Changes: a.snapshot, Positions: make([]cdc.Position, 0, len(a.snapshot))}
	for _, r := range a.snapshot {
		t.Positions = append(t.Positions, r.Pos)
		if r.Raw != nil {
			t.Raw = append(t.Raw, *r.Raw)
		}
	}
	a.out = append(a.out, t)
	a.snapshot = nil
}

// take returns and clears the completed transactions.
func (a *assembler) take() []Txn {
	out := a.out
	a.out = nil
	return out
}

// takeDropped returns and clears the positions of dropped duplicates.
func (a *assembler) takeDropped() []cdc.Position {
	out := a.dropped
	a.dropped = nil
	return out
}

// stuck describes the oldest transaction held up, for diagnostics.
func (a *assembler) stuck(after time.Duration) string {
	if len(a.ends) == 0 {
		return ""
	}
	p := a.open[a.ends[0]]
	if time.Since(p.since) < after {
		return ""
	}
	return fmt.Sprintf("transaction %s has %d of %d events after %s", p.id, len(p.changes), p.end.EventCount, time.Since(p.since).Round(time.Second))
}
