package query

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/duckdb/duckdb-go/v2"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/scan"
	"github.com/retinadb/retina/internal/types"
)

// Point lookups: a SELECT of one table whose WHERE says pk = value (a
// constant or a parameter) reads through retina_lookup(table, value)
// instead of retina_scan(table) (pgrewrite.go rewrites it; the WHERE stays).
// At a statement's own snapshot, which is registered and so at or above
// LWM, the index has the version of the key visible there: one index
// lookup, one main-index locate, one visibility bit and one row read. Where
// the index may no longer know the snapshot (a checkpointed view's
// snapshot can be below LWM) or the key cannot be made, it scans the
// table and keeps the rows with that key, as retina_scan and the WHERE
// would.

// KeyIndex is what point lookups need of the index service.
type KeyIndex interface {
	Key(id uint32, vals ...any) (index.Key, error)
	Lookup(ctx context.Context, k index.Key, ts uint64) (rowID uint64, found bool, err error)
	Locate(ctx context.Context, rowID uint64) (index.Location, error)
}

// lookupFunction is retina_lookup(table, key): the rows of table whose
// single-column primary key equals key (text), at the statement's snapshot.
func (e *Engine) lookupFunction() duckdb.RowTableFunction {
	varchar, _ := duckdb.NewTypeInfo(duckdb.TYPE_VARCHAR)
	return duckdb.RowTableFunction{
		Config: duckdb.TableFunctionConfig{Arguments: []duckdb.TypeInfo{varchar, varchar}},
		BindArgumentsContext: func(ctx context.Context, _ map[string]any, args ...any) (duckdb.RowTableSource, error) {
			name, _ := args[0].(string)
			key, hasKey := args[1].(string)
			b, err := e.bindTable(ctx, name)
			if err != nil {
				return nil, err
			}
			return &lookupSource{e: e, ctx: ctx, table: b.table, snap: b.snap, view: b.view, key: key, hasKey: hasKey, infos: b.infos}, nil
		},
	}
}

// lookupSource is one invocation of retina_lookup.
type lookupSource struct {
	e      *Engine
	ctx    context.Context
	table  *catalog.Table
	snap   *catalog.Snapshot
	view   *readView // nil while DuckDB only prepares the statement
	key    string
	hasKey bool
	infos  []duckdb.ColumnInfo

	rows [][]any // found at Init, handed out by FillRow
	err  error
}

func (s *lookupSource) ColumnInfos() []duckdb.ColumnInfo { return s.infos }

func (s *lookupSource) Cardinality() *duckdb.CardinalityInfo {
	return &duckdb.CardinalityInfo{Cardinality: 1}
}

func (s *lookupSource) Init() {
	if s.view == nil || !s.hasKey {
		return // preparing, or a NULL key: no row
	}
	s.rows, s.err = s.find()
}

func (s *lookupSource) FillRow(row duckdb.Row) (bool, error) {
	if s.err != nil {
		return false, s.err
	}
	if len(s.rows) == 0 {
		return false, nil
	}
	r := s.rows[0]
	s.rows = s.rows[1:]
	for i, v := range r {
		dv, err := duckValue(s.table.Schema.Columns[i].Type, v)
		if err != nil {
			return false, err
		}
		if err := row.SetRowValue(i, dv); err != nil {
			return false, fmt.Errorf("query: %s column %s: %w", s.table.Name, s.table.Schema.Columns[i].Name, err)
		}
	}
	return true, nil
}

