package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/types"
)

// Batch is one Apply call: operations of one bucket, in timestamp order.
type Batch struct {
	// Bucket is the bucket the operations belong to, of Buckets in all; a
	// truncate deletes the rows of its table whose keys hash to Bucket.
	Bucket, Buckets int
	Ops             []change.Op
	// Stable says every mirror transaction below it has committed: the
	// bucket's undo records below it are dropped.
	Stable uint64
}

// step is one operation on its way through Apply.
type step struct {
	op       *change.Op
	st       *tableState
	oldKey   index.Key // delete, update
	newKey   index.Key // insert, update, upsert
	moved    bool      // update that changes the primary key
	newRow   uint64    // row id of the appended version
	hasNew   bool
	replaced bool   // upsert that found a live row
	muts     [2]int // positions in the mutation list, -1 when unused
	oldRows  [2]uint64
}

// Apply applies the operations of one bucket strictly in the order given
// (an insert then a delete of one key in one transaction leaves no row).
// On success they are applied in memory, visible to snapshots ≥ their
// timestamps once those commit.
//
// When an operation cannot be applied (a bad row, a key state that forbids
// it), Apply returns an *OpError naming the smallest timestamp that failed:
// every operation below that timestamp is applied; what operations at or
// above it wrote stays until Rollback(bucket, that timestamp) undoes it.
// Any other error is a failure of the replayer itself (index, buffer): then
// everything from the batch's first timestamp on must be rolled back. In
// both cases no further Apply of the bucket may come before the Rollback.
func (r *Replayer) Apply(ctx context.Context, b Batch) error {
	u := r.undoLog(b.Bucket)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.forget(b.Stable)
	if err := u.forgetSpill(b.Stable); err != nil {
		r.log.Warn("could not remove an undo spill file", "bucket", b.Bucket, "err", err)
	}
	err := r.applyOps(ctx, u, b)
	if serr := u.spillIfLarge(r.cfg.UndoDir, r.cfg.UndoInMemory); serr != nil && err == nil {
		err = serr // the bucket must be rolled back: its undo records are not all kept
	}
	return err
}

// applyOps applies a batch's operations, runs between truncates and
// updates that read the current version.
func (r *Replayer) applyOps(ctx context.Context, u *undoLog, b Batch) error {
	ops := b.Ops
	r.shapes.RLock()
	defer r.shapes.RUnlock()
	bad, badErr := r.conform(ops)
	if n, err := r.resolveContent(ctx, ops[:bad]); err != nil {
		bad, badErr = n, err // it failed before
	}
	var oe *OpError
	if badErr != nil && !errors.As(badErr, &oe) {
		return badErr
	}
	if badErr != nil { // what comes before the failing transaction is applied
		for bad > 0 && ops[bad-1].TS == ops[bad].TS {
			bad--
		}
		ops = ops[:bad]
	}
	if err := r.applyResolved(ctx, u, b, ops); err != nil {
		return err
	}
	return badErr
}

// applyResolved applies operations whose rows are named by key.
func (r *Replayer) applyResolved(ctx context.Context, u *undoLog, b Batch, ops []change.Op) error {
	for start := 0; start < len(ops); {
		end := start
		for end < len(ops) && ops[end].Kind != change.Truncate && (end == start || len(ops[end].Unchanged) == 0) {
			end++
		}
		if len(ops[start].Unchanged) > 0 { // its row reads what came before it
			if err := r.fillUnchanged(ctx, &ops[start]); err != nil {
				return err
			}
		}
		if end > start {
			if err := r.applyRun(ctx, u, ops[start:end]); err != nil {
				return err
			}
		}
		if end < len(ops) && ops[end].Kind == change.Truncate { // a truncate sees everything before it applied
			if err := r.truncate(ctx, u, b, &ops[end]); err != nil {
				return err
			}
			end++
		}
		start = end
	}
	return nil
}

