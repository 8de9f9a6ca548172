package replay

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/apache/arrow-go/v18/arrow/decimal128"

	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/types"
)

// Rows found by content. A table whose key Retina generated
// (catalog.Schema.GeneratedKey) gets deletes and updates that name their row
// by its other columns, as PostgreSQL sends them for a table without a key
// under REPLICA IDENTITY FULL. All rows of such a table replay in one
// bucket, so that bucket's state before a batch, followed through the
// batch's own operations in order, says which row each one means.

// contentRows follows the rows of one table that a batch may name by
// content, compared without the columns in skip: from the stored rows before
// the batch (only those whose content is asked for) and every row the batch
// itself writes.
type contentRows struct {
	st        *tableState
	skip      []int               // the key columns and an operation's Unmatched
	byContent map[string][]string // content → encoded keys
	contentOf map[string]string   // encoded key → content
	keyVals   map[string][]any    // encoded key → key values
}

// resolveContent sets the key of every ByContent operation of ops (and the
// key columns of its Row and Before). When one names no live row it returns
// that operation's index with an *OpError; the operations before it are
// resolved.
func (r *Replayer) resolveContent(ctx context.Context, ops []change.Op) (int, error) {
	tables := map[uint32][]*contentRows{} // one per set of compared columns
	for i := range ops {
		op := &ops[i]
		if !op.ByContent {
			continue
		}
		st, err := r.table(op.Table)
		if err != nil {
			return i, r.opError(&step{op: op}, err)
		}
		if !st.table.Schema.GeneratedKey {
			return i, r.opError(&step{op: op, st: st}, fmt.Errorf("the table has a primary key from its source, so rows are not found by content"))
		}
		if r.cfg.Rows == nil {
			return i, r.opError(&step{op: op, st: st}, fmt.Errorf("this replayer cannot read stored rows to find the row by content"))
		}
		if contentFor(tables[op.Table], op) == nil {
			skip := slices.Sorted(slices.Values(append(slices.Clone(st.keys), op.Unmatched...)))
			tables[op.Table] = append(tables[op.Table], &contentRows{st: st, skip: slices.Compact(skip),
				byContent: map[string][]string{}, contentOf: map[string]string{}, keyVals: map[string][]any{}})
		}
	}
	if len(tables) == 0 {
		return 0, nil
	}
	snapshot := ops[len(ops)-1].TS // nothing of the batch is applied yet
	for id, crs := range tables {
		for _, cr := range crs {
			if err := r.loadContent(ctx, cr, ops, id, snapshot); err != nil {
				return 0, err
			}
		}
	}
	for i := range ops {
		op := &ops[i]
		crs := tables[op.Table]
		if len(crs) == 0 {
			continue
		}
		if op.ByContent {
			if err := contentFor(crs, op).find(op); err != nil {
				return i, r.opError(&step{op: op, st: crs[0].st}, err)
			}
		}
		for _, cr := range crs {
			if err := cr.follow(r, op); err != nil {
				return i, r.opError(&step{op: op, st: cr.st}, err)
			}
		}
	}
	return 0, nil
}

// contentFor is the follower that compares the columns op compares.
func contentFor(crs []*contentRows, op *change.Op) *contentRows {
	for _, cr := range crs {
		if cr.skips(op) {
			return cr
		}
	}
	return nil
}

// skips says whether cr compares exactly the columns op does.
func (cr *contentRows) skips(op *change.Op) bool {
	for _, c := range op.Unmatched {
		if !slices.Contains(cr.skip, c) {
			return false
		}
	}
	for _, c := range cr.skip {
		if !slices.Contains(cr.st.keys, c) && !slices.Contains(op.Unmatched, c) {
			return false
		}
	}
	return true
}

// loadContent reads the table's live rows whose content a ByContent
// operation of the batch compared as cr compares asks for.
func (r *Replayer) loadContent(ctx context.Context, cr *contentRows, ops []change.Op, table uint32, snapshot uint64) error {
	wanted := map[string]bool{}
	for i := range ops {
		if op := &ops[i]; op.Table == table && op.ByContent && cr.skips(op) {
			c, err := cr.content(op.Before)
			if err != nil {
				return r.opError(&step{op: op, st: cr.st}, err)
			}
			wanted[c] = true
		}
	}
	files := r.cfg.Catalog.Snapshot().LiveFiles(table)
	return r.cfg.Rows.EachRow(ctx, cr.st.table, files, snapshot, func(row []any) error {
		c, err := cr.content(row)
		if err != nil {
			return err
		}
		if !wanted[c] {
			return nil
		}
		return cr.put(r, row, c)
	})
}

// find sets the key of an operation that names its row by content: the
// smallest key among the live rows with that content.
func (cr *contentRows) find(op *change.Op) error {
	c, err := cr.content(op.Before)
	if err != nil {
		return err
	}
	keys := cr.byContent[c]
	if len(keys) == 0 {
		return fmt.Errorf("%w: no live row has the values %v", index.ErrConflict, cr.shown(op.Before))
	}
	k := slices.MinFunc(keys, func(a, b string) int { return bytes.Compare([]byte(a), []byte(b)) })
	op.Key = slices.Clone(cr.keyVals[k])
	op.Before = cr.withKey(op.Before, op.Key)
	if op.Kind == change.Update {
		op.Row = cr.withKey(op.Row, op.Key)
	}
	return nil
}