// find is the rows of the table with the key, at the view's snapshot.
func (s *lookupSource) find() ([][]any, error) {
	pk := s.table.Schema.PrimaryKey
	if len(pk) != 1 {
		return s.scanFor()
	}
	col := s.table.Schema.ColumnIndex(pk[0])
	val, err := parseKey(s.table.Schema.Columns[col].Type, s.key)
	if err != nil {
		return nil, nil // no value of the key's type: no row has it
	}
	idx := s.e.cfg.Index
	if idx == nil || s.view.isFrozen() {
		return s.scanFor()
	}
	k, err := idx.Key(s.table.PrimaryIndexID, val)
	if err != nil {
		return s.scanFor()
	}
	s.e.lookups.Add(1)
	rowID, found, err := idx.Lookup(s.ctx, k, s.view.ts)
	if err != nil {
		return nil, fmt.Errorf("query: lookup in %s: %w", s.table.Name, err)
	}
	if !found {
		return nil, nil
	}
	loc, err := idx.Locate(s.ctx, rowID)
	if errors.Is(err, index.ErrNotFound) {
		return s.scanFor() // moved by storage GC meanwhile
	} else if err != nil {
		return nil, fmt.Errorf("query: locate a row of %s: %w", s.table.Name, err)
	}
	f, ok := s.snap.File(loc.FileID)
	if !ok {
		return s.scanFor() // in a file newer than the statement's catalog
	}
	vis, err := s.e.cfg.Scanner.Visibility(f)
	if err != nil {
		return s.scanFor()
	}
	bm, bit, err := s.view.DeletedRange(f.ID, vis, int(loc.Offset), 1, nil)
	if err != nil {
		return nil, err
	}
	if len(bm) > 0 && bm[0]&(1<<uint(bit)) != 0 {
		return nil, nil // the index's row, deleted at the snapshot
	}
	row, err := s.e.cfg.Scanner.ReadRow(s.ctx, s.table, f, loc.Offset)
	if err != nil {
		return nil, err
	}
	if !keyEqual(row[col], val) {
		return s.scanFor() // not the key's row: trust the scan
	}
	return [][]any{row}, nil
}

// scanFor scans the table at the view and keeps the rows with the key.
func (s *lookupSource) scanFor() ([][]any, error) {
	s.e.lookupScans.Add(1)
	col := s.table.Schema.ColumnIndex(s.table.Schema.PrimaryKey[0])
	val, err := parseKey(s.table.Schema.Columns[col].Type, s.key)
	if err != nil {
		return nil, nil
	}
	req := scan.Request{Table: s.table, Files: s.snap.LiveFiles(s.table.ID), Snapshot: s.view.ts, Deleted: s.view}
	for i := range s.table.Schema.Columns {
		req.Columns = append(req.Columns, i)
	}
	var out [][]any
	_, err = s.e.cfg.Scanner.Scan(s.ctx, req, func(rec arrow.RecordBatch) error {
		for i := range int(rec.NumRows()) {
			v, err := scan.Value(rec.Column(col), i)
			if err != nil {
				return err
			}
			if !keyEqual(v, val) {
				continue
			}
			row := make([]any, rec.NumCols())
			for c := range row {
				if row[c], err = scan.Value(rec.Column(c), i); err != nil {
					return err
				}
			}
			out = append(out, row)
		}
		return nil
	})
	return out, err
}

// parseKey reads a key's text as the key column's value, for the kinds
// point lookups serve (integers and strings).
func parseKey(t types.Type, text string) (any, error) {
	switch t.Kind {
	case types.Int8, types.Int16, types.Int32, types.Int64:
		n, err := strconv.ParseInt(text, 10, int(t.Kind.IntBits()))
		return n, err
	case types.String:
		return text, nil
	}
	return nil, fmt.Errorf("query: no point lookup on a %s key", t)
}

func keyEqual(a, b any) bool { return a == b }

// pointLookupKind says whether a key column's kind is one point lookups serve.
func pointLookupKind(t types.Type) bool {
	_, err := parseKey(t, "0")
	return err == nil
}

// duckValue turns a stored value into what DuckDB takes for the column.
func duckValue(t types.Type, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	switch t.Kind {
	case types.Int8:
		return int8(v.(int64)), nil
	case types.Int16:
		return int16(v.(int64)), nil
	case types.Int32:
		return int32(v.(int64)), nil
	case types.Float32:
		return float32(v.(float64)), nil
	case types.Decimal:
		d := v.(decimal128.Num)
		return duckdb.Decimal{Width: uint8(t.Precision), Scale: uint8(t.Scale), Value: new(big.Int).Set(d.BigInt())}, nil
	case types.Date:
		return time.Unix(int64(v.(types.DateDays))*86400, 0).UTC(), nil
	case types.Timestamp, types.TimestampTZ:
		return time.UnixMicro(int64(v.(types.TimestampMicros))).UTC(), nil
	}
	return v, nil
}