// fillUnchanged completes an update's after image with the columns it
// keeps, read from the version the primary index points to now: the
// operations before it in the bucket are applied, committed or not.
func (r *Replayer) fillUnchanged(ctx context.Context, op *change.Op) error {
	fail := func(err error) error {
		name := fmt.Sprint(op.Table)
		if st, terr := r.table(op.Table); terr == nil {
			name = st.table.Name
		}
		return &OpError{Table: name, Kind: op.Kind, TS: op.TS, Key: op.Key, Err: err}
	}
	if op.Kind != change.Update {
		return fail(fmt.Errorf("%s cannot keep unchanged columns", op.Kind))
	}
	st, err := r.table(op.Table)
	if err != nil {
		return fail(err)
	}
	if r.cfg.Rows == nil {
		return fail(errors.New("the update keeps unchanged columns, and this replayer cannot read stored rows"))
	}
	if len(op.Row) != len(st.cols) {
		return fail(fmt.Errorf("after image has %d values for %d columns", len(op.Row), len(st.cols)))
	}
	keyVals := op.Key
	if keyVals == nil {
		keyVals = pick(op.Row, st.keys)
	}
	k, err := r.cfg.Index.Key(st.table.PrimaryIndexID, keyVals...)
	if err != nil {
		return fail(err)
	}
	rowID, found, err := r.cfg.Index.Lookup(ctx, k, op.TS)
	if err != nil {
		return fmt.Errorf("replay: index lookup: %w", err)
	}
	if !found {
		return fail(fmt.Errorf("%w: update of a key that has no live row", index.ErrConflict))
	}
	f, ok := r.cfg.Catalog.Snapshot().File(rowID >> 32)
	if !ok {
		return fmt.Errorf("replay: row %d of %s is in file %d, which the catalog does not have", rowID, st.table.Name, rowID>>32)
	}
	cur, err := r.cfg.Rows.ReadRow(ctx, st.table, f, uint32(rowID))
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	row := append([]any(nil), op.Row...)
	for _, c := range op.Unchanged {
		if c < 0 || c >= len(row) || c >= len(cur) {
			return fail(fmt.Errorf("unchanged column %d of %d", c, len(row)))
		}
		row[c] = cur[c]
	}
	op.Row, op.Unchanged = row, nil
	return nil
}

// runScratch is one applyRun's working space, reused from run to run: a
// replayer applies thousands of runs a second.
type runScratch struct {
	steps []step
	muts  []index.Mutation
}

// stepsFor returns n zeroed steps.
func (sc *runScratch) stepsFor(n int) []step {
	if cap(sc.steps) < n {
		sc.steps = make([]step, n)
	}
	return sc.steps[:n] // cleared when the last run ended
}

