package query

import (
	"encoding/json"
	"fmt"
	"math/big"

	"github.com/duckdb/duckdb-go/v2"
)

// TypeKind is a SQL type as clients see it, whatever engine computed it.
type TypeKind uint8

// The kinds a result column or a parameter can have. Text stands for any
// type without a closer match (lists, maps, enums, …), rendered as text.
const (
	TypeText TypeKind = iota
	TypeBool
	TypeInt16
	TypeInt32
	TypeInt64
	TypeNumeric
	TypeFloat32
	TypeFloat64
	TypeBytes
	TypeDate
	TypeTime
	TypeTimestamp
	TypeTimestampTZ
	TypeInterval
	TypeUUID
	TypeJSON
)

var kindNames = [...]string{
	TypeText: "text", TypeBool: "boolean", TypeInt16: "smallint", TypeInt32: "integer", TypeInt64: "bigint",
	TypeNumeric: "numeric", TypeFloat32: "real", TypeFloat64: "double precision", TypeBytes: "bytea",
	TypeDate: "date", TypeTime: "time without time zone", TypeTimestamp: "timestamp without time zone",
	TypeTimestampTZ: "timestamp with time zone", TypeInterval: "interval", TypeUUID: "uuid", TypeJSON: "json",
}

// Type is a column's or parameter's type: a kind, with precision and
// scale for a numeric of known size (Precision 0: unconstrained).
type Type struct {
	Kind      TypeKind
	Precision uint8
	Scale     uint8
}

// String is PostgreSQL's name of the type, as format_type renders it.
func (t Type) String() string {
	if t.Kind == TypeNumeric && t.Precision > 0 {
		return fmt.Sprintf("numeric(%d,%d)", t.Precision, t.Scale)
	}
	if int(t.Kind) < len(kindNames) {
		return kindNames[t.Kind]
	}
	return "text"
}

// Decimal is an exact numeric value: Value × 10^-Scale.
type Decimal struct {
	Value *big.Int
	Scale uint8
}

// String renders the value in plain notation, with Scale digits after the
// point.
func (d Decimal) String() string {
	s := new(big.Int).Abs(d.Value).String()
	sign := ""
	if d.Value.Sign() < 0 {
		sign = "-"
	}
	if d.Scale == 0 {
		return sign + s
	}
	for len(s) <= int(d.Scale) {
		s = "0" + s
	}
	return sign + s[:len(s)-int(d.Scale)] + "." + s[len(s)-int(d.Scale):]
}

// Interval is a span of months, days and microseconds, kept apart as
// PostgreSQL keeps them.
type Interval struct {
	Months int32
	Days   int32
	Micros int64
}

// typeOfDuck maps a DuckDB type, as prepared statements describe it.
func typeOfDuck(t duckdb.Type, info duckdb.TypeInfo) Type {
	switch t {
	case duckdb.TYPE_BOOLEAN:
		return Type{Kind: TypeBool}
	case duckdb.TYPE_TINYINT, duckdb.TYPE_SMALLINT, duckdb.TYPE_UTINYINT:
		return Type{Kind: TypeInt16}
	case duckdb.TYPE_INTEGER, duckdb.TYPE_USMALLINT:
		return Type{Kind: TypeInt32}
	case duckdb.TYPE_BIGINT, duckdb.TYPE_UINTEGER:
		return Type{Kind: TypeInt64}
	case duckdb.TYPE_UBIGINT, duckdb.TYPE_HUGEINT, duckdb.TYPE_UHUGEINT, duckdb.TYPE_BIGNUM:
		return Type{Kind: TypeNumeric}
	case duckdb.TYPE_DECIMAL:
		if info != nil {
			if d, ok := info.Details().(*duckdb.DecimalDetails); ok {
				return Type{Kind: TypeNumeric, Precision: d.Width, Scale: d.Scale}
			}
		}
		return Type{Kind: TypeNumeric}
	case duckdb.TYPE_FLOAT:
		return Type{Kind: TypeFloat32}
	case duckdb.TYPE_DOUBLE:
		return Type{Kind: TypeFloat64}
	case duckdb.TYPE_BLOB:
		return Type{Kind: TypeBytes}
	case duckdb.TYPE_DATE:
		return Type{Kind: TypeDate}
	case duckdb.TYPE_TIME:
		return Type{Kind: TypeTime}
	case duckdb.TYPE_TIMESTAMP, duckdb.TYPE_TIMESTAMP_S, duckdb.TYPE_TIMESTAMP_MS, duckdb.TYPE_TIMESTAMP_NS:
		return Type{Kind: TypeTimestamp}
	case duckdb.TYPE_TIMESTAMP_TZ:
		return Type{Kind: TypeTimestampTZ}
	case duckdb.TYPE_INTERVAL:
		return Type{Kind: TypeInterval}
	case duckdb.TYPE_UUID:
		return Type{Kind: TypeUUID}
	case duckdb.TYPE_VARCHAR:
		if info != nil && info.Alias() == "JSON" {
			return Type{Kind: TypeJSON}
		}
	}
	return Type{Kind: TypeText}
}

// jsonText is a JSON value as text.
func jsonText(v any) any {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// neutral turns a value DuckDB returned into one of the types this package
// promises (Decimal and Interval for DuckDB's own; []byte copied, as the
// driver may reuse it).
func neutral(v any) any {
	switch x := v.(type) {
	case duckdb.Decimal:
		return Decimal{Value: x.Value, Scale: x.Scale}
	case duckdb.Interval:
		return Interval{Months: x.Months, Days: x.Days, Micros: x.Micros}
	case duckdb.UUID:
		return append([]byte(nil), x[:]...)
	case []byte:
		return append([]byte(nil), x...)
	}
	return v
}
