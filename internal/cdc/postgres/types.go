package postgres

import (
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/retinadb/retina/internal/types"
)

// Type mapping (README "PostgreSQL types"). Every value keeps its exact
// PostgreSQL value: a type Retina has no column type for is held as text,
// exactly as PostgreSQL prints it.
//
//	int2, int4, int8, oid            int16, int32, int64 (oid: int64)
//	float4, float8                   float32, float64
//	numeric(p,s), p ≤ 38             decimal(p,s)
//	numeric, numeric(p,s) p > 38     string (exact digits; NaN and ±Infinity as text)
//	bool                             bool
//	text, varchar, char(n), name     string
//	bytea                            bytes
//	date                             date
//	timestamp                        timestamp (µs)
//	timestamptz                      timestamptz (µs, UTC)
//	everything else (time, timetz, interval, uuid, json, jsonb, enums,
//	arrays, ranges, inet, money, xml, domains, …)  string
//
// date and timestamps outside Retina's range (±infinity) are refused with
// the table and column named.

// column is one source column and how its text values become Retina values.
type column struct {
	Name    string
	Attnum  int32 // 0 when PostgreSQL's catalog no longer has the column
	OID     uint32
	TypMod  int32
	NotNull bool
	// Filled: PostgreSQL gives rows a value in it that no change carries
	// (a default, which rows present when the column was added got too).
	Filled bool
	PGType string // as format_type prints it
	Type   types.Type
}

// mapType picks the Retina type of a PostgreSQL column.
func mapType(oid uint32, typmod int32) types.Type {
	switch oid {
	case pgtype.Int2OID:
		return types.Of(types.Int16)
	case pgtype.Int4OID:
		return types.Of(types.Int32)
	case pgtype.Int8OID, pgtype.OIDOID:
		return types.Of(types.Int64)
	case pgtype.Float4OID:
		return types.Of(types.Float32)
	case pgtype.Float8OID:
		return types.Of(types.Float64)
	case pgtype.NumericOID:
		if typmod >= 4 {
			p, s := (typmod-4)>>16&0xffff, (typmod-4)&0xffff
			if p >= 1 && p <= types.MaxDecimalPrecision && s <= p {
				return types.DecimalOf(uint8(p), uint8(s))
			}
		}
		return types.Of(types.String)
	case pgtype.BoolOID:
		return types.Of(types.Bool)
	case pgtype.ByteaOID:
		return types.Of(types.Bytes)
	case pgtype.DateOID:
		return types.Of(types.Date)
	case pgtype.TimestampOID:
		return types.Of(types.Timestamp)
	case pgtype.TimestamptzOID:
		return types.Of(types.TimestampTZ)
	}
	return types.Of(types.String)
}

// typeMap parses PostgreSQL's text output of dates and timestamps; one per
// goroutine (pgtype.Map caches plans and is not safe for concurrent use).
type typeMap struct{ m *pgtype.Map }

func newTypeMap() typeMap { return typeMap{pgtype.NewMap()} }

// value turns one column's text value into its Retina value. The caller
// names the table; the error names the column and the value.
func (tm typeMap) value(c *column, text []byte) (any, error) {
	bad := func(err error) error {
		return fmt.Errorf("column %s (%s): value %.40q: %w", c.Name, c.Type, text, err)
	}
	switch c.Type.Kind {
	case types.Int16, types.Int32, types.Int64:
		n, err := strconv.ParseInt(string(text), 10, int(c.Type.Kind.IntBits()))
		if err != nil {
			return nil, bad(err)
		}
		return n, nil
	case types.Float32, types.Float64:
		bits := 64
		if c.Type.Kind == types.Float32 {
			bits = 32
		}
		f, err := strconv.ParseFloat(string(text), bits)
		if err != nil {
			return nil, bad(err)
		}
		return f, nil
	case types.Decimal:
		n, err := decimal128.FromString(string(text), int32(c.Type.Precision), int32(c.Type.Scale))
		if err != nil {
			return nil, bad(fmt.Errorf("%v (NaN and Infinity need an unconstrained numeric, held as text)", err))
		}
		return n, nil
	case types.Bool:
		switch string(text) {
		case "t":
			return true, nil
		case "f":
			return false, nil
		}
		return nil, bad(fmt.Errorf("not t or f"))
	case types.Bytes:
		if len(text) < 2 || text[0] != '\\' || text[1] != 'x' {
			return nil, bad(fmt.Errorf("want bytea_output = hex"))
		}
		b := make([]byte, hex.DecodedLen(len(text)-2))
		if _, err := hex.Decode(b, text[2:]); err != nil {
			return nil, bad(err)
		}
		return b, nil
	case types.Date:
		var d pgtype.Date
		if err := tm.m.Scan(pgtype.DateOID, pgtype.TextFormatCode, text, &d); err != nil {
			return nil, bad(err)
		}
		if d.InfinityModifier != pgtype.Finite {
			return nil, bad(fmt.Errorf("Retina dates are finite"))
		}
		return types.DateDays(d.Time.Unix() / 86400), nil // midnight UTC: exact
	case types.Timestamp:
		var ts pgtype.Timestamp
		if err := tm.m.Scan(pgtype.TimestampOID, pgtype.TextFormatCode, text, &ts); err != nil {
			return nil, bad(err)
		}
		if ts.InfinityModifier != pgtype.Finite {
			return nil, bad(fmt.Errorf("Retina timestamps are finite"))
		}
		return types.TimestampMicros(ts.Time.UnixMicro()), nil
	case types.TimestampTZ:
		var ts pgtype.Timestamptz
		if err := tm.m.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, text, &ts); err != nil {
			return nil, bad(err)
		}
		if ts.InfinityModifier != pgtype.Finite {
			return nil, bad(fmt.Errorf("Retina timestamps are finite"))
		}
		return types.TimestampMicros(ts.Time.UnixMicro()), nil
	}
	return string(text), nil
}
