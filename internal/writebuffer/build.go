package writebuffer

import (
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/bitutil"
	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/retinadb/retina/internal/types"
)

// blockBuilder builds the active block: a column vector per table column
// (then create_ts) taking the appended rows, and the segments of it
// already cut for readers. It does no I/O and no locking; the buffer's
// mutex guards it.
//
// Rows are appended in place into Go slices sized for the block; a cut
// hands readers Arrow arrays over the rows since the last cut that share
// those slices instead of copying them. That is safe because appends only
// write past every cut, and a new block starts in new slices (the old ones
// live on in the arrays cut from them). Arrow's builders grew their
// buffers by doubling and trimmed them at every cut: two copies of every
// value and an allocation per cut and column.
type blockBuilder struct {
	cols     []column
	ts       fixed[int64] // create_ts
	schema   *arrow.Schema
	maxRows  int
	first    uint32              // offset in its file of the active block's first row
	rows     int                 // rows in the active block
	cutAt    int                 // rows of the active block already in segs
	segs     []arrow.RecordBatch // cuts of the active block, oldest first
	lastRows int                 // rows of the last block taken, which sizes the next
}

func newBlockBuilder(schema *arrow.Schema, cols []Column, blockRows int) *blockBuilder {
	bb := &blockBuilder{schema: schema, maxRows: blockRows}
	for i, c := range cols {
		bb.cols = append(bb.cols, newColumn(c.Type, schema.Field(i).Type))
	}
	bb.ts.typ = arrow.PrimitiveTypes.Int64
	return bb
}

// minBlockCapacity is where a block's vectors start when the last block
// was smaller: an idle table's block holds little memory.
const minBlockCapacity = 64

// add appends rows (already checked) written by the mirror transaction
// ts: the table's columns, then create_ts. Column by column, so each
// column's loop is over one type.
func (bb *blockBuilder) add(ts uint64, rows [][]any) {
	if bb.rows == 0 {
		capacity := min(max(bb.lastRows, minBlockCapacity, len(rows)), bb.maxRows)
		for _, c := range bb.cols {
			c.reset(capacity)
		}
		bb.ts.reset(capacity)
	}
	for c, col := range bb.cols {
		col.add(rows, c, bb.rows)
	}
	bb.ts.vals = grow(bb.ts.vals, len(rows))
	for range rows {
		bb.ts.vals = append(bb.ts.vals, int64(ts))
	}
	bb.rows += len(rows)
}

// cut moves the rows added since the last cut into a segment, so a reader
// can hold them while appends go on.
func (bb *blockBuilder) cut() {
	if bb.rows == bb.cutAt {
		return
	}
	arrs := make([]arrow.Array, 0, len(bb.cols)+1)
	for _, c := range bb.cols {
		arrs = append(arrs, c.array(bb.cutAt, bb.rows))
	}
	arrs = append(arrs, bb.ts.array(bb.cutAt, bb.rows))
	bb.segs = append(bb.segs, array.NewRecordBatch(bb.schema, arrs, int64(bb.rows-bb.cutAt)))
	for _, a := range arrs {
		a.Release()
	}
	bb.cutAt = bb.rows
}

// take ends the active block and returns it; the next block starts where
// it ended. It returns no rows when the active block is empty.
func (bb *blockBuilder) take() (first uint32, rows int, segs []arrow.RecordBatch) {
	bb.cut()
	first, rows, segs = bb.first, bb.rows, bb.segs
	bb.first += uint32(rows)
	if rows > 0 {
		bb.lastRows = rows
	}
	bb.rows, bb.cutAt, bb.segs = 0, 0, nil
	return first, rows, segs
}

// startFile makes the next block the first of a new file. The active block
// must be empty.
func (bb *blockBuilder) startFile() { bb.first = 0 }

// memoryBytes is the memory the active block holds: its vectors' capacity
// (the segments cut so far share it).
func (bb *blockBuilder) memoryBytes() int64 {
	if bb.rows == 0 {
		return 0
	}
	n := bb.ts.capacityBytes()
	for _, c := range bb.cols {
		n += c.capacityBytes()
	}
	return n
}

// release drops the active block's segments; the vectors are Go memory.
func (bb *blockBuilder) release() {
	for _, s := range bb.segs {
		s.Release()
	}
	bb.segs = nil
}

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

