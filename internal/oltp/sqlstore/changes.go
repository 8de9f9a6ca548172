package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/retinadb/retina/internal/oltp/skeena"
)

// Change is the net effect of one transaction on one row: Existed says the
// row was there at the transaction's snapshot, Row is it at commit (nil:
// deleted). A row inserted and deleted again has no change.
type Change struct {
	Table   *Table
	PK      []any // primary key values, or the hidden row id
	Existed bool
	Row     []any
}

// ChangeSet is what a transaction did, in the order it first touched each
// row: the payload it carries on the store's commit stream.
type ChangeSet struct {
	Created []*Table // tables created (and made empty in replicas)
	Dropped []*Table // tables dropped
	Changes []*Change
	byKey   map[string]int
}

// changes returns the transaction's change set, attaching a new one on
// first use; nil when the store has no commit stream.
func changes(tx *skeena.Tx) *ChangeSet {
	if !tx.Streaming() {
		return nil
	}
	if cs, ok := tx.Attached().(*ChangeSet); ok {
		return cs
	}
	cs := &ChangeSet{byKey: map[string]int{}}
	tx.Attach(cs)
	return cs
}

// record notes that the row under key (the table's row key) existed or not
// before this write and is row after it (nil: deleted).
func (cs *ChangeSet) record(t *Table, key []byte, pk []any, existed bool, row []any) {
	if cs == nil {
		return
	}
	if i, ok := cs.byKey[string(key)]; ok {
		cs.Changes[i].Row = slices.Clone(row)
		return
	}
	cs.byKey[string(key)] = len(cs.Changes)
	cs.Changes = append(cs.Changes, &Change{Table: t, PK: slices.Clone(pk), Existed: existed, Row: slices.Clone(row)})
}

// Each calls fn for every row of t in primary-key order without holding
// them all (the replica's initial copy); fn's error stops the scan.
func (r Rows) Each(ctx context.Context, t *Table, fn func(Row) error) error {
	rg := FullRange(t)
	var fnErr error
	err := r.Tx.Scan(ctx, t.physical(), "", rg.Lo, rg.Hi, func(key, v []byte) bool {
		vals, err := t.decodeRow(v)
		if err != nil {
			fnErr = fmt.Errorf("table %s: row under key %x: %w", t.Name, key, err)
			return false
		}
		pk, err := t.pkFromKey(key)
		if err != nil {
			fnErr = fmt.Errorf("table %s: key %x: %w", t.Name, key, err)
			return false
		}
		fnErr = fn(Row{Vals: vals, PK: pk})
		return fnErr == nil
	})
	return errors.Join(err, fnErr)
}
