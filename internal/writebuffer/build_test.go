package writebuffer

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/types"
)

// everyKind is a column of every type the buffer takes.
var everyKind = []Column{
	{Name: "i8", Type: types.Of(types.Int8), Nullable: true},
	{Name: "i16", Type: types.Of(types.Int16), Nullable: true},
	{Name: "i32", Type: types.Of(types.Int32), Nullable: true},
	{Name: "i64", Type: types.Of(types.Int64), Nullable: true},
	{Name: "f32", Type: types.Of(types.Float32), Nullable: true},
	{Name: "f64", Type: types.Of(types.Float64), Nullable: true},
	{Name: "dec", Type: types.DecimalOf(38, 4), Nullable: true},
	{Name: "s", Type: types.Of(types.String), Nullable: true},
	{Name: "b", Type: types.Of(types.Bytes), Nullable: true},
	{Name: "ok", Type: types.Of(types.Bool), Nullable: true},
	{Name: "d", Type: types.Of(types.Date), Nullable: true},
	{Name: "ts", Type: types.Of(types.Timestamp), Nullable: true},
	{Name: "tstz", Type: types.Of(types.TimestampTZ), Nullable: true},
}

// randomRow draws a row of everyKind; column c is NULL with probability
// nulls[c].
func randomRow(rng *rand.Rand, nulls []float64) []any {
	row := make([]any, len(everyKind))
	for c, col := range everyKind {
		if rng.Float64() < nulls[c] {
			continue
		}
		switch col.Type.Kind {
		case types.Int8:
			row[c] = int64(int8(rng.Uint64()))
		case types.Int16:
			row[c] = int64(int16(rng.Uint64()))
		case types.Int32:
			row[c] = int64(int32(rng.Uint64()))
		case types.Int64:
			row[c] = int64(rng.Uint64())
		case types.Float32:
			row[c] = float64(float32(rng.NormFloat64()))
		case types.Float64:
			row[c] = rng.NormFloat64()
		case types.Decimal:
			row[c] = decimal128.New(rng.Int64N(1<<40)-1<<39, rng.Uint64())
		case types.String:
			s := fmt.Sprint(rng.Uint64())
			row[c] = s[:rng.IntN(len(s))]
		case types.Bytes:
			row[c] = []byte(fmt.Sprint(rng.Uint64()))[:rng.IntN(10)]
		case types.Bool:
			row[c] = rng.IntN(2) == 0
		case types.Date:
			row[c] = types.DateDays(rng.Int32N(100000))
		case types.Timestamp, types.TimestampTZ:
			row[c] = types.TimestampMicros(rng.Int64())
		}
	}
	return row
}

// expectedRecord builds rows with Arrow's own builders: the oracle.
func expectedRecord(t *testing.T, schema *arrow.Schema, rows [][]any, ts []uint64) arrow.RecordBatch {
	t.Helper()
	b := array.NewRecordBuilder(memory.DefaultAllocator, schema)
	defer b.Release()
	for i, row := range rows {
		for c, v := range row {
			fb := b.Field(c)
			if v == nil {
				fb.AppendNull()
				continue
			}
			switch fb := fb.(type) {
			case *array.Int8Builder:
				fb.Append(int8(v.(int64)))
			case *array.Int16Builder:
				fb.Append(int16(v.(int64)))
			case *array.Int32Builder:
				fb.Append(int32(v.(int64)))
			case *array.Int64Builder:
				fb.Append(v.(int64))
			case *array.Float32Builder:
				fb.Append(float32(v.(float64)))
			case *array.Float64Builder:
				fb.Append(v.(float64))
			case *array.Decimal128Builder:
				fb.Append(v.(decimal128.Num))
			case *array.StringBuilder:
				fb.Append(v.(string))
			case *array.BinaryBuilder:
				fb.Append(v.([]byte))
			case *array.BooleanBuilder:
				fb.Append(v.(bool))
			case *array.Date32Builder:
				fb.Append(arrow.Date32(v.(types.DateDays)))
			case *array.TimestampBuilder:
				fb.Append(arrow.Timestamp(v.(types.TimestampMicros)))
			default:
				t.Fatalf("no oracle for %T", fb)
			}
		}
		b.Field(len(row)).(*array.Int64Builder).Append(int64(ts[i]))
	}
	return b.NewRecordBatch()
}

// segment is a cut and the rows it must hold.
type segment struct {
	got  arrow.RecordBatch
	rows [][]any
	ts   []uint64
}