// column is one column vector of the active block.
type column interface {
	// reset starts a new block in new memory sized for capacity rows.
	reset(capacity int)
	// add appends column c of rows (checked values of its type, or nil)
	// as rows at..at+len(rows) of the block.
	add(rows [][]any, c int, at int)
	// array is rows [from, to) of the block as an Arrow array sharing the
	// vector's memory (validity and bit-packed values are copied: later
	// appends write the same bytes).
	array(from, to int) arrow.Array
	capacityBytes() int64
}

func newColumn(t types.Type, at arrow.DataType) column {
	switch t.Kind {
	case types.Int8:
		return &fixed[int8]{typ: at, conv: func(v any) int8 { return int8(v.(int64)) }}
	case types.Int16:
		return &fixed[int16]{typ: at, conv: func(v any) int16 { return int16(v.(int64)) }}
	case types.Int32:
		return &fixed[int32]{typ: at, conv: func(v any) int32 { return int32(v.(int64)) }}
	case types.Int64:
		return &fixed[int64]{typ: at, conv: func(v any) int64 { return v.(int64) }}
	case types.Float32:
		return &fixed[float32]{typ: at, conv: func(v any) float32 { return float32(v.(float64)) }}
	case types.Float64:
		return &fixed[float64]{typ: at, conv: func(v any) float64 { return v.(float64) }}
	case types.Decimal:
		return &fixed[decimal128.Num]{typ: at, conv: func(v any) decimal128.Num { return v.(decimal128.Num) }}
	case types.Date:
		return &fixed[arrow.Date32]{typ: at, conv: func(v any) arrow.Date32 { return arrow.Date32(v.(types.DateDays)) }}
	case types.Timestamp, types.TimestampTZ:
		return &fixed[arrow.Timestamp]{typ: at, conv: func(v any) arrow.Timestamp { return arrow.Timestamp(v.(types.TimestampMicros)) }}
	case types.String:
		return &varlen{typ: at, str: true}
	case types.Bytes:
		return &varlen{typ: at}
	case types.Bool:
		return &boolean{}
	}
	return nil // CheckRow and the catalog admit no other kind
}

// validity is a column's NULLs in the active block: no bitmap until the
// first NULL, then one bit a row (1 = a value).
type validity struct {
	bits  []byte
	nulls []int32 // rows that are NULL, in order (counts NULLs of a cut)
}

func (v *validity) reset() { v.bits, v.nulls = nil, v.nulls[:0] }

// null marks row i NULL; rows before it without a bitmap were all values.
func (v *validity) null(i, capacity int) {
	if v.bits == nil {
		v.bits = make([]byte, bitutil.BytesForBits(int64(max(capacity, i+1))))
		bitutil.SetBitsTo(v.bits, 0, int64(i), true)
	}
	v.grow(i)
	bitutil.ClearBit(v.bits, i)
	v.nulls = append(v.nulls, int32(i))
}

// value marks row i a value.
func (v *validity) value(i int) {
	if v.bits != nil {
		v.grow(i)
		bitutil.SetBit(v.bits, i)
	}
}

func (v *validity) grow(i int) {
	if need := int(bitutil.BytesForBits(int64(i + 1))); need > len(v.bits) {
		v.bits = append(v.bits, make([]byte, max(need, 2*len(v.bits))-len(v.bits))...)
	}
}

// of is the validity buffer of rows [from, to), a copy starting at bit 0,
// and their NULL count; nil when they have none.
func (v *validity) of(from, to int) (*memory.Buffer, int) {
	nulls := 0
	for i := len(v.nulls) - 1; i >= 0 && int(v.nulls[i]) >= from; i-- {
		if int(v.nulls[i]) < to {
			nulls++
		}
	}
	if nulls == 0 {
		return nil, 0
	}
	return memory.NewBufferBytes(copyBits(v.bits, from, to)), nulls
}

func copyBits(src []byte, from, to int) []byte {
	dst := make([]byte, bitutil.BytesForBits(int64(to-from)))
	bitutil.CopyBitmap(src, from, to-from, dst, 0)
	return dst
}

// fixed is a column of fixed-width values laid out as Arrow lays them out
// (little-endian; a decimal128.Num is its low then its high word).
type fixed[T any] struct {
	typ   arrow.DataType
	conv  func(any) T
	vals  []T
	valid validity
}

func (f *fixed[T]) reset(capacity int) {
	f.vals = make([]T, 0, capacity)
	f.valid.reset()
}

func (f *fixed[T]) add(rows [][]any, c int, at int) {
	f.vals = grow(f.vals, len(rows))
	var zero T
	for i, row := range rows {
		if v := row[c]; v != nil {
			f.vals = append(f.vals, f.conv(v))
			f.valid.value(at + i)
		} else {
			f.vals = append(f.vals, zero)
			f.valid.null(at+i, cap(f.vals))
		}
	}
}

