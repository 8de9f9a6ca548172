package query

import (
	"bytes"
	"context"
	"database/sql/driver"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/duckdb/duckdb-go/v2"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/types"
)

// The native path: where the lake is a local directory, a table's view lets
// DuckDB read the regular Parquet files itself (read_parquet: its row-group
// pruning, projection, filter pushdown and parallelism). Files with rows
// deleted at the snapshot lose them by an anti-join on (file_index,
// file_row_number) with retina_deleted, the visibility structure's deleted
// positions; files without are read as they are (the join's probe costs
// about half a scan, and most of a table is old files nothing deletes
// from).
// The rest, virtual files (the write buffer) and files the native read
// cannot take exactly, go through retina_scan_rest:
//
//	SELECT <columns> FROM read_parquet(retina_files('t', false)) b
//	UNION ALL
//	SELECT <columns> FROM read_parquet(retina_files('t', true), file_row_number = true) b
//	ANTI JOIN retina_deleted('t') d ON b.file_index = d.file_index AND b.file_row_number = d.file_row_number
//	UNION ALL SELECT * FROM retina_scan_rest('t')
//
// The three functions bind when the statement executes (read_parquet makes
// DuckDB bind a prepared statement again on every execution) and read one
// nativeSplit, kept on the statementView: they always agree on which file
// is read where, so no row is read twice or missed.

// nativeSplit is the files DuckDB reads natively for one table in one
// statement: clean (no row deleted at the snapshot) and dirty, each in its
// read_parquet's order, and the dirty files' deleted rows by position
// (file_index is the position in dirty).
type nativeSplit struct {
	clean, dirty []string // paths
	ids          map[uint64]bool
	delFile      []uint64
	delRow       []int64
	err          error
}

// splitFor returns the statement's split of table b.table, computing it
// once; b must be bound with a view.
func (e *Engine) splitFor(b boundTable) (*nativeSplit, error) {
	v := b.stmt
	v.mu.Lock()
	defer v.mu.Unlock()
	if s, ok := v.splits[b.table.ID]; ok {
		return s, s.err
	}
	s := &nativeSplit{ids: map[uint64]bool{}}
	var buf []uint64
	for _, f := range b.snap.LiveFiles(b.table.ID) {
		path, ok := lake.LocalPath(e.cfg.LakeDir, f.Key)
		if !ok || !e.readsNatively(f, b.table, b.view.ts) {
			continue
		}
		deleted := len(s.delRow)
		if !e.cfg.Scanner.NoVisibility {
			var native bool
			if buf, native, s.err = s.collect(e, b, f, len(s.dirty), buf); s.err != nil {
				break
			}
			if !native {
				continue // mostly deleted: the Go scan filters it by its bitmap
			}
		}
		s.ids[f.ID] = true
		if len(s.delRow) > deleted {
			s.dirty = append(s.dirty, path)
		} else {
			s.clean = append(s.clean, path)
		}
	}
	e.nativeFiles.Add(uint64(len(s.ids)))
	if v.splits == nil {
		v.splits = map[uint32]*nativeSplit{}
	}
	v.splits[b.table.ID] = s
	return s, s.err
}

// nativeMaxDeletedShare is the most of a file's rows that may be deleted
// at a snapshot for DuckDB's reader to read it. Past it the anti-join
// costs more than the reading it saves: its hash table holds every deleted
// position, built anew by every query, and a hot table's files are mostly
// old versions until storage GC rewrites them (in bench e2e, freshness
// probes over the account tables took half the time, and the AP queries
// under change 1.06-1.13 times their static time instead of 1.38-1.41,
// once such files went to the Go scan).
const nativeMaxDeletedShare = 0.5