// applyRun applies operations without truncates, phase by phase: resolve
// keys, append new versions, check and write the primary index, then delete
// replaced versions and write secondary indexes.
func (r *Replayer) applyRun(ctx context.Context, u *undoLog, ops []change.Op) error {
	sc, _ := r.runs.Get().(*runScratch)
	if sc == nil {
		sc = &runScratch{}
	}
	defer r.runs.Put(sc)
	steps := sc.stepsFor(len(ops))
	defer clear(steps) // they point into ops and keys
	limit := len(ops)  // steps[:limit] are still being applied
	var failure *OpError
	fail := func(i int, err error) {
		// Operations come in timestamp order: none from step i on is
		// applied further, and the earliest failure is the one reported.
		limit = min(limit, i)
		if failure == nil || steps[i].op.TS < failure.TS {
			failure = r.opError(&steps[i], err)
		}
	}
	for i := range ops {
		s := &steps[i]
		s.op, s.muts = &ops[i], [2]int{-1, -1}
		if err := r.prepare(s); err != nil {
			fail(i, err)
			break
		}
	}
	bad, badErr, err := r.appendRows(ctx, u, steps[:limit])
	if err != nil {
		return err
	}
	if bad >= 0 {
		fail(bad, badErr)
	}
	muts := r.mutations(sc.muts[:0], steps[:limit])
	sc.muts = muts
	defer clear(muts)
	if _, err := r.cfg.Index.Mutate(ctx, muts); err != nil {
		return fmt.Errorf("replay: index: %w", err)
	}
	conflict := -1
	for i := range steps[:limit] {
		s := &steps[i]
		for j, m := range s.muts {
			if m < 0 {
				continue
			}
			mu := &muts[m]
			if mu.Err != nil {
				if conflict < 0 {
					conflict = i
					fail(i, mu.Err)
				}
				continue
			}
			// Every version written is undoable, also past the failure.
			u.add(undoRecord{kind: undoIndex, ts: mu.TS, key: mu.Key, row: mu.RowID})
			s.oldRows[j] = mu.Old
			if s.op.Kind == change.Upsert {
				s.replaced = mu.Live
			}
		}
	}
	var sec index.Batch
	var secWritten []index.Written
	for i := range steps[:limit] {
		s := &steps[i]
		if err := r.finish(u, s, &sec, &secWritten); err != nil {
			fail(i, err)
			break
		}
		switch s.op.Kind {
		case change.Insert:
			r.inserts.Add(1)
		case change.Delete:
			r.deletes.Add(1)
		case change.Update, change.Upsert:
			r.updates.Add(1)
		}
	}
	if sec.Len() > 0 {
		for _, w := range secWritten {
			u.add(undoRecord{kind: undoIndex, ts: w.TS, key: w.Key, row: w.RowID})
		}
		if err := r.cfg.Index.Apply(ctx, &sec); err != nil {
			return fmt.Errorf("replay: secondary indexes: %w", err)
		}
	}
	if failure != nil {
		return failure
	}
	return nil
}

// opError describes a failed step.
func (r *Replayer) opError(s *step, err error) *OpError {
	name := fmt.Sprint(s.op.Table)
	if s.st != nil {
		name = s.st.table.Name
	}
	oe := &OpError{Table: name, Kind: s.op.Kind, TS: s.op.TS, Key: s.op.Key, Err: err}
	if oe.Key == nil && s.st != nil && s.op.Row != nil && len(s.op.Row) == len(s.st.cols) {
		oe.Key = pick(s.op.Row, s.st.keys)
	}
	return oe
}

func pick(row []any, cols []int) []any {
	return pickInto(make([]any, 0, len(cols)), row, cols)
}

// pickInto is pick appending to dst: a key's values only while its
// encoding is built, in scratch space rather than a new slice a row.
func pickInto(dst []any, row []any, cols []int) []any {
	for _, c := range cols {
		dst = append(dst, row[c])
	}
	return dst
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
	var scratch [8]any // key values, while a key is encoded
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
			return key(pickInto(scratch[:0], op.Before, st.keys))
		case op.Kind == change.Update && op.Row != nil:
			return key(pickInto(scratch[:0], op.Row, st.keys))
		}
		return index.Key{}, fmt.Errorf("%s without a key or before image", op.Kind)
	}
	if len(st.sec) > 0 && (op.Kind == change.Delete || op.Kind == change.Update) && (op.Before == nil || len(op.Before) != len(st.cols)) {
		return fmt.Errorf("table %s has secondary indexes: %s needs the full before image", st.table.Name, op.Kind)
	}
	switch op.Kind {
	case change.Insert, change.Upsert:
		if err := needRow(); err != nil {
			return err
		}
		s.newKey, err = key(pickInto(scratch[:0], op.Row, st.keys))
	case change.Delete:
		s.oldKey, err = oldKey()
	case change.Update:
		if err := needRow(); err != nil {
			return err
		}
		if s.newKey, err = key(pickInto(scratch[:0], op.Row, st.keys)); err != nil {
			return err
		}
		s.oldKey, err = oldKey()
		s.moved = err == nil && !bytes.Equal(s.oldKey.Bytes(), s.newKey.Bytes())
	default:
		return fmt.Errorf("unknown operation kind %d", op.Kind)
	}
	return err
}

