package lake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Block objects.
//
// A flushed write-buffer block is one Arrow IPC stream (the Arrow columnar
// format's streaming encoding): a schema message, the table's columns when
// the block was built followed by the int64 create_ts column, then one
// record batch per segment of the block, in row order. Buffers are
// LZ4-frame compressed where that saves at least a tenth. A block lives
// only until its virtual file is combined into a regular Parquet file, and
// its writing is on the ingest path of every row: encoding Arrow arrays as
// IPC is a copy of their buffers, where Parquet re-encoded every value and
// its statistics, which cost more than the rest of a row's ingest.
//
// Blocks flushed by earlier versions are Parquet files of one row group;
// ReadBlock reads both, telling them apart by Parquet's leading magic
// "PAR1" (an IPC stream begins with the continuation marker 0xFFFFFFFF).

// BlockSuffix ends the key of a block object in the IPC format.
const BlockSuffix = ".arrow"

// minBlockSavings is the share a compressed buffer must save to be kept
// compressed; below it the buffer is stored plain and read without a copy.
const minBlockSavings = 0.1

// WriteBlock encodes records that share one schema (the table's columns,
// then create_ts) as a block object.
func WriteBlock(w io.Writer, recs []arrow.RecordBatch) error {
	if len(recs) == 0 {
		return errors.New("lake: a block object needs at least one record")
	}
	schema := recs[0].Schema()
	if n := schema.NumFields(); n == 0 || schema.Field(n-1).Name != CreateTSColumn || schema.Field(n-1).Type.ID() != arrow.INT64 {
		return fmt.Errorf("lake: block schema %s must end with int64 %s", schema, CreateTSColumn)
	}
	iw := ipc.NewWriter(w, ipc.WithSchema(schema), ipc.WithLZ4(), ipc.WithMinSpaceSavings(minBlockSavings))
	for _, r := range recs {
		if err := iw.Write(r); err != nil {
			iw.Close()
			return fmt.Errorf("lake: encode block: %w", err)
		}
	}
	if err := iw.Close(); err != nil {
		return fmt.Errorf("lake: encode block: %w", err)
	}
	return nil
}

// ReadBlock decodes a block object into its records (the caller releases
// them): the columns the table had when the block was built, then
// create_ts. Parquet blocks of earlier versions come back as one record.
func ReadBlock(ctx context.Context, data []byte, mem memory.Allocator) ([]arrow.RecordBatch, error) {
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	if bytes.HasPrefix(data, []byte("PAR1")) {
		return readParquetBlock(ctx, data, mem)
	}
	rd, err := ipc.NewReader(bytes.NewReader(data), ipc.WithAllocator(mem))
	if err != nil {
		return nil, fmt.Errorf("%w: block object: %w", ErrBadFile, err)
	}
	defer rd.Release()
	schema := rd.Schema()
	if n := schema.NumFields(); n == 0 || schema.Field(n-1).Name != CreateTSColumn || schema.Field(n-1).Type.ID() != arrow.INT64 {
		return nil, fmt.Errorf("%w: block object without an int64 %s column", ErrBadFile, CreateTSColumn)
	}
	var recs []arrow.RecordBatch
	for rd.Next() {
		r := rd.RecordBatch()
		r.Retain()
		recs = append(recs, r)
	}
	if err := rd.Err(); err != nil {
		releaseAll(recs)
		return nil, fmt.Errorf("%w: block object: %w", ErrBadFile, err)
	}
	return recs, nil
}

func readParquetBlock(ctx context.Context, data []byte, mem memory.Allocator) ([]arrow.RecordBatch, error) {
	pf, err := OpenFile(bytes.NewReader(data), mem)
	if err != nil {
		return nil, err
	}
	defer pf.Close()
	all := make([]int, pf.Schema().NumFields())
	for i := range all {
		all[i] = i
	}
	var recs []arrow.RecordBatch
	for g := range pf.RowGroups() {
		rec, err := pf.ReadRowGroup(ctx, g, all, true)
		if err != nil {
			releaseAll(recs)
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

// WidenBlock is rec (a block's record: table columns, then create_ts) in
// schema, a file schema whose table columns start with rec's: the columns
// the table gained after the block was built read NULL. rec itself comes
// back, retained, when it already has schema's columns.
func WidenBlock(rec arrow.RecordBatch, schema *arrow.Schema, mem memory.Allocator) (arrow.RecordBatch, error) {
	have, want := int(rec.NumCols())-1, schema.NumFields()-1
	if have > want {
		return nil, fmt.Errorf("%w: the block has %d columns, the table %d", ErrBadFile, have, want)
	}
	for i := range have {
		h, w := rec.Schema().Field(i), schema.Field(i)
		if !strings.EqualFold(h.Name, w.Name) || !arrow.TypeEqual(h.Type, w.Type) {
			return nil, fmt.Errorf("%w: column %d is %s %s in the block, %s %s in the table", ErrBadFile, i, h.Name, h.Type, w.Name, w.Type)
		}
	}
	if have == want {
		rec.Retain()
		return rec, nil
	}
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	n := int(rec.NumRows())
	cols := make([]arrow.Array, 0, want+1)
	cols = append(cols, rec.Columns()[:have]...)
	var nulls []arrow.Array
	for i := have; i < want; i++ {
		a := array.MakeArrayOfNull(mem, schema.Field(i).Type, n)
		nulls = append(nulls, a)
		cols = append(cols, a)
	}
	cols = append(cols, rec.Column(have))
	out := array.NewRecordBatch(schema, cols, int64(n))
	for _, a := range nulls {
		a.Release()
	}
	return out, nil
}

func releaseAll(recs []arrow.RecordBatch) {
	for _, r := range recs {
		r.Release()
	}
}
