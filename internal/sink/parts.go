package sink

import (
	"fmt"

	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/mirror"
)

// partRows is how many changes of a large transaction make one part.
const partRows = 4096

// partial is the transaction a contiguous source is delivering: its
// changes so far that no part has taken yet.
type partial struct {
	id        string
	part      int   // parts proposed so far
	next      int64 // total order of the next change not seen
	changes   []cdc.Record
	positions []cdc.Position
}

// inParts takes a record of a source that delivers each transaction whole
// and in commit order (cdc.Contiguous): its changes are proposed in parts
// of partRows as they arrive, so a transaction of any size goes through in
// bounded memory. ok is false for a record it does not take (snapshot
// reads and anything without a transaction id go to the assembler).
func (in *intake) inParts(rec cdc.Record) (ok bool, err error) {
	if rec.TxID == "" || (rec.Kind != cdc.Change && rec.Kind != cdc.End) {
		return false, nil
	}
	p := in.open
	if p == nil || p.id != rec.TxID {
		if p != nil {
			return true, fmt.Errorf("transaction %s began before %s ended, from a source that sends transactions whole", rec.TxID, p.id)
		}
		// What the assembler holds (a snapshot batch) comes first.
		in.asm.flushSnapshot()
		in.takeAssembled()
		p = &partial{id: rec.TxID}
		in.open = p
	}
	if rec.Kind == cdc.Change && rec.TotalOrder < p.next {
		// Redelivered after a reconnect and proposed already. Its position
		// is not marked handled: it is the transaction's, which stays
		// pending until the transaction commits.
		return true, nil
	}
	// Every change of a PostgreSQL transaction sits at its commit LSN: one
	// position stands for them all.
	if n := len(p.positions); n == 0 || p.positions[n-1] != rec.Pos {
		p.positions = append(p.positions, rec.Pos)
	}
	if rec.Kind == cdc.Change {
		p.next = rec.TotalOrder + 1
		p.changes = append(p.changes, rec)
		if len(p.changes) >= partRows {
			in.proposePart(p, true)
		}
		return true, nil
	}
	if rec.EventCount != p.next {
		return true, fmt.Errorf("transaction %s: %d changes, its end says %d", p.id, p.next, rec.EventCount)
	}
	in.proposePart(p, false)
	in.open = nil
	return true, nil
}

// proposePart turns the changes taken so far into the next part.
func (in *intake) proposePart(p *partial, open bool) {
	tx := Txn{ID: p.id, Changes: p.changes, Positions: p.positions}
	t, err := in.toTxn(tx)
	if err != nil {
		t = mirror.Txn{Source: in.source, ID: tx.ID, Positions: tx.Positions, Invalid: err}
	}
	t.Part, t.Open = p.part, open
	in.cur.items = append(in.cur.items, intakeItem{txn: &t})
	p.part++
	p.changes, p.positions = nil, nil
}
