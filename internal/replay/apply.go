package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/types"
)

// step is one operation on its way through Apply.
type step struct {
	op      *Op
	st      *tableState
	oldKey  index.Key // delete, update
	newKey  index.Key // insert, update
	moved   bool      // update that changes the primary key
	newRow  uint64    // row id of the appended version
	hasNew  bool
	muts    [2]int // positions in the mutation list, -1 when unused
	oldRows [2]uint64
	err     error
}

// Apply applies the operations of one or more mirror transactions, strictly
// in the order given (one bucket's operations in timestamp order; an insert
// then a delete of one key in one transaction leaves no row). It returns
// once they are applied in memory, visible to snapshots ≥ their timestamps
// when those commit. In the default policy the first bad operation fails the
// call; with Tolerate it is logged, counted and skipped.
func (r *Replayer) Apply(ctx context.Context, ops []Op) error {
	steps := make([]step, len(ops))
	for i := range ops {
		s := &steps[i]
		s.op, s.muts = &ops[i], [2]int{-1, -1}
		s.err = r.prepare(s)
		if s.err != nil {
			if err := r.reject(s); err != nil {
				return err
			}
		}
	}
	if err := r.appendRows(ctx, steps); err != nil {
		return err
	}
	muts := r.mutations(steps)
	if _, err := r.cfg.Index.Mutate(ctx, muts); err != nil {
		return fmt.Errorf("replay: index: %w", err)
	}
	var sec index.Batch
	for i := range steps {
		s := &steps[i]
		if s.err != nil {
			continue
		}
		for j, m := range s.muts {
			if m < 0 {
				continue
			}
			if err := muts[m].Err; err != nil {
				s.err = err
				break
			}
			s.oldRows[j] = muts[m].Old
		}
		if s.err == nil {
			s.err = r.finish(s, &sec)
		}
		if s.err != nil {
			if s.hasNew { // never let the orphaned new version become visible
				r.retire(s.newRow, s.op.TS)
			}
			if err := r.reject(s); err != nil {
				return err
			}
			continue
		}
		switch s.op.Kind {
		case Insert:
			r.inserts.Add(1)
		case Delete:
			r.deletes.Add(1)
		case Update:
			r.updates.Add(1)
		}
	}
	if sec.Len() > 0 {
		if err := r.cfg.Index.Apply(ctx, &sec); err != nil {
			return fmt.Errorf("replay: secondary indexes: %w", err)
		}
	}
	return nil
}

// reject applies the bad-operation policy to a failed step.
func (r *Replayer) reject(s *step) error {
	name := fmt.Sprint(s.op.Table)
	if s.st != nil {
		name = s.st.table.Name
	}
	err := &OpError{Table: name, Kind: s.op.Kind, TS: s.op.TS, Key: s.op.Key, Err: s.err}
	if err.Key == nil && s.st != nil && s.op.Row != nil && len(s.op.Row) == len(s.st.cols) {
		err.Key = pick(s.op.Row, s.st.keys)
	}
	if !r.cfg.Tolerate {
		return err
	}
	r.tolerated.Add(1)
	r.log.Warn("skipping a bad operation (tolerate mode)", "err", err)
	return nil
}

func pick(row []any, cols []int) []any {
	out := make([]any, len(cols))
	for i, c := range cols {
		out[i] = row[c]
	}
	return out
}

// prepare resolves the table and builds the keys of one operation.
func (r *Replayer) prepare(s *step) error {
	op := s.op
	st, err := r.table(op.Table)
	if err != nil {
		return err
	}
	s.st = st
	pk := st.table.PrimaryIndexID
	key := func(vals []any) (index.Key, error) { return r.cfg.Index.Key(pk, vals...) }
	needRow := func() error {
		if op.Row == nil {
			return fmt.Errorf("%s without an after image", op.Kind)
		}
		if len(op.Row) != len(st.cols) {
			return fmt.Errorf("after image has %d values for %d columns", len(op.Row), len(st.cols))
		}
		return nil
	}
	oldKey := func() (index.Key, error) {
		switch {
		case op.Key != nil:
			return key(op.Key)
		case op.Before != nil && len(op.Before) == len(st.cols):
			return key(pick(op.Before, st.keys))
		case op.Kind == Update && op.Row != nil:
			return key(pick(op.Row, st.keys))
		}
		return index.Key{}, fmt.Errorf("%s without a key or before image", op.Kind)
	}
	if len(st.sec) > 0 && op.Kind != Insert && (op.Before == nil || len(op.Before) != len(st.cols)) {
		return fmt.Errorf("table %s has secondary indexes: %s needs the full before image", st.table.Name, op.Kind)
	}
	switch op.Kind {
	case Insert:
		if err := needRow(); err != nil {
			return err
		}
		s.newKey, err = key(pick(op.Row, st.keys))
	case Delete:
		s.oldKey, err = oldKey()
	case Update:
		if err := needRow(); err != nil {
			return err
		}
		if s.newKey, err = key(pick(op.Row, st.keys)); err != nil {
			return err
		}
		s.oldKey, err = oldKey()
		s.moved = err == nil && !bytes.Equal(s.oldKey.Bytes(), s.newKey.Bytes())
	default:
		return fmt.Errorf("unknown operation kind %d", op.Kind)
	}
	return err
}

