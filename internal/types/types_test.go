package types

import (
	"errors"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
)

func TestParseAndArrowRoundTrip(t *testing.T) {
	for _, s := range []string{"int8", "int16", "int32", "int64", "float32", "float64", "decimal(38,10)", "decimal(5,0)",
		"string", "bytes", "bool", "date", "timestamp", "timestamptz"} {
		ty, err := Parse(s)
		if err != nil || ty.String() != s {
			t.Fatalf("parse %q: %v %v", s, ty, err)
		}
		back, err := FromArrow(ty.ArrowType())
		if err != nil || back != ty {
			t.Fatalf("%s through arrow: %v %v", s, back, err)
		}
		text, _ := ty.MarshalText()
		var u Type
		if err := u.UnmarshalText(text); err != nil || u != ty {
			t.Fatalf("%s text round trip: %v %v", s, u, err)
		}
	}
	for _, bad := range []string{"", "int", "decimal(39,1)", "decimal(5,6)", "decimal(x,1)", "varchar"} {
		if _, err := Parse(bad); !errors.Is(err, ErrBadType) {
			t.Errorf("parse %q: %v", bad, err)
		}
	}
}

func TestCheck(t *testing.T) {
	ok := []struct {
		t Type
		v any
	}{
		{Of(Int8), int64(-128)}, {Of(Int32), int64(1 << 30)}, {Of(Float32), 1.5}, {DecimalOf(3, 1), decimal128.FromI64(999)},
		{Of(String), "x"}, {Of(Bytes), []byte{1}}, {Of(Bool), true}, {Of(Date), DateDays(3)}, {Of(TimestampTZ), TimestampMicros(7)},
	}
	for _, c := range ok {
		if err := c.t.Check(c.v); err != nil {
			t.Errorf("%s ← %v: %v", c.t, c.v, err)
		}
	}
	bad := []struct {
		t Type
		v any
	}{
		{Of(Int8), int64(128)}, {Of(Int16), int64(-40000)}, {Of(Int64), 3}, {DecimalOf(3, 1), decimal128.FromI64(1000)},
		{Of(String), []byte("x")}, {Of(Date), int64(1)}, {Of(Timestamp), DateDays(1)},
	}
	for _, c := range bad {
		if err := c.t.Check(c.v); !errors.Is(err, ErrTypeMismatch) {
			t.Errorf("%s ← %T %v accepted: %v", c.t, c.v, c.v, err)
		}
	}
}
