package scan

import (
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/retinadb/retina/internal/types"
)

// Value returns row i of an Arrow column as the Go value the types package
// uses for the column's type (nil for NULL).
func Value(a arrow.Array, i int) (any, error) {
	if a.IsNull(i) {
		return nil, nil
	}
	switch a := a.(type) {
	case *array.Int8:
		return int64(a.Value(i)), nil
	case *array.Int16:
		return int64(a.Value(i)), nil
	case *array.Int32:
		return int64(a.Value(i)), nil
	case *array.Int64:
		return a.Value(i), nil
	case *array.Float32:
		return float64(a.Value(i)), nil
	case *array.Float64:
		return a.Value(i), nil
	case *array.Decimal128:
		return a.Value(i), nil
	case *array.String:
		return a.Value(i), nil
	case *array.Binary:
		return append([]byte(nil), a.Value(i)...), nil
	case *array.Boolean:
		return a.Value(i), nil
	case *array.Date32:
		return types.DateDays(a.Value(i)), nil
	case *array.Timestamp:
		return types.TimestampMicros(a.Value(i)), nil
	}
	return nil, fmt.Errorf("scan: no Go value for Arrow type %s", a.DataType())
}
