package types

import (
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
)

// ArrowType is the Arrow type that carries values of t in memory and in
// Parquet files.
func (t Type) ArrowType() arrow.DataType {
	switch t.Kind {
	case Int8:
		return arrow.PrimitiveTypes.Int8
	case Int16:
		return arrow.PrimitiveTypes.Int16
	case Int32:
		return arrow.PrimitiveTypes.Int32
	case Int64:
		return arrow.PrimitiveTypes.Int64
	case Float32:
		return arrow.PrimitiveTypes.Float32
	case Float64:
		return arrow.PrimitiveTypes.Float64
	case Decimal:
		return &arrow.Decimal128Type{Precision: int32(t.Precision), Scale: int32(t.Scale)}
	case String:
		return arrow.BinaryTypes.String
	case Bytes:
		return arrow.BinaryTypes.Binary
	case Bool:
		return arrow.FixedWidthTypes.Boolean
	case Date:
		return arrow.FixedWidthTypes.Date32
	case Timestamp:
		return &arrow.TimestampType{Unit: arrow.Microsecond}
	case TimestampTZ:
		return &arrow.TimestampType{Unit: arrow.Microsecond, TimeZone: "UTC"}
	}
	return nil
}

// FromArrow maps an Arrow type back to a column type.
func FromArrow(dt arrow.DataType) (Type, error) {
	switch dt.ID() {
	case arrow.INT8:
		return Of(Int8), nil
	case arrow.INT16:
		return Of(Int16), nil
	case arrow.INT32:
		return Of(Int32), nil
	case arrow.INT64:
		return Of(Int64), nil
	case arrow.FLOAT32:
		return Of(Float32), nil
	case arrow.FLOAT64:
		return Of(Float64), nil
	case arrow.DECIMAL128:
		d := dt.(*arrow.Decimal128Type)
		t := DecimalOf(uint8(d.Precision), uint8(d.Scale))
		return t, t.Validate()
	case arrow.STRING:
		return Of(String), nil
	case arrow.BINARY:
		return Of(Bytes), nil
	case arrow.BOOL:
		return Of(Bool), nil
	case arrow.DATE32:
		return Of(Date), nil
	case arrow.TIMESTAMP:
		ts := dt.(*arrow.TimestampType)
		if ts.Unit != arrow.Microsecond {
			return Type{}, fmt.Errorf("%w: timestamp unit %s (want µs)", ErrBadType, ts.Unit)
		}
		if ts.TimeZone != "" {
			return Of(TimestampTZ), nil
		}
		return Of(Timestamp), nil
	}
	return Type{}, fmt.Errorf("%w: arrow type %s", ErrBadType, dt)
}