func (f *fixed[T]) array(from, to int) arrow.Array {
	nullBuf, nulls := f.valid.of(from, to)
	data := array.NewData(f.typ, to-from, []*memory.Buffer{nullBuf, memory.NewBufferBytes(bytesOf(f.vals[from:to]))}, nil, nulls, 0)
	defer data.Release()
	return array.MakeFromData(data)
}

func (f *fixed[T]) capacityBytes() int64 {
	var zero T
	return int64(cap(f.vals))*int64(unsafe.Sizeof(zero)) + int64(cap(f.valid.bits))
}

// varlen is a string or binary column: Arrow's int32 offsets and the
// values' bytes end to end.
type varlen struct {
	typ     arrow.DataType
	str     bool
	offsets []int32 // offsets[i] is where row i starts; one more than rows
	data    []byte
	valid   validity
}

func (s *varlen) reset(capacity int) {
	perRow := 16 // before any block: a short string
	if rows := len(s.offsets) - 1; rows > 0 {
		perRow = len(s.data)/rows + 1 // as the last block's rows were
	}
	s.offsets = make([]int32, 1, capacity+1)
	s.data = make([]byte, 0, capacity*perRow)
	s.valid.reset()
}

func (s *varlen) add(rows [][]any, c int, at int) {
	s.offsets = grow(s.offsets, len(rows))
	for i, row := range rows {
		switch v := row[c].(type) {
		case nil:
			s.valid.null(at+i, cap(s.offsets)-1)
		case string:
			s.data = append(s.data, v...)
			s.valid.value(at + i)
		case []byte:
			s.data = append(s.data, v...)
			s.valid.value(at + i)
		}
		s.offsets = append(s.offsets, int32(len(s.data)))
	}
}

func (s *varlen) array(from, to int) arrow.Array {
	nullBuf, nulls := s.valid.of(from, to)
	base := s.offsets[from]
	offs := make([]int32, to-from+1)
	for i := range offs {
		offs[i] = s.offsets[from+i] - base
	}
	vals := s.data[base:s.offsets[to]]
	data := array.NewData(s.typ, to-from, []*memory.Buffer{nullBuf, memory.NewBufferBytes(bytesOf(offs)), memory.NewBufferBytes(vals)}, nil, nulls, 0)
	defer data.Release()
	return array.MakeFromData(data)
}

func (s *varlen) capacityBytes() int64 {
	return int64(cap(s.offsets))*4 + int64(cap(s.data)) + int64(cap(s.valid.bits))
}

// boolean is a bool column: one bit a value, as Arrow stores it.
type boolean struct {
	vals  []byte
	rows  int
	valid validity
}

func (b *boolean) reset(capacity int) {
	b.vals = make([]byte, bitutil.BytesForBits(int64(capacity)))
	b.rows = 0
	b.valid.reset()
}

func (b *boolean) add(rows [][]any, c int, at int) {
	if need := int(bitutil.BytesForBits(int64(b.rows + len(rows)))); need > len(b.vals) {
		b.vals = append(b.vals, make([]byte, max(need, 2*len(b.vals))-len(b.vals))...)
	}
	for i, row := range rows {
		switch v := row[c].(type) {
		case nil:
			b.valid.null(at+i, 8*len(b.vals))
		case bool:
			bitutil.SetBitTo(b.vals, b.rows+i, v)
			b.valid.value(at + i)
		}
	}
	b.rows += len(rows)
}

func (b *boolean) array(from, to int) arrow.Array {
	nullBuf, nulls := b.valid.of(from, to)
	data := array.NewData(arrow.FixedWidthTypes.Boolean, to-from, []*memory.Buffer{nullBuf, memory.NewBufferBytes(copyBits(b.vals, from, to))}, nil, nulls, 0)
	defer data.Release()
	return array.MakeFromData(data)
}

func (b *boolean) capacityBytes() int64 { return int64(cap(b.vals)) + int64(cap(b.valid.bits)) }

// grow makes room for n more elements, doubling: the old array stays with
// the segments cut from it.
func grow[T any](s []T, n int) []T {
	if len(s)+n <= cap(s) {
		return s
	}
	out := make([]T, len(s), max(2*cap(s), len(s)+n))
	copy(out, s)
	return out
}

// bytesOf is the memory of s as bytes, for an Arrow buffer over it.
func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}