// appends reports whether a step writes a new version.
func (s *step) appends() bool { return s.op.Kind != change.Delete }

// appendRows writes the new versions, grouping consecutive operations of one
// table and timestamp into one append. A bad row (wrong type, NULL in a NOT
// NULL column) stops it: bad is that step and badErr why, and the steps
// before it are appended. err is a failure of the buffer itself.
func (r *Replayer) appendRows(ctx context.Context, u *undoLog, steps []step) (bad int, badErr, err error) {
	for i := 0; i < len(steps); {
		s := &steps[i]
		if !s.appends() {
			i++
			continue
		}
		j := i
		var rows [][]any
		for ; j < len(steps); j++ {
			t := &steps[j]
			if !t.appends() {
				continue // does not end the group
			}
			if t.st != s.st || t.op.TS != s.op.TS {
				break
			}
			rows = append(rows, t.op.Row)
		}
		runs, err := s.st.buf.Append(ctx, s.op.TS, rows)
		if err != nil {
			if !isRowError(err) {
				return -1, nil, fmt.Errorf("replay: append to %s: %w", s.st.table.Name, err)
			}
			// One row of the group is bad: append row by row up to it.
			for k := i; k < j; k++ {
				t := &steps[k]
				if !t.appends() {
					continue
				}
				runs, err := t.st.buf.Append(ctx, t.op.TS, [][]any{t.op.Row})
				if err != nil {
					if isRowError(err) {
						return k, err, nil
					}
					return -1, nil, fmt.Errorf("replay: append to %s: %w", t.st.table.Name, err)
				}
				r.appended(u, t, RowID(runs[0].File.ID(), runs[0].First))
			}
			return -1, nil, fmt.Errorf("replay: append to %s failed for the group but not for any of its rows: %w", s.st.table.Name, err)
		}
		k := i
		for _, run := range runs {
			for o := range run.N {
				for !steps[k].appends() {
					k++
				}
				r.appended(u, &steps[k], RowID(run.File.ID(), run.First+uint32(o)))
				k++
			}
		}
		i = j
	}
	return -1, nil, nil
}

func (r *Replayer) appended(u *undoLog, s *step, row uint64) {
	s.newRow, s.hasNew = row, true
	u.add(undoRecord{kind: undoAppend, ts: s.op.TS, row: row})
}

// isRowError tells a bad row from a failure of the buffer itself.
func isRowError(err error) bool { return errors.Is(err, types.ErrTypeMismatch) }

