package query

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/duckdb/duckdb-go/v2"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/scan"
	"github.com/retinadb/retina/internal/types"
)

type viewKey struct{}

// statementView is one execution of a statement: its read view and what
// its table functions plan with. They bind one after another; planning
// once per statement keeps them reading one catalog and one native split,
// so no file is read twice or missed.
type statementView struct {
	view *readView

	mu     sync.Mutex
	pinned *catalog.Snapshot
	splits map[uint32]*nativeSplit
}

// withView carries a statement's read view to the table functions and the
// retina_snapshot() function, which DuckDB calls with the statement's ctx.
func withView(ctx context.Context, v *readView) context.Context {
	return context.WithValue(ctx, viewKey{}, &statementView{view: v})
}

func viewOf(ctx context.Context) (*readView, bool) {
	sv, ok := statementOf(ctx)
	if !ok {
		return nil, false
	}
	return sv.view, true
}

func statementOf(ctx context.Context) (*statementView, bool) {
	sv, ok := ctx.Value(viewKey{}).(*statementView)
	return sv, ok && sv != nil && sv.view != nil
}

// catalog is the catalog the statement plans with: the first its table
// functions found.
func (sv *statementView) catalog(c Catalog) *catalog.Snapshot {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.pinned == nil {
		sv.pinned = sv.view.catalogFor(c)
	}
	return sv.pinned
}

// errNoSnapshot reports a scan outside a Retina statement.
var errNoSnapshot = errors.New("query: retina_scan ran without a statement snapshot")

// duckTypes are DuckDB's types for the column kinds, and their SQL names;
// a decimal's depend on its precision and scale.
var duckTypes = map[types.Kind]struct {
	t   duckdb.Type
	sql string
}{
	types.Int8: {duckdb.TYPE_TINYINT, "TINYINT"}, types.Int16: {duckdb.TYPE_SMALLINT, "SMALLINT"},
	types.Int32: {duckdb.TYPE_INTEGER, "INTEGER"}, types.Int64: {duckdb.TYPE_BIGINT, "BIGINT"},
	types.Float32: {duckdb.TYPE_FLOAT, "FLOAT"}, types.Float64: {duckdb.TYPE_DOUBLE, "DOUBLE"},
	types.String: {duckdb.TYPE_VARCHAR, "VARCHAR"}, types.Bytes: {duckdb.TYPE_BLOB, "BLOB"},
	types.Bool: {duckdb.TYPE_BOOLEAN, "BOOLEAN"}, types.Date: {duckdb.TYPE_DATE, "DATE"},
	types.Timestamp: {duckdb.TYPE_TIMESTAMP, "TIMESTAMP"}, types.TimestampTZ: {duckdb.TYPE_TIMESTAMP_TZ, "TIMESTAMPTZ"},
}

// duckType maps a column type to DuckDB's.
func duckType(t types.Type) (duckdb.TypeInfo, error) {
	if t.Kind == types.Decimal {
		return duckdb.NewDecimalInfo(t.Precision, t.Scale)
	}
	d, ok := duckTypes[t.Kind]
	if !ok {
		return nil, fmt.Errorf("query: no DuckDB type for %s", t)
	}
	return duckdb.NewTypeInfo(d.t)
}

// scanFunction is the retina_scan(table) table function: the rows of a
// table visible at the statement's snapshot, with projection pushdown and
// one split per thread at a time.
//
// With rest, it is retina_scan_rest(table): the same, less the files the
// statement reads natively (native.go).
func (e *Engine) scanFunction(rest bool) duckdb.ParallelChunkTableFunction {
	varchar, _ := duckdb.NewTypeInfo(duckdb.TYPE_VARCHAR)
	return duckdb.ParallelChunkTableFunction{
		Config: duckdb.TableFunctionConfig{Arguments: []duckdb.TypeInfo{varchar}},
		BindArgumentsContext: func(ctx context.Context, _ map[string]any, args ...any) (duckdb.ParallelChunkTableSource, error) {
			name, _ := args[0].(string)
			b, err := e.bindTable(ctx, name)
			if err != nil {
				return nil, err
			}
			files := b.snap.LiveFiles(b.table.ID)
			if rest && b.stmt != nil {
				// The files the statement's read_parquet does not read.
				split, err := e.splitFor(b)
				if err != nil {
					return nil, err
				}
				files = slices.DeleteFunc(files, func(f *catalog.File) bool { return split.ids[f.ID] })
			}
			return &tableSource{e: e, table: b.table, files: files, view: b.view, ctx: ctx, infos: b.infos}, nil
		},
	}
}