// TestBlockBuilderMatchesArrowBuilders: random batches of every type,
// NULL-free, all-NULL and mixed columns, cut and taken at random points;
// every segment equals what Arrow's builders make of its rows, also after
// the appends that followed it wrote on past it.
func TestBlockBuilderMatchesArrowBuilders(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 17))
			nulls := make([]float64, len(everyKind))
			for c := range nulls {
				nulls[c] = []float64{0, 0.02, 0.5, 1}[rng.IntN(4)]
			}
			schema := lake.FileSchema(Schema(everyKind))
			const blockRows = 300
			bb := newBlockBuilder(schema, everyKind, blockRows)
			var done []segment
			var pendRows [][]any
			var pendTS []uint64
			cut := func() {
				before := len(bb.segs)
				bb.cut()
				if len(bb.segs) == before {
					if len(pendRows) > 0 {
						t.Fatalf("cut of %d rows made no segment", len(pendRows))
					}
					return
				}
				done = append(done, segment{got: bb.segs[len(bb.segs)-1], rows: pendRows, ts: pendTS})
				pendRows, pendTS = nil, nil
			}
			for ts := uint64(1); ts < 200; ts++ {
				n := min(1+rng.IntN(40), blockRows-bb.rows)
				rows := make([][]any, n)
				for i := range rows {
					rows[i] = randomRow(rng, nulls)
					pendRows, pendTS = append(pendRows, rows[i]), append(pendTS, ts)
				}
				bb.add(ts, rows)
				switch r := rng.IntN(10); {
				case r < 3:
					cut()
				case r < 4 || bb.rows == blockRows:
					cut()
					first, taken, segs := bb.take()
					var sum int
					for _, s := range segs {
						sum += int(s.NumRows())
					}
					if sum != taken || first+uint32(taken) != bb.first {
						t.Fatalf("took %d rows at %d in segments of %d; next block at %d", taken, first, sum, bb.first)
					}
				}
			}
			cut()
			for i, s := range done {
				want := expectedRecord(t, schema, s.rows, s.ts)
				if !array.RecordEqual(s.got, want) {
					t.Fatalf("segment %d of %d rows:\n%v\nwant\n%v", i, len(s.rows), s.got, want)
				}
				for c, col := range s.got.Columns() {
					if v, ok := col.(interface{ ValidateFull() error }); ok {
						if err := v.ValidateFull(); err != nil {
							t.Fatalf("segment %d column %d: %v", i, c, err)
						}
					}
				}
				want.Release()
			}
		})
	}
}

// TestSegmentsReadWhileAppending: a reader goes through cut segments
// while appends go on in the same block (run with -race: appends never
// write what a cut handed out).
func TestSegmentsReadWhileAppending(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	schema := lake.FileSchema(Schema(everyKind))
	bb := newBlockBuilder(schema, everyKind, 4096)
	nulls := []float64{0.1, 0, 0.5, 0, 0.3, 0, 0.2, 0.1, 0, 0.4, 0, 0.05, 0}
	var mu sync.Mutex
	segs := make(chan arrow.RecordBatch, 1024)
	var wg sync.WaitGroup
	wg.Go(func() {
		for s := range segs {
			for c := range int(s.NumCols()) {
				col := s.Column(c)
				for i := range col.Len() {
					_ = col.ValueStr(i)
				}
			}
			s.Release()
		}
	})
	for ts := uint64(1); ts <= 200; ts++ {
		rows := make([][]any, 16)
		for i := range rows {
			rows[i] = randomRow(rng, nulls)
		}
		mu.Lock()
		if bb.rows+len(rows) > 4096 {
			bb.take()
		}
		bb.add(ts, rows)
		bb.cut()
		s := bb.segs[len(bb.segs)-1]
		s.Retain()
		mu.Unlock()
		segs <- s
	}
	close(segs)
	wg.Wait()
}

// TestIdleBlocksStaySmall: a block's vectors start at the size of the last
// block, so a table that takes a row at a time holds little memory.
func TestIdleBlocksStaySmall(t *testing.T) {
	schema := lake.FileSchema(Schema(everyKind))
	bb := newBlockBuilder(schema, everyKind, 8192)
	rng := rand.New(rand.NewPCG(3, 4))
	bb.add(1, [][]any{randomRow(rng, make([]float64, len(everyKind)))})
	small := bb.memoryBytes()
	if small > 32<<10 {
		t.Fatalf("a block of one row holds %d bytes", small)
	}
	rows := make([][]any, 8191)
	for i := range rows {
		rows[i] = randomRow(rng, make([]float64, len(everyKind)))
	}
	bb.add(2, rows)
	bb.take()
	bb.add(3, rows[:1])
	if full := bb.memoryBytes(); full < 8192*8 {
		t.Fatalf("after a full block the next holds %d bytes: it will grow by copying", full)
	}
}