// appendRows writes the new versions, grouping consecutive operations of one
// table and timestamp into one append.
func (r *Replayer) appendRows(ctx context.Context, steps []step) error {
	for i := 0; i < len(steps); {
		s := &steps[i]
		if s.err != nil || s.op.Kind == Delete {
			i++
			continue
		}
		j := i
		var rows [][]any
		for ; j < len(steps); j++ {
			t := &steps[j]
			if t.err != nil || t.op.Kind == Delete {
				continue // skipped: does not end the group
			}
			if t.st != s.st || t.op.TS != s.op.TS {
				break
			}
			rows = append(rows, t.op.Row)
		}
		runs, err := s.st.buf.Append(ctx, s.op.TS, rows)
		if err != nil {
			if isRowError(err) {
				// One row of the group is bad: retry row by row to find it.
				for k := i; k < j; k++ {
					if t := &steps[k]; t.err == nil && t.op.Kind != Delete {
						if err := r.appendOne(ctx, t); err != nil {
							return err
						}
					}
				}
				i = j
				continue
			}
			return fmt.Errorf("replay: append to %s: %w", s.st.table.Name, err)
		}
		k := i
		for _, run := range runs {
			for o := range run.N {
				for steps[k].err != nil || steps[k].op.Kind == Delete {
					k++
				}
				steps[k].newRow = RowID(run.File.ID(), run.First+uint32(o))
				steps[k].hasNew = true
				k++
			}
		}
		i = j
	}
	return nil
}

// isRowError tells a bad row (wrong type, NULL in a NOT NULL column) from a
// failure of the buffer itself.
func isRowError(err error) bool { return errors.Is(err, types.ErrTypeMismatch) }

// appendOne appends a single row, turning a bad row into a step error.
func (r *Replayer) appendOne(ctx context.Context, s *step) error {
	runs, err := s.st.buf.Append(ctx, s.op.TS, [][]any{s.op.Row})
	if err != nil {
		if isRowError(err) {
			s.err = err
			return r.reject(s)
		}
		return fmt.Errorf("replay: append to %s: %w", s.st.table.Name, err)
	}
	s.newRow, s.hasNew = RowID(runs[0].File.ID(), runs[0].First), true
	return nil
}

// mutations lists the primary-index changes in operation order.
func (r *Replayer) mutations(steps []step) []index.Mutation {
	muts := make([]index.Mutation, 0, len(steps))
	add := func(s *step, slot int, m index.Mutation) {
		s.muts[slot] = len(muts)
		muts = append(muts, m)
	}
	for i := range steps {
		s := &steps[i]
		if s.err != nil {
			continue
		}
		ts := s.op.TS
		switch {
		case s.op.Kind == Insert:
			add(s, 0, index.Mutation{Key: s.newKey, TS: ts, Kind: index.Insert, RowID: s.newRow})
		case s.op.Kind == Delete:
			add(s, 0, index.Mutation{Key: s.oldKey, TS: ts, Kind: index.Delete})
		case s.moved:
			add(s, 0, index.Mutation{Key: s.oldKey, TS: ts, Kind: index.Delete})
			add(s, 1, index.Mutation{Key: s.newKey, TS: ts, Kind: index.Insert, RowID: s.newRow})
		default:
			add(s, 0, index.Mutation{Key: s.newKey, TS: ts, Kind: index.Replace, RowID: s.newRow})
		}
	}
	return muts
}

// finish marks the replaced version deleted and queues secondary-index
// changes for one applied operation.
func (r *Replayer) finish(s *step, sec *index.Batch) error {
	ts := s.op.TS
	// Deletes and updates (moving the key or not) replaced the row in slot 0.
	old, hasOld := s.oldRows[0], s.op.Kind != Insert
	if hasOld {
		if err := r.deleteVersion(old, ts); err != nil {
			return err
		}
	}
	for _, ix := range s.st.sec {
		if hasOld {
			k, err := r.cfg.Index.Key(ix.def.ID, pick(s.op.Before, ix.cols)...)
			if err != nil {
				return err
			}
			sec.Tombstone(k, ts, old)
		}
		if s.hasNew {
			k, err := r.cfg.Index.Key(ix.def.ID, pick(s.op.Row, ix.cols)...)
			if err != nil {
				return err
			}
			sec.Put(k, ts, s.newRow)
		}
	}
	return nil
}

// deleteVersion gives a row version its delete timestamp.
func (r *Replayer) deleteVersion(rowID, ts uint64) error {
	loc, err := r.cfg.Index.Locate(context.Background(), rowID)
	if err != nil {
		return err
	}
	vis, ok := r.FileVisibility(loc.FileID)
	if !ok {
		return fmt.Errorf("replay: file %d (row %d) is not owned by replayer %d", loc.FileID, rowID, r.cfg.ID)
	}
	return vis.Delete(loc.Offset, ts)
}

// retire deletes a just-appended version at its own timestamp, so it is
// never visible (used when its operation is rejected after the append).
func (r *Replayer) retire(rowID, ts uint64) {
	if err := r.deleteVersion(rowID, ts); err != nil {
		r.log.Error("could not hide the version of a rejected operation", "row", rowID, "ts", ts, "err", err)
	}
}