// collect adds the positions of f's rows deleted at the view's snapshot,
// as those of file index i, and reports true; or, when more than
// nativeMaxDeletedShare of its rows are deleted, adds none and reports
// false: the file is not to be read natively.
func (s *nativeSplit) collect(e *Engine, b boundTable, f *catalog.File, i int, buf []uint64) ([]uint64, bool, error) {
	vis, err := e.cfg.Scanner.Visibility(f)
	if err != nil {
		return buf, false, fmt.Errorf("query: %s: file %d: %w", b.table.Name, f.ID, err)
	}
	rows := int(f.Rows())
	bm, bit, err := b.view.DeletedRange(f.ID, vis, 0, rows, buf)
	if err != nil {
		return buf, false, fmt.Errorf("query: %s: deleted rows of file %d at %d: %w", b.table.Name, f.ID, b.view.ts, err)
	}
	// The words may hold a few bits beyond the file's rows: enough to
	// decide, and to make room for every position at once.
	n := 0
	for _, m := range bm {
		n += bits.OnesCount64(m)
	}
	if float64(n) > nativeMaxDeletedShare*float64(rows) {
		return bm, false, nil
	}
	s.delFile, s.delRow = slices.Grow(s.delFile, n), slices.Grow(s.delRow, n)
	for w, m := range bm {
		for m != 0 {
			r := w*64 + bits.TrailingZeros64(m) - bit
			m &= m - 1
			if r >= 0 && r < rows {
				s.delFile = append(s.delFile, uint64(i))
				s.delRow = append(s.delRow, int64(r))
			}
		}
	}
	return bm, true, nil
}

// readsNatively reports whether DuckDB's reader returns exactly the rows of
// f visible at ts, less the deleted ones: a regular Parquet file of the
// table's current schema whose every row is older than the snapshot (so no
// create_ts filter is needed), with a visibility structure here.
func (e *Engine) readsNatively(f *catalog.File, t *catalog.Table, ts uint64) bool {
	if f.State != catalog.Regular && f.State != catalog.Aging {
		return false
	}
	if f.SchemaVersion != t.SchemaVersion || !strings.HasSuffix(f.Key, ".parquet") || len(f.RowGroups) == 0 {
		return false
	}
	for _, g := range f.RowGroups {
		// A zero maximum is a file written before row groups recorded
		// their timestamps: unknown, so not native.
		if g.MaxCreateTS == 0 || g.MaxCreateTS > ts {
			return false
		}
	}
	_, err := e.cfg.Scanner.Visibility(f)
	return err == nil
}

// nativeViewSQL is the body of table t's view on the native path.
func nativeViewSQL(t *catalog.Table) (string, error) {
	cols := make([]string, len(t.Schema.Columns))
	for i, c := range t.Schema.Columns {
		st, err := duckSQLType(c.Type)
		if err != nil {
			return "", fmt.Errorf("query: view for %s: column %s: %w", t.Name, c.Name, err)
		}
		// DuckDB reads each Parquet type as this one already; the cast
		// pins the view's types to the catalog's whatever a file says.
		cols[i] = fmt.Sprintf("CAST(b.%s AS %s) AS %s", quoteIdent(c.Name), st, quoteIdent(c.Name))
	}
	name, list := quoteLiteral(t.Name), strings.Join(cols, ", ")
	return fmt.Sprintf("SELECT %s FROM read_parquet(retina_files(%s, false)) AS b "+
		"UNION ALL SELECT %s FROM read_parquet(retina_files(%s, true), file_row_number = true) AS b "+
		"ANTI JOIN retina_deleted(%s) AS d ON b.file_index = d.file_index AND b.file_row_number = d.file_row_number "+
		"UNION ALL SELECT * FROM retina_scan_rest(%s)", list, name, list, name, name, name), nil
}

// duckSQLType is a column type as DuckDB's SQL names it.
func duckSQLType(t types.Type) (string, error) {
	if t.Kind == types.Decimal {
		return fmt.Sprintf("DECIMAL(%d, %d)", t.Precision, t.Scale), nil
	}
	d, ok := duckTypes[t.Kind]
	if !ok {
		return "", fmt.Errorf("no DuckDB type for %s", t)
	}
	return d.sql, nil
}

// emptyFile is the path of a Parquet file with t's columns and no rows,
// written once per schema version: read_parquet needs at least one file,
// and a statement may have none to read natively.
func (e *Engine) emptyFile(t *catalog.Table) (string, error) {
	e.emptyMu.Lock()
	defer e.emptyMu.Unlock()
	key := emptyKey{t.ID, t.SchemaVersion}
	if p, ok := e.empties[key]; ok {
		return p, nil
	}
	fields := make([]arrow.Field, len(t.Schema.Columns))
	for i, c := range t.Schema.Columns {
		fields[i] = arrow.Field{Name: c.Name, Type: c.Type.ArrowType(), Nullable: true}
	}
	var buf bytes.Buffer
	w, err := lake.NewFileWriter(&buf, lake.FileSchema(arrow.NewSchema(fields, nil)), lake.WriterOptions{})
	if err == nil {
		_, err = w.Close()
	}
	path := filepath.Join(e.scratch, fmt.Sprintf("empty-t%d-v%d.parquet", t.ID, t.SchemaVersion))
	if err == nil {
		err = os.WriteFile(path, buf.Bytes(), 0o600)
	}
	if err != nil {
		return "", fmt.Errorf("query: the empty file of %s at %s: %w", t.Name, path, err)
	}
	if e.empties == nil {
		e.empties = map[emptyKey]string{}
	}
	e.empties[key] = path
	return path, nil
}

