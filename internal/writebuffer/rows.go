package writebuffer

import (
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/types"
)

// Column describes one table column for the buffer.
type Column struct {
	Name     string
	Type     types.Type
	Nullable bool
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