// follow applies one operation, its key known, to the followed rows.
func (cr *contentRows) follow(r *Replayer, op *change.Op) error {
	switch op.Kind {
	case change.Insert, change.Upsert:
		return cr.replace(r, op.Row)
	case change.Update:
		if op.Key != nil {
			if err := cr.drop(r, op.Key); err != nil {
				return err
			}
		}
		return cr.replace(r, op.Row)
	case change.Delete:
		key := op.Key
		if key == nil {
			if len(op.Before) != len(cr.st.cols) {
				return nil // the replay itself reports the malformed operation
			}
			key = pick(op.Before, cr.st.keys)
		}
		return cr.drop(r, key)
	case change.Truncate:
		clear(cr.byContent)
		clear(cr.contentOf)
		clear(cr.keyVals)
	}
	return nil
}

// replace follows a row written under its key, replacing what the key held.
func (cr *contentRows) replace(r *Replayer, row []any) error {
	if len(row) != len(cr.st.cols) {
		return nil // the replay itself reports the malformed operation
	}
	if err := cr.drop(r, pick(row, cr.st.keys)); err != nil {
		return err
	}
	c, err := cr.content(row)
	if err != nil {
		return err
	}
	return cr.put(r, row, c)
}

func (cr *contentRows) put(r *Replayer, row []any, content string) error {
	keyVals := pick(row, cr.st.keys)
	k, err := r.cfg.Index.Key(cr.st.table.PrimaryIndexID, keyVals...)
	if err != nil {
		return err
	}
	key := string(k.Bytes())
	cr.byContent[content] = append(cr.byContent[content], key)
	cr.contentOf[key] = content
	cr.keyVals[key] = keyVals
	return nil
}

// drop forgets the row under a key, if it is followed.
func (cr *contentRows) drop(r *Replayer, keyVals []any) error {
	k, err := r.cfg.Index.Key(cr.st.table.PrimaryIndexID, keyVals...)
	if err != nil {
		return err
	}
	key := string(k.Bytes())
	c, ok := cr.contentOf[key]
	if !ok {
		return nil
	}
	keys := cr.byContent[c]
	if i := slices.Index(keys, key); i >= 0 {
		keys = slices.Delete(keys, i, i+1)
	}
	if len(keys) == 0 {
		delete(cr.byContent, c)
	} else {
		cr.byContent[c] = keys
	}
	delete(cr.contentOf, key)
	delete(cr.keyVals, key)
	return nil
}

// withKey is a copy of row with the key columns set to keyVals.
func (cr *contentRows) withKey(row, keyVals []any) []any {
	if len(row) != len(cr.st.cols) {
		return row
	}
	out := slices.Clone(row)
	for i, c := range cr.st.keys {
		out[c] = keyVals[i]
	}
	return out
}

// shown is row without the columns not compared, for messages.
func (cr *contentRows) shown(row []any) []any {
	var out []any
	for i, v := range row {
		if !slices.Contains(cr.skip, i) {
			out = append(out, v)
		}
	}
	return out
}

// content encodes the compared columns of a row, so that values
// equal as stored encode equally (a float4 column's value is compared as
// float4; NaN equals NaN as PostgreSQL's sorting has it).
func (cr *contentRows) content(row []any) (string, error) {
	if len(row) != len(cr.st.cols) {
		return "", fmt.Errorf("row has %d values for %d columns", len(row), len(cr.st.cols))
	}
	var b []byte
	for i, v := range row {
		if slices.Contains(cr.skip, i) {
			continue
		}
		switch v := v.(type) {
		case nil:
			b = append(b, 'n')
		case int64:
			b = binary.BigEndian.AppendUint64(append(b, 'i'), uint64(v))
		case float64:
			if cr.st.table.Schema.Columns[i].Type.Kind == types.Float32 {
				v = float64(float32(v))
			}
			if math.IsNaN(v) {
				v = math.NaN()
			}
			b = binary.BigEndian.AppendUint64(append(b, 'f'), math.Float64bits(v))
		case decimal128.Num:
			b = binary.BigEndian.AppendUint64(append(b, 'd'), uint64(v.HighBits()))
			b = binary.BigEndian.AppendUint64(b, v.LowBits())
		case string:
			b = append(binary.AppendUvarint(append(b, 's'), uint64(len(v))), v...)
		case []byte:
			b = append(binary.AppendUvarint(append(b, 'b'), uint64(len(v))), v...)
		case bool:
			if v {
				b = append(b, 'T')
			} else {
				b = append(b, 'F')
			}
		case types.DateDays:
			b = binary.BigEndian.AppendUint32(append(b, 'D'), uint32(v))
		case types.TimestampMicros:
			b = binary.BigEndian.AppendUint64(append(b, 't'), uint64(v))
		default:
			return "", fmt.Errorf("column %s holds a %T, which has no content encoding", cr.st.table.Schema.Columns[i].Name, v)
		}
	}
	return string(b), nil
}
