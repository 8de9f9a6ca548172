package lake

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/duckdb/duckdb-go/v2"
)

// TestDuckDBReadsOurFiles: the open-format promise. DuckDB's read_parquet
// reads a Retina file and gets the same values, NULLs included.
func TestDuckDBReadsOurFiles(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 9))
	schema := testSchema()
	rec := randomRecord(rng, schema, 900, func(i int) int64 { return int64(i + 1) })
	data, _ := writeFile(t, []arrow.RecordBatch{rec}, WriterOptions{RowGroupRows: 400})
	dir := t.TempDir()
	s := openTestStore(t, "file://"+dir, RetryPolicy{})
	if err := s.Put(ctx, "orders/f1.parquet", data); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, "SELECT * FROM read_parquet(?) ORDER BY "+CreateTSColumn, filepath.Join(dir, "orders/f1.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ncol := int(rec.NumCols())
	vals := make([]any, ncol)
	ptrs := make([]any, ncol)
	for i := range ptrs {
		ptrs[i] = &vals[i]
	}
	r := 0
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for c := range ncol {
			if !duckMatches(rec.Column(c), r, vals[c]) {
				t.Fatalf("row %d column %s: DuckDB %v (%T), written %s", r, rec.ColumnName(c), vals[c], vals[c], rec.Column(c).ValueStr(r))
			}
		}
		r++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if r != 900 {
		t.Fatalf("DuckDB read %d rows, want 900", r)
	}
}

func duckMatches(a arrow.Array, i int, v any) bool {
	if a.IsNull(i) {
		return v == nil
	}
	switch a := a.(type) {
	case *array.Int8:
		return v == a.Value(i)
	case *array.Int16:
		return v == a.Value(i)
	case *array.Int32:
		return v == a.Value(i)
	case *array.Int64:
		return v == a.Value(i)
	case *array.Float32:
		return v == a.Value(i)
	case *array.Float64:
		return v == a.Value(i)
	case *array.Decimal128:
		d, ok := v.(duckdb.Decimal)
		return ok && d.Value.Cmp(a.Value(i).BigInt()) == 0 && int32(d.Scale) == a.DataType().(*arrow.Decimal128Type).Scale
	case *array.String:
		return v == a.Value(i)
	case *array.Binary:
		b, ok := v.([]byte)
		return ok && string(b) == string(a.Value(i))
	case *array.Boolean:
		return v == a.Value(i)
	case *array.Date32:
		tm, ok := v.(time.Time)
		return ok && tm.Equal(a.Value(i).ToTime())
	case *array.Timestamp:
		tm, ok := v.(time.Time)
		return ok && tm.UnixMicro() == int64(a.Value(i))
	}
	return false
}
