package writebuffer

import (
	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// blockBuilder builds the active block: Arrow column builders taking the
// appended rows, and the segments of it already cut for readers. It does
// no I/O and no locking; the buffer's mutex guards it.
type blockBuilder struct {
	builder *array.RecordBuilder
	apps    []appender
	first   uint32              // offset in its file of the active block's first row
	rows    int                 // rows in the active block
	segs    []arrow.RecordBatch // cuts of the active block, oldest first
}

func newBlockBuilder(schema *arrow.Schema, cols []Column) *blockBuilder {
	bb := &blockBuilder{builder: array.NewRecordBuilder(memory.DefaultAllocator, schema)}
	for _, c := range cols {
		bb.apps = append(bb.apps, appenderFor(c.Type))
	}
	return bb
}

// add appends rows (already checked) written by the mirror transaction
// ts: the table's columns, then create_ts.
func (bb *blockBuilder) add(ts uint64, rows [][]any) {
	for _, row := range rows {
		for c, v := range row {
			if v == nil {
				bb.builder.Field(c).AppendNull()
			} else {
				bb.apps[c](bb.builder.Field(c), v)
			}
		}
		bb.builder.Field(len(row)).(*array.Int64Builder).Append(int64(ts))
	}
	bb.rows += len(rows)
}

// cut moves the rows added since the last cut into a segment, so a reader
// can hold them while appends go on.
func (bb *blockBuilder) cut() {
	if bb.builder.Field(0).Len() == 0 {
		return
	}
	bb.segs = append(bb.segs, bb.builder.NewRecordBatch())
}

// take ends the active block and returns it; the next block starts where
// it ended. It returns no rows when the active block is empty.
func (bb *blockBuilder) take() (first uint32, rows int, segs []arrow.RecordBatch) {
	bb.cut()
	first, rows, segs = bb.first, bb.rows, bb.segs
	bb.first += uint32(rows)
	bb.rows, bb.segs = 0, nil
	return first, rows, segs
}

// startFile makes the next block the first of a new file. The active block
// must be empty.
func (bb *blockBuilder) startFile() { bb.first = 0 }

// memoryBytes is the Arrow memory the active block holds, builders
// included (their capacity is about one block's worth of values).
func (bb *blockBuilder) memoryBytes() int64 {
	var n int64
	for _, s := range bb.segs {
		n += recordBytes(s)
	}
	return n + int64(bb.builder.Field(0).Cap())*int64(len(bb.apps)+1)*8
}

func (bb *blockBuilder) release() { bb.builder.Release() }

func recordBytes(r arrow.RecordBatch) int64 {
	var n int64
	for _, c := range r.Columns() {
		for _, buf := range c.Data().Buffers() {
			if buf != nil {
				n += int64(buf.Len())
			}
		}
	}
	return n
}
