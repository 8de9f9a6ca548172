package scan

import (
	"context"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/lake"
)

// ReadRow reads one stored version of a table's row, every column, from
// where it is: a write-buffer block in memory, a flushed block, or a
// regular file. The version is whatever is stored at that location,
// visible to a snapshot or not (a replayer reads the version its index
// points to, committed or in flight).
func (sc *Scanner) ReadRow(ctx context.Context, t *catalog.Table, f *catalog.File, offset uint32) ([]any, error) {
	cols := make([]int, len(t.Schema.Columns))
	for i := range cols {
		cols[i] = i
	}
	row, err := sc.readRow(ctx, t, f, offset, cols)
	if err != nil {
		return nil, fmt.Errorf("scan: read row %d of %s file %d: %w", offset, t.Name, f.ID, err)
	}
	return row, nil
}

func (sc *Scanner) readRow(ctx context.Context, t *catalog.Table, f *catalog.File, offset uint32, cols []int) ([]any, error) {
	key := f.Key
	if f.State == catalog.Virtual {
		o, err := sc.owner(f)
		if err != nil {
			return nil, err
		}
		buf, err := o.Buffer(t.ID)
		if err != nil {
			return nil, err
		}
		view := buf.View(f.ID)
		defer view.Release()
		fv := view.Files[0]
		if !fv.Regular {
			for _, b := range fv.Blocks {
				if offset < b.First || offset >= b.First+uint32(b.Rows) {
					continue
				}
				i := int(offset - b.First)
				recs := b.Records
				if recs == nil { // flushed and not in the block cache
					var err error
					if recs, err = sc.readBlock(ctx, b.Key); err != nil {
						return nil, err
					}
					defer releaseRecords(recs)
				}
				for _, rec := range recs {
					if n := int(rec.NumRows()); i >= n {
						i -= n
						continue
					}
					return rowOf(rec, i, cols)
				}
				return nil, fmt.Errorf("block at %d holds fewer rows than it says", b.First)
			}
			return nil, fmt.Errorf("no block of the file holds it")
		}
		key = fv.Key
	}
	return sc.readRowIn(ctx, t, key, int(offset), cols)
}

// readRowIn reads row i of a Parquet object.
func (sc *Scanner) readRowIn(ctx context.Context, t *catalog.Table, key string, i int, cols []int) ([]any, error) {
	r, err := sc.lake.MappedReaderAt(ctx, key)
	if err != nil {
		return nil, err
	}
	pf, err := sc.openWidened(key, r, t)
	if err != nil {
		return nil, err
	}
	defer pf.Close()
	rec, err := pf.ReadRow(ctx, int64(i), cols)
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", key, err)
	}
	defer rec.Release()
	return rowOf(rec, 0, cols)
}

// rowOf is row i of a record's first len(cols) columns; a buffered record
// carries every table column of its time, in order, then create_ts, so cols
// index it directly, and a column added since reads NULL.
func rowOf(rec arrow.RecordBatch, i int, cols []int) ([]any, error) {
	row := make([]any, len(cols))
	for j, c := range cols {
		if c >= int(rec.NumCols())-1 && rec.Schema().Field(int(rec.NumCols())-1).Name == lake.CreateTSColumn {
			continue // a buffered record that predates the column
		}
		if c >= int(rec.NumCols()) {
			return nil, fmt.Errorf("record has %d columns, column %d wanted", rec.NumCols(), c)
		}
		v, err := Value(rec.Column(c), i)
		if err != nil {
			return nil, err
		}
		row[j] = v
	}
	return row, nil
}
