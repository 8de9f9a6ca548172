// Package types defines the column types Retina tables support and the Go
// values that carry them between packages (keys, change events, rows).
//
// Go representation of a non-NULL value, by kind:
//
//	int8, int16, int32, int64     int64 (range-checked against the width)
//	float32, float64              float64
//	decimal(p,s)                  decimal128.Num, the unscaled value (value × 10^s)
//	string                        string
//	bytes                         []byte
//	bool                          bool
//	date                          DateDays (days since 1970-01-01)
//	timestamp, timestamptz        TimestampMicros (since 1970-01-01 UTC)
//
// NULL is nil.
package types

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
)

// Kind is a column type without parameters.
type Kind uint8

// The supported kinds. The zero Kind is invalid.
const (
	Int8 Kind = iota + 1
	Int16
	Int32
	Int64
	Float32
	Float64
	Decimal
	String
	Bytes
	Bool
	Date
	Timestamp   // microseconds, without time zone
	TimestampTZ // microseconds, with time zone (stored as UTC)
)

var kindNames = map[Kind]string{
	Int8: "int8", Int16: "int16", Int32: "int32", Int64: "int64",
	Float32: "float32", Float64: "float64", Decimal: "decimal",
	String: "string", Bytes: "bytes", Bool: "bool", Date: "date",
	Timestamp: "timestamp", TimestampTZ: "timestamptz",
}

func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// IntBits is the width of an integer kind, 0 for other kinds.
func (k Kind) IntBits() uint {
	switch k {
	case Int8:
		return 8
	case Int16:
		return 16
	case Int32:
		return 32
	case Int64:
		return 64
	}
	return 0
}

// MaxDecimalPrecision is the widest decimal: it fits a 128-bit integer.
const MaxDecimalPrecision = 38

// Type is a column type: a kind plus, for decimals, precision and scale.
type Type struct {
	Kind      Kind
	Precision uint8 // decimal digits in total, 1..38
	Scale     uint8 // digits after the point, 0..Precision
}

// ErrBadType is wrapped by every invalid-type error.
var ErrBadType = errors.New("types: invalid type")

// Validate reports whether the type is usable.
func (t Type) Validate() error {
	if _, ok := kindNames[t.Kind]; !ok {
		return fmt.Errorf("%w: unknown kind %d", ErrBadType, t.Kind)
	}
	if t.Kind == Decimal {
		if t.Precision < 1 || t.Precision > MaxDecimalPrecision || t.Scale > t.Precision {
			return fmt.Errorf("%w: decimal(%d,%d): need 1 ≤ precision ≤ %d and scale ≤ precision", ErrBadType, t.Precision, t.Scale, MaxDecimalPrecision)
		}
	} else if t.Precision != 0 || t.Scale != 0 {
		return fmt.Errorf("%w: %s takes no precision or scale", ErrBadType, t.Kind)
	}
	return nil
}

func (t Type) String() string {
	if t.Kind == Decimal {
		return fmt.Sprintf("decimal(%d,%d)", t.Precision, t.Scale)
	}
	return t.Kind.String()
}

// Of returns the type of a kind that takes no parameters.
func Of(k Kind) Type { return Type{Kind: k} }

// DecimalOf returns decimal(precision, scale).
func DecimalOf(precision, scale uint8) Type {
	return Type{Kind: Decimal, Precision: precision, Scale: scale}
}

// Parse reads a type as String writes it ("int64", "decimal(12,2)", ...).
func Parse(s string) (Type, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if rest, ok := strings.CutPrefix(s, "decimal("); ok {
		body, ok := strings.CutSuffix(rest, ")")
		ps, ss, ok2 := strings.Cut(body, ",")
		if !ok || !ok2 {
			return Type{}, fmt.Errorf("%w: %q", ErrBadType, s)
		}
		p, err1 := strconv.ParseUint(strings.TrimSpace(ps), 10, 8)
		sc, err2 := strconv.ParseUint(strings.TrimSpace(ss), 10, 8)
		if err1 != nil || err2 != nil {
			return Type{}, fmt.Errorf("%w: %q", ErrBadType, s)
		}
		t := DecimalOf(uint8(p), uint8(sc))
		return t, t.Validate()
	}
	for k, n := range kindNames {
		if n == s && k != Decimal {
			return Of(k), nil
		}
	}
	return Type{}, fmt.Errorf("%w: %q", ErrBadType, s)
}

// DateDays is a calendar date as days since 1970-01-01.
type DateDays int32

// TimestampMicros is microseconds since 1970-01-01 00:00:00 UTC.
type TimestampMicros int64

// ErrTypeMismatch is wrapped when a value does not fit its column type.
var ErrTypeMismatch = errors.New("types: value does not match column type")

// Check reports whether v (non-nil) is a valid value of type t.
func (t Type) Check(v any) error {
	bad := func() error { return fmt.Errorf("%w: %T %v for %s", ErrTypeMismatch, v, v, t) }
	switch t.Kind {
	case Int8, Int16, Int32, Int64:
		i, ok := v.(int64)
		if !ok {
			return bad()
		}
		if bits := t.Kind.IntBits(); bits < 64 && (i < -(1<<(bits-1)) || i >= 1<<(bits-1)) {
			return fmt.Errorf("%w: %d out of range for %s", ErrTypeMismatch, i, t)
		}
	case Float32, Float64:
		if _, ok := v.(float64); !ok {
			return bad()
		}
	case Decimal:
		d, ok := v.(decimal128.Num)
		if !ok {
			return bad()
		}
		if !d.FitsInPrecision(int32(t.Precision)) {
			return fmt.Errorf("%w: %s has more than %d digits", ErrTypeMismatch, d.ToString(int32(t.Scale)), t.Precision)
		}
	case String:
		if _, ok := v.(string); !ok {
			return bad()
		}
	case Bytes:
		if _, ok := v.([]byte); !ok {
			return bad()
		}
	case Bool:
		if _, ok := v.(bool); !ok {
			return bad()
		}
	case Date:
		if _, ok := v.(DateDays); !ok {
			return bad()
		}
	case Timestamp, TimestampTZ:
		if _, ok := v.(TimestampMicros); !ok {
			return bad()
		}
	default:
		return fmt.Errorf("%w: unknown kind %d", ErrBadType, t.Kind)
	}
	return nil
}

// MarshalText writes the type as String does.
func (t Type) MarshalText() ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return []byte(t.String()), nil
}

// UnmarshalText reads a type written by MarshalText.
func (t *Type) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}