// boundTable is what a table function binds to: the table as the
// statement's view sees it, and its columns in DuckDB's types.
type boundTable struct {
	view  *readView      // nil while DuckDB only prepares the statement
	stmt  *statementView // nil with view
	snap  *catalog.Snapshot
	table *catalog.Table
	infos []duckdb.ColumnInfo
}

func (e *Engine) bindTable(ctx context.Context, name string) (boundTable, error) {
	var b boundTable
	sv, hasView := statementOf(ctx)
	b.snap = e.cfg.Catalog.Snapshot()
	if hasView {
		b.view, b.stmt, b.snap = sv.view, sv, sv.catalog(e.cfg.Catalog)
	}
	t, ok := b.snap.Table(name)
	if !ok {
		return b, fmt.Errorf("query: table %q does not exist", name)
	}
	b.table = t
	for _, c := range t.Schema.Columns {
		ti, err := duckType(c.Type)
		if err != nil {
			return b, err
		}
		b.infos = append(b.infos, duckdb.ColumnInfo{Name: c.Name, T: ti})
	}
	return b, nil
}

// tableSource is one invocation of retina_scan.
type tableSource struct {
	e     *Engine
	table *catalog.Table
	files []*catalog.File
	view  *readView // nil while DuckDB only prepares the statement
	ctx   context.Context
	infos []duckdb.ColumnInfo

	once      sync.Once
	projected []int // table columns DuckDB asked for, in chunk order
	mu        sync.Mutex
	splits    []scan.Split
	err       error
}

func (s *tableSource) ColumnInfos() []duckdb.ColumnInfo { return s.infos }

func (s *tableSource) Cardinality() *duckdb.CardinalityInfo {
	var n uint
	for _, f := range s.files {
		n += uint(f.Rows())
	}
	return &duckdb.CardinalityInfo{Cardinality: n}
}

// request is a scan of the table at the statement's view.
func (s *tableSource) request() scan.Request {
	req := scan.Request{Table: s.table, Files: s.files, Columns: s.projected}
	if s.view != nil {
		req.Snapshot, req.Deleted = s.view.ts, s.view
	}
	return req
}

func (s *tableSource) Init() duckdb.ParallelTableSourceInfo {
	req := s.request()
	s.splits, _ = s.e.cfg.Scanner.Plan(req)
	return duckdb.ParallelTableSourceInfo{MaxThreads: max(1, min(len(s.splits), s.e.cfg.Threads))}
}

// localScan is one DuckDB thread's position in its current split.
type localScan struct {
	recs []selected
	rec  int
	row  int
}

// selected is a scanned record and the positions of its visible rows (nil:
// all rows), so visible rows are picked while copying into DuckDB's chunk
// instead of being copied out first.
type selected struct {
	rec arrow.RecordBatch
	pos []int32
}

func (s selected) rows() int {
	if s.pos == nil {
		return int(s.rec.NumRows())
	}
	return len(s.pos)
}

// positions lists the set bits of a mask.
func positions(mask []uint64, visible int) []int32 {
	out := make([]int32, 0, visible)
	for w, m := range mask {
		for m != 0 {
			out = append(out, int32(w*64+bits.TrailingZeros64(m)))
			m &= m - 1
		}
	}
	return out
}

func (s *tableSource) NewLocalState() any { return &localScan{} }

// next hands out the next split, or false when none is left.
func (s *tableSource) next() (scan.Split, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.splits) == 0 {
		return scan.Split{}, false
	}
	sp := s.splits[0]
	s.splits = s.splits[1:]
	return sp, true
}

