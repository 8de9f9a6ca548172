package sqlstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/retinadb/retina/internal/oltp/skeena"
)

// Row is a stored row: its column values (package types' representation)
// and its primary key (the hidden row id for tables without one).
type Row struct {
	Vals []any
	PK   []any
}

// DuplicateKeyError is an insert or update that would repeat a primary or
// unique key.
type DuplicateKeyError struct {
	Table, Key string
}

func (e *DuplicateKeyError) Error() string {
	return fmt.Sprintf("table %s: duplicate entry for key %s", e.Table, e.Key)
}

// NullError is a NULL in a NOT NULL column.
type NullError struct{ Table, Column string }

func (e *NullError) Error() string {
	return fmt.Sprintf("table %s: column %s cannot be null", e.Table, e.Column)
}

// Rows performs row operations of one transaction.
type Rows struct {
	Tx  *skeena.Tx
	Cat *Catalog
}

func (r Rows) checkNulls(t *Table, vals []any) error {
	if len(vals) != len(t.Columns) {
		return fmt.Errorf("table %s: %d values for %d columns", t.Name, len(vals), len(t.Columns))
	}
	for i := range t.Columns {
		if vals[i] == nil && !t.Columns[i].Nullable {
			return &NullError{Table: t.Name, Column: t.Columns[i].Name}
		}
	}
	return nil
}

// Insert adds a row; a primary or unique key already present fails with
// DuplicateKeyError.
func (r Rows) Insert(ctx context.Context, t *Table, vals []any) error {
	if err := r.checkNulls(t, vals); err != nil {
		return err
	}
	var pk []any
	if t.HiddenPK() {
		id, err := r.Cat.NextRowID()
		if err != nil {
			return fmt.Errorf("table %s: %w", t.Name, err)
		}
		pk = []any{id}
	} else {
		pk = t.pkValues(vals, 0)
	}
	key, err := t.rowKey(pk)
	if err != nil {
		return err
	}
	if !t.HiddenPK() {
		if _, ok, err := r.Tx.Get(ctx, t.physical(), key); err != nil {
			return err
		} else if ok {
			return &DuplicateKeyError{Table: t.Name, Key: "PRIMARY"}
		}
	}
	enc, err := t.encodeRow(vals)
	if err != nil {
		return fmt.Errorf("table %s: %w", t.Name, err)
	}
	if err := r.Tx.Put(ctx, t.physical(), key, enc); err != nil {
		return err
	}
	for i := range t.Indexes {
		if err := r.putEntry(ctx, t, &t.Indexes[i], vals, pk); err != nil {
			return err
		}
	}
	changes(r.Tx).record(t, key, pk, false, vals)
	return nil
}

func (r Rows) putEntry(ctx context.Context, t *Table, ix *Index, vals, pk []any) error {
	k, unique, err := t.indexKey(ix, vals, pk)
	if err != nil {
		return err
	}
	if unique {
		if _, ok, err := r.Tx.Get(ctx, t.physical(), k); err != nil {
			return err
		} else if ok {
			return &DuplicateKeyError{Table: t.Name, Key: ix.Name}
		}
	}
	v, err := t.encodePK(pk)
	if err != nil {
		return err
	}
	return r.Tx.Put(ctx, t.physical(), k, v)
}

func (r Rows) deleteEntry(ctx context.Context, t *Table, ix *Index, vals, pk []any) error {
	k, _, err := t.indexKey(ix, vals, pk)
	if err != nil {
		return err
	}
	return r.Tx.Delete(ctx, t.physical(), k)
}

// Delete removes a row read in this transaction.
func (r Rows) Delete(ctx context.Context, t *Table, row Row) error {
	key, err := t.rowKey(row.PK)
	if err != nil {
		return err
	}
	if err := r.Tx.Delete(ctx, t.physical(), key); err != nil {
		return err
	}
	for i := range t.Indexes {
		if err := r.deleteEntry(ctx, t, &t.Indexes[i], row.Vals, row.PK); err != nil {
			return err
		}
	}
	changes(r.Tx).record(t, key, row.PK, true, nil)
	return nil
}

// Update replaces a row read in this transaction with vals. A changed
// primary key moves the row (and fails if the new key is taken).
func (r Rows) Update(ctx context.Context, t *Table, row Row, vals []any) error {
	if err := r.checkNulls(t, vals); err != nil {
		return err
	}
	newPK := row.PK
	if !t.HiddenPK() {
		newPK = t.pkValues(vals, 0)
	}
	oldKey, err := t.rowKey(row.PK)
	if err != nil {
		return err
	}
	newKey, err := t.rowKey(newPK)
	if err != nil {
		return err
	}
	moved := !bytes.Equal(oldKey, newKey)
	if moved {
		if _, ok, err := r.Tx.Get(ctx, t.physical(), newKey); err != nil {
			return err
		} else if ok {
			return &DuplicateKeyError{Table: t.Name, Key: "PRIMARY"}
		}
		if err := r.Tx.Delete(ctx, t.physical(), oldKey); err != nil {
			return err
		}
	}
	enc, err := t.encodeRow(vals)
	if err != nil {
		return fmt.Errorf("table %s: %w", t.Name, err)
	}
	if err := r.Tx.Put(ctx, t.physical(), newKey, enc); err != nil {
		return err
	}
	for i := range t.Indexes {
		ix := &t.Indexes[i]
		oldK, _, err := t.indexKey(ix, row.Vals, row.PK)
		if err != nil {
			return err
		}
		newK, _, err := t.indexKey(ix, vals, newPK)
		if err != nil {
			return err
		}
		if bytes.Equal(oldK, newK) {
			if moved { // same entry, new primary key in its value
				v, err := t.encodePK(newPK)
				if err != nil {
					return err
				}
				if err := r.Tx.Put(ctx, t.physical(), newK, v); err != nil {
					return err
				}
			}
			continue
		}
		if err := r.Tx.Delete(ctx, t.physical(), oldK); err != nil {
			return err
		}
		if err := r.putEntry(ctx, t, ix, vals, newPK); err != nil {
			return err
		}
	}
	if cs := changes(r.Tx); cs != nil {
		if moved {
			cs.record(t, oldKey, row.PK, true, nil)
		}
		cs.record(t, newKey, newPK, !moved, vals)
	}
	return nil
}

