package writebuffer

import (
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/decimal128"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/types"
)

// Column describes one table column for the buffer.
type Column struct {
	Name     string
	Type     types.Type
	Nullable bool
}

// appender adds one non-nil value (already checked) to a column builder.
type appender func(b array.Builder, v any)

func appenderFor(t types.Type) appender {
	switch t.Kind {
	case types.Int8:
		return func(b array.Builder, v any) { b.(*array.Int8Builder).Append(int8(v.(int64))) }
	case types.Int16:
		return func(b array.Builder, v any) { b.(*array.Int16Builder).Append(int16(v.(int64))) }
	case types.Int32:
		return func(b array.Builder, v any) { b.(*array.Int32Builder).Append(int32(v.(int64))) }
	case types.Int64:
		return func(b array.Builder, v any) { b.(*array.Int64Builder).Append(v.(int64)) }
	case types.Float32:
		return func(b array.Builder, v any) { b.(*array.Float32Builder).Append(float32(v.(float64))) }
	case types.Float64:
		return func(b array.Builder, v any) { b.(*array.Float64Builder).Append(v.(float64)) }
	case types.Decimal:
		return func(b array.Builder, v any) { b.(*array.Decimal128Builder).Append(v.(decimal128.Num)) }
	case types.String:
		return func(b array.Builder, v any) { b.(*array.StringBuilder).Append(v.(string)) }
	case types.Bytes:
		return func(b array.Builder, v any) { b.(*array.BinaryBuilder).Append(v.([]byte)) }
	case types.Bool:
		return func(b array.Builder, v any) { b.(*array.BooleanBuilder).Append(v.(bool)) }
	case types.Date:
		return func(b array.Builder, v any) { b.(*array.Date32Builder).Append(arrow.Date32(v.(types.DateDays))) }
	case types.Timestamp, types.TimestampTZ:
		return func(b array.Builder, v any) {
			b.(*array.TimestampBuilder).Append(arrow.Timestamp(v.(types.TimestampMicros)))
		}
	}
	return nil
}

// CheckRow validates one row against the columns: count, types, NULLs.
func CheckRow(cols []Column, row []any) error {
	if len(row) != len(cols) {
		return fmt.Errorf("%w: %d values for %d columns", types.ErrTypeMismatch, len(row), len(cols))
	}
	for i, v := range row {
		if v == nil {
			if !cols[i].Nullable {
				return fmt.Errorf("%w: NULL in NOT NULL column %s", types.ErrTypeMismatch, cols[i].Name)
			}
			continue
		}
		if err := cols[i].Type.Check(v); err != nil {
			return fmt.Errorf("column %s: %w", cols[i].Name, err)
		}
	}
	return nil
}

// Schema is the Arrow schema of the table's columns.
func Schema(cols []Column) *arrow.Schema {
	fields := make([]arrow.Field, len(cols))
	for i, c := range cols {
		fields[i] = arrow.Field{Name: c.Name, Type: c.Type.ArrowType(), Nullable: c.Nullable}
	}
	return arrow.NewSchema(fields, nil)
}

// TableColumns are the buffer columns of a table's schema.
func TableColumns(s catalog.Schema) []Column {
	cols := make([]Column, len(s.Columns))
	for i, c := range s.Columns {
		cols[i] = Column{Name: c.Name, Type: c.Type, Nullable: c.Nullable}
	}
	return cols
}