func (s *tableSource) FillChunk(local any, chunk duckdb.DataChunk) error {
	ls := local.(*localScan)
	if s.view == nil {
		return errNoSnapshot
	}
	s.once.Do(func() {
		// The chunk has vectors only for the columns the query needs.
		for c := range s.infos {
			if _, err := chunk.GetVector(c); err == nil {
				s.projected = append(s.projected, c)
			}
		}
	})
	for ls.rec >= len(ls.recs) {
		for _, r := range ls.recs {
			r.rec.Release()
		}
		ls.recs, ls.rec, ls.row = ls.recs[:0], 0, 0
		sp, ok := s.next()
		if !ok {
			return chunk.SetSize(0)
		}
		req := s.request()
		var st scan.Stats
		err := s.e.cfg.Scanner.ScanSplitSelected(s.ctx, req, sp, &st, func(r arrow.RecordBatch, mask []uint64, visible int) error {
			sel := selected{rec: r}
			if mask != nil {
				sel.pos = positions(mask, visible)
			}
			ls.recs = append(ls.recs, sel)
			return nil
		})
		if err != nil {
			return err
		}
		s.e.rowsRead.Add(st.RowsRead)
		s.e.rowsOut.Add(st.RowsOut)
	}
	cur := ls.recs[ls.rec]
	n := min(cur.rows()-ls.row, 2048)
	at := func(r int) int { return ls.row + r }
	if cur.pos != nil {
		pos := cur.pos[ls.row : ls.row+n]
		at = func(r int) int { return int(pos[r]) }
	}
	for i, c := range s.projected {
		if err := copyColumn(chunk, c, cur.rec.Column(i), n, at); err != nil {
			return fmt.Errorf("query: %s.%s: %w", s.table.Name, s.infos[c].Name, err)
		}
	}
	ls.row += n
	if ls.row == cur.rows() {
		ls.rec++
		ls.row = 0
	}
	return chunk.SetSize(n)
}

// copyColumn writes n rows of an Arrow column into a chunk: chunk row r
// gets source row at(r).
func copyColumn(chunk duckdb.DataChunk, col int, a arrow.Array, n int, at func(int) int) error {
	switch a := a.(type) {
	case *array.Int8:
		return copyTyped(chunk, col, n, at, a.IsNull, a.Value)
	case *array.Int16:
		return copyTyped(chunk, col, n, at, a.IsNull, a.Value)
	case *array.Int32:
		return copyTyped(chunk, col, n, at, a.IsNull, a.Value)
	case *array.Int64:
		return copyTyped(chunk, col, n, at, a.IsNull, a.Value)
	case *array.Float32:
		return copyTyped(chunk, col, n, at, a.IsNull, a.Value)
	case *array.Float64:
		return copyTyped(chunk, col, n, at, a.IsNull, a.Value)
	case *array.String:
		return copyTyped(chunk, col, n, at, a.IsNull, a.Value)
	case *array.Binary:
		return copyTyped(chunk, col, n, at, a.IsNull, a.Value)
	case *array.Boolean:
		return copyTyped(chunk, col, n, at, a.IsNull, a.Value)
	case *array.Decimal128:
		dt := a.DataType().(*arrow.Decimal128Type)
		// The chunk copies the value at once, so one big.Int serves every
		// row that fits 64 bits: no allocation per value.
		scratch := new(big.Int)
		return copyTyped(chunk, col, n, at, a.IsNull, func(i int) duckdb.Decimal {
			v := a.Value(i)
			d := duckdb.Decimal{Width: uint8(dt.Precision), Scale: uint8(dt.Scale), Value: scratch}
			if hi, lo := v.HighBits(), v.LowBits(); hi == 0 && lo < 1<<63 || hi == -1 && lo >= 1<<63 {
				scratch.SetInt64(int64(lo))
			} else {
				d.Value = v.BigInt()
			}
			return d
		})
	case *array.Date32:
		return copyTyped(chunk, col, n, at, a.IsNull, func(i int) time.Time { return a.Value(i).ToTime() })
	case *array.Timestamp:
		return copyTyped(chunk, col, n, at, a.IsNull, func(i int) time.Time { return time.UnixMicro(int64(a.Value(i))).UTC() })
	}
	return fmt.Errorf("no copy for Arrow type %s", a.DataType())
}

// copyTyped copies values of one Go type; SetChunkValue keeps the type, so
// no value is boxed.
func copyTyped[T any](chunk duckdb.DataChunk, col, n int, at func(int) int, isNull func(int) bool, value func(int) T) error {
	for r := range n {
		i := at(r)
		if isNull(i) {
			if err := chunk.SetValue(col, r, nil); err != nil {
				return err
			}
			continue
		}
		if err := duckdb.SetChunkValue(chunk, col, r, value(i)); err != nil {
			return err
		}
	}
	return nil
}
