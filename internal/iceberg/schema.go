package iceberg

import (
	"encoding/json"
	"fmt"
	"strings"

	ice "github.com/apache/iceberg-go"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/types"
)

// Type mapping, Retina column type → Iceberg type. Iceberg has no 8- and
// 16-bit integers: those columns are Iceberg int, which every reader
// promotes from the file's narrower Parquet integer.
//
//	int8, int16, int32   int
//	int64                long
//	float32              float
//	float64              double
//	decimal(p,s)         decimal(p,s)
//	string               string
//	bytes                binary
//	bool                 boolean
//	date                 date
//	timestamp            timestamp      (µs, without time zone)
//	timestamptz          timestamptz    (µs, UTC)
func icebergType(t types.Type) (ice.Type, error) {
	switch t.Kind {
	case types.Int8, types.Int16, types.Int32:
		return ice.PrimitiveTypes.Int32, nil
	case types.Int64:
		return ice.PrimitiveTypes.Int64, nil
	case types.Float32:
		return ice.PrimitiveTypes.Float32, nil
	case types.Float64:
		return ice.PrimitiveTypes.Float64, nil
	case types.Decimal:
		if t.Precision == 0 || t.Precision > 38 || t.Scale > t.Precision {
			return nil, fmt.Errorf("decimal(%d,%d) has no Iceberg type (precision 1 to 38, scale at most the precision)", t.Precision, t.Scale)
		}
		return ice.DecimalTypeOf(int(t.Precision), int(t.Scale)), nil
	case types.String:
		return ice.PrimitiveTypes.String, nil
	case types.Bytes:
		return ice.PrimitiveTypes.Binary, nil
	case types.Bool:
		return ice.PrimitiveTypes.Bool, nil
	case types.Date:
		return ice.PrimitiveTypes.Date, nil
	case types.Timestamp:
		return ice.PrimitiveTypes.Timestamp, nil
	case types.TimestampTZ:
		return ice.PrimitiveTypes.TimestampTz, nil
	}
	return nil, fmt.Errorf("column type %s has no Iceberg type", t)
}

// schemaOf is the Iceberg schema of a Retina table: column i has field id
// i+1, the field id Retina's Parquet files give it (lake.FieldID), and the
// primary key is the schema's identifier fields.
func schemaOf(t *catalog.Table, id int) (*ice.Schema, error) {
	fields := make([]ice.NestedField, len(t.Schema.Columns))
	for i, c := range t.Schema.Columns {
		typ, err := icebergType(c.Type)
		if err != nil {
			return nil, fmt.Errorf("iceberg: table %s column %s: %w", t.Name, c.Name, err)
		}
		fields[i] = ice.NestedField{ID: lake.FieldID(i), Name: c.Name, Type: typ, Required: !c.Nullable}
	}
	var ids []int
	for _, k := range t.Schema.KeyColumns() {
		if k >= 0 {
			ids = append(ids, lake.FieldID(k))
		}
	}
	return ice.NewSchemaWithIdentifiers(id, ids, fields...), nil
}

// sameFields says two schemas have the same columns with the same ids,
// types and nullability (their schema ids aside).
func sameFields(a, b *ice.Schema) bool {
	if a == nil || b == nil {
		return false
	}
	af, bf := a.Fields(), b.Fields()
	if len(af) != len(bf) {
		return false
	}
	for i := range af {
		if af[i].ID != bf[i].ID || af[i].Name != bf[i].Name || !af[i].Type.Equals(bf[i].Type) || af[i].Required != bf[i].Required {
			return false
		}
	}
	return true
}

// nameMapping maps column names to field ids for files written before
// Retina numbered its Parquet columns: readers match those files' columns
// by name. The create_ts column maps to its own id, which the schema does
// not have, so readers skip it.
func nameMapping(t *catalog.Table) (string, error) {
	m := make(ice.NameMapping, 0, len(t.Schema.Columns)+1)
	for i, c := range t.Schema.Columns {
		id := lake.FieldID(i)
		m = append(m, ice.MappedField{FieldID: &id, Names: []string{c.Name}})
	}
	ts := lake.CreateTSFieldID
	m = append(m, ice.MappedField{FieldID: &ts, Names: []string{lake.CreateTSColumn}})
	data, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("iceberg: name mapping of %s: %w", t.Name, err)
	}
	return string(data), nil
}

// Namespace and name of a Retina table in the catalog: a table of a schema
// other than public is named "schema.table" in Retina and lives in the
// namespace of its schema; every other table lives in "public".
func splitName(retinaName string) (namespace, name string) {
	if ns, n, ok := strings.Cut(retinaName, "."); ok && ns != "" && n != "" {
		return ns, n
	}
	return "public", retinaName
}