// Lock makes the row part of this transaction's write set, so a concurrent
// writer of it conflicts (SELECT … FOR UPDATE under snapshot isolation).
func (r Rows) Lock(ctx context.Context, t *Table, row Row) error {
	key, err := t.rowKey(row.PK)
	if err != nil {
		return err
	}
	enc, err := t.encodeRow(row.Vals)
	if err != nil {
		return err
	}
	return r.Tx.Put(ctx, t.physical(), key, enc)
}

// Get reads the row with primary key pk.
func (r Rows) Get(ctx context.Context, t *Table, pk []any) (Row, bool, error) {
	key, err := t.rowKey(pk)
	if err != nil {
		return Row{}, false, err
	}
	v, ok, err := r.Tx.Get(ctx, t.physical(), key)
	if err != nil || !ok {
		return Row{}, false, err
	}
	vals, err := t.decodeRow(v)
	if err != nil {
		return Row{}, false, err
	}
	return Row{Vals: vals, PK: pk}, true, nil
}

// Range is a key range of one index: keys with lo ≤ key < hi. Build its
// bounds with KeyPrefix and KeyEnd.
type Range struct {
	Index  uint32 // 0: the primary key
	Lo, Hi []byte
}

// FullRange covers every row of t by primary key.
func FullRange(t *Table) Range {
	lo, _ := KeyPrefix(t, 0, nil)
	return Range{Lo: lo, Hi: KeyEnd(lo)}
}

// Scan reads the rows in rg in key order, at most limit of them (0: all).
func (r Rows) Scan(ctx context.Context, t *Table, rg Range, limit int) ([]Row, error) {
	if rg.Index == 0 {
		var out []Row
		var decErr error
		err := r.Tx.Scan(ctx, t.physical(), "", rg.Lo, rg.Hi, func(key, v []byte) bool {
			vals, err := t.decodeRow(v)
			if err != nil {
				decErr = err
				return false
			}
			pk, err := t.pkFromKey(key)
			if err != nil {
				decErr = err
				return false
			}
			out = append(out, Row{Vals: vals, PK: pk})
			return limit <= 0 || len(out) < limit
		})
		return out, errors.Join(err, decErr)
	}
	var pks [][]any
	var decErr error
	err := r.Tx.Scan(ctx, t.physical(), "", rg.Lo, rg.Hi, func(_, v []byte) bool {
		pk, err := t.decodePK(v)
		if err != nil {
			decErr = err
			return false
		}
		pks = append(pks, pk)
		return limit <= 0 || len(pks) < limit
	})
	if err := errors.Join(err, decErr); err != nil {
		return nil, err
	}
	out := make([]Row, 0, len(pks))
	for _, pk := range pks {
		row, ok, err := r.Get(ctx, t, pk)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("table %s: an index entry names a row that does not exist; the index is inconsistent", t.Name)
		}
		out = append(out, row)
	}
	return out, nil
}

func (t *Table) pkFromKey(key []byte) ([]any, error) {
	if len(key) < 4 {
		return nil, fmt.Errorf("table %s: short key %x", t.Name, key)
	}
	return t.decodePK(key[4:])
}

// DefinitionSQL renders t as CREATE TABLE text (SHOW CREATE TABLE).
func (t *Table) DefinitionSQL() string {
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE `%s` (\n", t.Name)
	for i, c := range t.Columns {
		fmt.Fprintf(&b, "  `%s` %s", c.Name, c.SQLType)
		if !c.Nullable {
			b.WriteString(" NOT NULL")
		}
		if c.HasDefault {
			fmt.Fprintf(&b, " DEFAULT %s", c.Default)
		}
		if i < len(t.Columns)-1 || len(t.PK) > 0 || len(t.Indexes) > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	names := func(cols []int) string {
		s := make([]string, len(cols))
		for i, c := range cols {
			s[i] = "`" + t.Columns[c].Name + "`"
		}
		return strings.Join(s, ",")
	}
	if len(t.PK) > 0 {
		fmt.Fprintf(&b, "  PRIMARY KEY (%s)", names(t.PK))
		if len(t.Indexes) > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	for i, ix := range t.Indexes {
		kw := "KEY"
		if ix.Unique {
			kw = "UNIQUE KEY"
		}
		fmt.Fprintf(&b, "  %s `%s` (%s)", kw, ix.Name, names(ix.Columns))
		if i < len(t.Indexes)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	engine := "MEMORY"
	if t.Engine == EngineStorage {
		engine = "InnoDB"
	}
	fmt.Fprintf(&b, ") ENGINE=%s", engine)
	return b.String()
}

// ScanPoint reads the row whose primary key is exactly rg.Lo (a range made
// from every primary-key column): a point read instead of a scan.
func (r Rows) ScanPoint(ctx context.Context, t *Table, rg Range) ([]Row, error) {
	v, ok, err := r.Tx.Get(ctx, t.physical(), rg.Lo)
	if err != nil || !ok {
		return nil, err
	}
	vals, err := t.decodeRow(v)
	if err != nil {
		return nil, err
	}
	pk, err := t.pkFromKey(rg.Lo)
	if err != nil {
		return nil, err
	}
	return []Row{{Vals: vals, PK: pk}}, nil
}