// filesFunction is retina_files(table, dirty): the paths of the files
// DuckDB reads natively at the statement's view with rows deleted at its
// snapshot (dirty) or without, or the table's empty file.
type filesFunction struct{ e *Engine }

func (f filesFunction) Config() duckdb.ScalarFuncConfig {
	varchar, _ := duckdb.NewTypeInfo(duckdb.TYPE_VARCHAR)
	boolean, _ := duckdb.NewTypeInfo(duckdb.TYPE_BOOLEAN)
	list, _ := duckdb.NewListInfo(varchar)
	// Not volatile: DuckDB folds it to a constant when it binds the
	// statement, which read_parquet's argument must be.
	return duckdb.ScalarFuncConfig{InputTypeInfos: []duckdb.TypeInfo{varchar, boolean}, ResultTypeInfo: list}
}

func (f filesFunction) Executor() duckdb.ScalarFuncExecutor {
	return duckdb.ScalarFuncExecutor{RowContextExecutor: func(ctx context.Context, args []driver.Value) (any, error) {
		name, _ := args[0].(string)
		dirty, _ := args[1].(bool)
		b, err := f.e.bindTable(ctx, name)
		if err != nil {
			return nil, err
		}
		var paths []string
		if b.view != nil {
			s, err := f.e.splitFor(b)
			if err != nil {
				return nil, err
			}
			if paths = s.clean; dirty {
				paths = s.dirty
			}
		}
		if len(paths) == 0 {
			p, err := f.e.emptyFile(b.table)
			if err != nil {
				return nil, err
			}
			paths = []string{p}
		}
		out := make([]any, len(paths))
		for i, p := range paths {
			out[i] = p
		}
		return out, nil
	}}
}

// emptyKey names a table's empty file.
type emptyKey struct {
	table  uint32
	schema uint32
}

// deletedFunction is retina_deleted(table): the positions (file_index,
// file_row_number) of the natively read rows deleted at the statement's
// snapshot.
func (e *Engine) deletedFunction() duckdb.ChunkTableFunction {
	varchar, _ := duckdb.NewTypeInfo(duckdb.TYPE_VARCHAR)
	return duckdb.ChunkTableFunction{
		Config: duckdb.TableFunctionConfig{Arguments: []duckdb.TypeInfo{varchar}},
		BindArgumentsContext: func(ctx context.Context, _ map[string]any, args ...any) (duckdb.ChunkTableSource, error) {
			name, _ := args[0].(string)
			b, err := e.bindTable(ctx, name)
			if err != nil {
				return nil, err
			}
			src := &deletedSource{}
			if b.view == nil {
				return src, nil
			}
			split, err := e.splitFor(b)
			if err != nil {
				return nil, err
			}
			src.file, src.row = split.delFile, split.delRow
			return src, nil
		},
	}
}

// deletedSource hands out one statement's deleted positions.
type deletedSource struct {
	file []uint64
	row  []int64
	at   int
}

func (d *deletedSource) ColumnInfos() []duckdb.ColumnInfo {
	ubig, _ := duckdb.NewTypeInfo(duckdb.TYPE_UBIGINT)
	big, _ := duckdb.NewTypeInfo(duckdb.TYPE_BIGINT)
	return []duckdb.ColumnInfo{{Name: "file_index", T: ubig}, {Name: "file_row_number", T: big}}
}

func (d *deletedSource) Cardinality() *duckdb.CardinalityInfo {
	return &duckdb.CardinalityInfo{Cardinality: uint(len(d.file)), Exact: true}
}

func (d *deletedSource) Init() {}

func (d *deletedSource) FillChunk(chunk duckdb.DataChunk) error {
	n := min(len(d.file)-d.at, duckdb.GetDataChunkCapacity())
	for r := range n {
		if err := duckdb.SetChunkValue(chunk, 0, r, d.file[d.at+r]); err != nil {
			return err
		}
		if err := duckdb.SetChunkValue(chunk, 1, r, d.row[d.at+r]); err != nil {
			return err
		}
	}
	d.at += n
	return chunk.SetSize(n)
}
