package bench

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/retinadb/retina/internal/lake"
)

// LakeConfig sizes the lake benchmark.
type LakeConfig struct {
	Rows         int     // rows written, read and filtered
	RowGroupRows int64   // rows per row group
	DeletedPct   float64 // share of rows marked deleted for the filter figure
	Seed         uint64
}

// DefaultLakeConfig uses 2M rows: well over the 1M the figures need.
func DefaultLakeConfig() LakeConfig {
	return LakeConfig{Rows: 2_000_000, RowGroupRows: 1 << 18, DeletedPct: 1, Seed: 1}
}

// TransferSchema is a HyBench transfer-like table of ten columns, as a
// file of the table transferColumns declares holds them: a column declared
// NOT NULL is a required Parquet column, without definition levels.
func TransferSchema() *arrow.Schema {
	cols := transferColumns()
	fields := make([]arrow.Field, len(cols))
	for i, c := range cols {
		fields[i] = arrow.Field{Name: c.Name, Type: c.Type.ArrowType(), Nullable: c.Nullable}
	}
	return arrow.NewSchema(fields, nil)
}

// transferRecords makes rows in records of up to 64K, create_ts = row + 1.
func transferRecords(rng *rand.Rand, rows int) []arrow.RecordBatch {
	return transferRecordsRange(rng, 0, rows, func(i int) int64 { return int64(i + 1) })
}

// transferRecordsRange makes the rows with ids [lo, hi).
func transferRecordsRange(rng *rand.Rand, lo, hi int, createTS func(id int) int64) []arrow.RecordBatch {
	schema := lake.FileSchema(TransferSchema())
	kinds := []string{"transfer", "payment", "refund", "salary", "loan"}
	var out []arrow.RecordBatch
	b := array.NewRecordBuilder(memory.DefaultAllocator, schema)
	defer b.Release()
	for i := lo; i < hi; i++ {
		b.Field(0).(*array.Int64Builder).Append(int64(i))
		b.Field(1).(*array.Int64Builder).Append(rng.Int64N(1_000_000))
		b.Field(2).(*array.Int64Builder).Append(rng.Int64N(1_000_000))
		b.Field(3).(*array.Decimal128Builder).Append(decimal128.FromI64(rng.Int64N(10_000_000)))
		b.Field(4).(*array.StringBuilder).Append(kinds[rng.IntN(len(kinds))])
		b.Field(5).(*array.TimestampBuilder).Append(arrow.Timestamp(1_700_000_000_000_000 + int64(i)*1000))
		b.Field(6).(*array.StringBuilder).Append(fmt.Sprintf("note %d", rng.IntN(1000)))
		b.Field(7).(*array.BooleanBuilder).Append(rng.IntN(50) == 0)
		b.Field(8).(*array.Date32Builder).Append(arrow.Date32(19700 + i/100000))
		b.Field(9).(*array.Float64Builder).Append(rng.Float64() * 5)
		b.Field(10).(*array.Int64Builder).Append(createTS(i))
		if b.Field(0).Len() == 1<<16 || i == hi-1 {
			out = append(out, b.NewRecordBatch())
		}
	}
	return out
}

// Lake measures writing a Retina Parquet file to file://, reading three of
// its ten columns back, and filtering visible rows by bitmap and create_ts.
func Lake(ctx context.Context, r *Report, cfg LakeConfig) error {
	rng := rand.New(rand.NewPCG(cfg.Seed, 4))
	recs := transferRecords(rng, cfg.Rows)
	defer func() {
		for _, rec := range recs {
			rec.Release()
		}
	}()
	dir, err := os.MkdirTemp("", "retina-bench-lake-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	store, err := lake.Open(ctx, "file://"+dir, lake.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer store.Close()
	r.Set("rows", cfg.Rows)
	r.Set("columns", 10)

	var buf bytes.Buffer
	buf.Grow(cfg.Rows * 32) // about the compressed size: not a cost of the format
	start := time.Now()
	w, err := lake.NewFileWriter(&buf, recs[0].Schema(), lake.WriterOptions{RowGroupRows: cfg.RowGroupRows})
	if err != nil {
		return err
	}
	for _, rec := range recs {
		if err := w.Write(rec); err != nil {
			return err
		}
	}
	groups, err := w.Close()
	if err != nil {
		return err
	}
	if err := store.Put(ctx, "transfer/1.parquet", buf.Bytes()); err != nil {
		return err
	}
	wrate := float64(cfg.Rows) / time.Since(start).Seconds()
	r.Printf("write: %d rows × 10 columns, zstd, %d row groups, %.1f MB: %.2f M rows/s", cfg.Rows, len(groups), float64(buf.Len())/1e6, wrate/1e6)
	r.Set("write_rows_per_sec", math.Round(wrate))
	r.Set("file_bytes", buf.Len())

	start = time.Now()
	reader, err := store.ReaderAt(ctx, "transfer/1.parquet")
	if err != nil {
		return err
	}
	f, err := lake.OpenFile(reader, nil)
	if err != nil {
		return err
	}
	defer f.Close()
	var read []arrow.RecordBatch
	defer func() {
		for _, rec := range read {
			rec.Release()
		}
	}()
	total := int64(0)
	for g := range f.RowGroups() {
		rec, err := f.ReadRowGroup(ctx, g, []int{0, 3, 4}, true)
		if err != nil {
			return err
		}
		total += rec.NumRows()
		read = append(read, rec)
	}
	rrate := float64(total) / time.Since(start).Seconds()
	r.Printf("read: 3 of 10 columns + create_ts, every row group: %.2f M rows/s (%d range reads)", rrate/1e6, reader.Reads())
	r.Set("read_rows_per_sec", math.Round(rrate))

	// 1% of rows deleted at random; the snapshot sits inside the last row
	// group so its create_ts filter is exercised too.
	snapshot := uint64(cfg.Rows - int(cfg.RowGroupRows)/2)
	masks := make([][]uint64, len(read))
	for i, rec := range read {
		masks[i] = make([]uint64, (rec.NumRows()+63)/64)
		for j := range rec.NumRows() {
			if rng.Float64()*100 < cfg.DeletedPct {
				masks[i][j/64] |= 1 << (j % 64)
			}
		}
	}
	start = time.Now()
	visibleRows := 0
	var mask []uint64
	for i, rec := range read {
		g := f.RowGroups()[i]
		var ts []int64
		if snapshot < g.MaxCreateTS { // only then is create_ts filtering needed
			ts = rec.Column(int(rec.NumCols()) - 1).(*array.Int64).Int64Values()
		}
		var visible int
		mask, visible = lake.VisibleMask(mask, int(rec.NumRows()), masks[i], ts, snapshot)
		out, err := lake.FilterVisible(ctx, rec, mask, visible, nil)
		if err != nil {
			return err
		}
		visibleRows += int(out.NumRows())
		out.Release()
	}
	frate := float64(total) / time.Since(start).Seconds()
	r.Printf("filter: %.0f%% deleted + create_ts ≤ %d: %d of %d rows visible, %.2f M rows/s", cfg.DeletedPct, snapshot, visibleRows, total, frate/1e6)
	r.Set("filter_rows_per_sec", math.Round(frate))
	return nil
}