// mutations lists the primary-index changes in operation order.
func (r *Replayer) mutations(muts []index.Mutation, steps []step) []index.Mutation {
	add := func(s *step, slot int, m index.Mutation) {
		s.muts[slot] = len(muts)
		muts = append(muts, m)
	}
	for i := range steps {
		s := &steps[i]
		ts := s.op.TS
		switch {
		case s.op.Kind == change.Insert:
			add(s, 0, index.Mutation{Key: s.newKey, TS: ts, Kind: index.Insert, RowID: s.newRow})
		case s.op.Kind == change.Upsert:
			add(s, 0, index.Mutation{Key: s.newKey, TS: ts, Kind: index.Upsert, RowID: s.newRow})
		case s.op.Kind == change.Delete:
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
// changes for one operation whose primary-index change is written.
func (r *Replayer) finish(u *undoLog, s *step, sec *index.Batch, written *[]index.Written) error {
	ts := s.op.TS
	// Deletes, updates (moving the key or not) and upserts of a live key
	// replaced the row in slot 0.
	old := s.oldRows[0]
	hasOld := s.op.Kind == change.Delete || s.op.Kind == change.Update || s.replaced
	if s.replaced && len(s.st.sec) > 0 {
		return fmt.Errorf("table %s has secondary indexes: a snapshot read of a key that already exists needs the old row's before image", s.st.table.Name)
	}
	if hasOld {
		if err := r.deleteVersion(old, ts); err != nil {
			return err
		}
		u.add(undoRecord{kind: undoDelete, ts: ts, row: old})
	}
	for _, ix := range s.st.sec {
		if hasOld {
			k, err := r.cfg.Index.Key(ix.def.ID, pick(s.op.Before, ix.cols)...)
			if err != nil {
				return err
			}
			sec.Tombstone(k, ts, old)
			*written = append(*written, index.Written{Key: k, RowID: old, TS: ts})
		}
		if s.hasNew {
			k, err := r.cfg.Index.Key(ix.def.ID, pick(s.op.Row, ix.cols)...)
			if err != nil {
				return err
			}
			sec.Put(k, ts, s.newRow)
			*written = append(*written, index.Written{Key: k, RowID: s.newRow, TS: ts})
		}
	}
	return nil
}

// truncate deletes every row of the table whose key belongs to the batch's
// bucket and is live at the operation's timestamp, earlier operations of the
// same transaction included.
func (r *Replayer) truncate(ctx context.Context, u *undoLog, b Batch, op *change.Op) error {
	s := &step{op: op}
	st, err := r.table(op.Table)
	if err != nil {
		return r.opError(s, err)
	}
	s.st = st
	if b.Buckets <= 0 || b.Bucket < 0 || b.Bucket >= b.Buckets {
		return r.opError(s, fmt.Errorf("truncate of bucket %d of %d", b.Bucket, b.Buckets))
	}
	var muts []index.Mutation
	err = r.cfg.Index.Each(ctx, st.table.PrimaryIndexID, op.TS, func(k index.Key, _ uint64) error {
		if BucketFor(st.table, k.Bytes(), b.Buckets) == b.Bucket {
			muts = append(muts, index.Mutation{Key: k, TS: op.TS, Kind: index.Delete})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("replay: truncate %s: list keys: %w", st.table.Name, err)
	}
	if _, err := r.cfg.Index.Mutate(ctx, muts); err != nil {
		return fmt.Errorf("replay: truncate %s: index: %w", st.table.Name, err)
	}
	deleted := make(map[uint64]struct{}, len(muts))
	var failed error
	for i := range muts {
		m := &muts[i]
		if m.Err != nil { // nothing else writes this bucket's keys meanwhile
			failed = cmpOr(failed, m.Err)
			continue
		}
		u.add(undoRecord{kind: undoIndex, ts: m.TS, key: m.Key})
		deleted[m.Old] = struct{}{}
	}
	if failed != nil {
		return r.opError(s, failed)
	}
	for row := range deleted {
		if err := r.deleteVersion(row, op.TS); err != nil {
			return r.opError(s, err)
		}
		u.add(undoRecord{kind: undoDelete, ts: op.TS, row: row})
		r.deletes.Add(1)
	}
	if len(deleted) == 0 || len(st.sec) == 0 {
		return nil
	}
	var sec index.Batch
	for _, ix := range st.sec {
		err := r.cfg.Index.Each(ctx, ix.def.ID, op.TS, func(k index.Key, row uint64) error {
			if _, ok := deleted[row]; ok {
				sec.Tombstone(k, op.TS, row)
				u.add(undoRecord{kind: undoIndex, ts: op.TS, key: k, row: row})
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("replay: truncate %s: list index %s: %w", st.table.Name, ix.def.Name, err)
		}
	}
	if err := r.cfg.Index.Apply(ctx, &sec); err != nil {
		return fmt.Errorf("replay: truncate %s: secondary indexes: %w", st.table.Name, err)
	}
	return nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// deleteVersion gives a row version its delete timestamp.
func (r *Replayer) deleteVersion(rowID, ts uint64) error {
	vis, off, err := r.rowVisibility(rowID)
	if err != nil {
		return err
	}
	return vis.Delete(off, ts)
}
