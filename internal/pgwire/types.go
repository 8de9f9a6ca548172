package pgwire

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/retinadb/retina/internal/query"
)

// oidOf is the OID of a column or parameter type.
func oidOf(t query.Type) uint32 {
	switch t.Kind {
	case query.TypeBool:
		return pgtype.BoolOID
	case query.TypeInt16:
		return pgtype.Int2OID
	case query.TypeInt32:
		return pgtype.Int4OID
	case query.TypeInt64:
		return pgtype.Int8OID
	case query.TypeNumeric:
		return pgtype.NumericOID
	case query.TypeFloat32:
		return pgtype.Float4OID
	case query.TypeFloat64:
		return pgtype.Float8OID
	case query.TypeBytes:
		return pgtype.ByteaOID
	case query.TypeDate:
		return pgtype.DateOID
	case query.TypeTime:
		return pgtype.TimeOID
	case query.TypeTimestamp:
		return pgtype.TimestampOID
	case query.TypeTimestampTZ:
		return pgtype.TimestamptzOID
	case query.TypeInterval:
		return pgtype.IntervalOID
	case query.TypeUUID:
		return pgtype.UUIDOID
	case query.TypeJSON:
		return pgtype.JSONOID
	}
	return pgtype.TextOID
}

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// encodeText renders a value in PostgreSQL's text format.
func encodeText(v any, oid uint32) []byte {
	switch x := v.(type) {
	case nil:
		return nil
	case bool:
		if x {
			return []byte("t")
		}
		return []byte("f")
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64:
		return fmt.Append(nil, x)
	case float32:
		return []byte(formatFloat(float64(x), 32))
	case float64:
		return []byte(formatFloat(x, 64))
	case string:
		return []byte(x)
	case []byte:
		if oid == pgtype.UUIDOID && len(x) == 16 {
			return []byte(formatUUID(x))
		}
		return append([]byte(`\x`), hex.EncodeToString(x)...)
	case query.Decimal:
		return []byte(x.String())
	case *big.Int:
		return []byte(x.String())
	case time.Time:
		switch oid {
		case pgtype.DateOID:
			return []byte(x.Format("2006-01-02"))
		case pgtype.TimestamptzOID:
			return []byte(x.UTC().Format("2006-01-02 15:04:05.999999") + "+00")
		case pgtype.TimeOID:
			return []byte(x.Format("15:04:05.999999"))
		}
		return []byte(x.Format("2006-01-02 15:04:05.999999"))
	case query.Interval:
		return []byte(formatInterval(x))
	}
	return fmt.Append(nil, v)
}

func formatFloat(f float64, bits int) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return strconv.FormatFloat(f, 'g', -1, bits)
}

func formatUUID(b []byte) string {
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// formatInterval renders an interval as PostgreSQL's default
// IntervalStyle (postgres) does: "1 year 2 mons -3 days +04:05:06.5".
func formatInterval(iv query.Interval) string {
	var b strings.Builder
	negBefore := false // an earlier part was negative: later positives get a +
	part := func(n int64, unit string) {
		if n == 0 {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if negBefore && n > 0 {
			b.WriteByte('+')
		}
		fmt.Fprintf(&b, "%d %s", n, unit)
		if n != 1 {
			b.WriteByte('s')
		}
		negBefore = n < 0
	}
	part(int64(iv.Months/12), "year")
	part(int64(iv.Months%12), "mon")
	part(int64(iv.Days), "day")
	if iv.Micros == 0 && b.Len() > 0 {
		return b.String()
	}
	if b.Len() > 0 {
		b.WriteByte(' ')
	}
	us := iv.Micros
	switch {
	case us < 0:
		b.WriteByte('-')
		us = -us
	case negBefore:
		b.WriteByte('+')
	}
	secs := us / 1e6
	fmt.Fprintf(&b, "%02d:%02d:%02d", secs/3600, secs/60%60, secs%60)
	if frac := us % 1e6; frac != 0 {
		b.WriteString(strings.TrimRight(fmt.Sprintf(".%06d", frac), "0"))
	}
	return b.String()
}

// encodeBinary renders a value in PostgreSQL's binary format for its OID.
func encodeBinary(v any, oid uint32) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	switch oid {
	case pgtype.BoolOID:
		if b, ok := v.(bool); ok && b {
			return []byte{1}, nil
		}
		return []byte{0}, nil
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID:
		n, err := toInt64(v)
		if err != nil {
			return nil, err
		}
		switch oid {
		case pgtype.Int2OID:
			return binary.BigEndian.AppendUint16(nil, uint16(n)), nil
		case pgtype.Int4OID:
			return binary.BigEndian.AppendUint32(nil, uint32(n)), nil
		}
		return binary.BigEndian.AppendUint64(nil, uint64(n)), nil
	case pgtype.Float4OID:
		f, _ := toFloat64(v)
		return binary.BigEndian.AppendUint32(nil, math.Float32bits(float32(f))), nil
	case pgtype.Float8OID:
		f, _ := toFloat64(v)
		return binary.BigEndian.AppendUint64(nil, math.Float64bits(f)), nil
	case pgtype.ByteaOID, pgtype.UUIDOID:
		if b, ok := v.([]byte); ok {
			return b, nil
		}
	case pgtype.DateOID:
		if t, ok := v.(time.Time); ok {
			days := t.UTC().Truncate(24*time.Hour).Sub(pgEpoch).Hours() / 24
			return binary.BigEndian.AppendUint32(nil, uint32(int32(math.Floor(days)))), nil
		}
	case pgtype.TimestampOID, pgtype.TimestamptzOID:
		if t, ok := v.(time.Time); ok {
			return binary.BigEndian.AppendUint64(nil, uint64(t.UnixMicro()-pgEpoch.UnixMicro())), nil
		}
	case pgtype.NumericOID:
		return encodeNumeric(string(encodeText(v, oid)))
	case pgtype.TimeOID:
		if t, ok := v.(time.Time); ok {
			us := int64(t.Hour())*3_600_000_000 + int64(t.Minute())*60_000_000 + int64(t.Second())*1_000_000 + int64(t.Nanosecond()/1000)
			return binary.BigEndian.AppendUint64(nil, uint64(us)), nil
		}
	case pgtype.JSONOID, pgtype.TextOID, pgtype.VarcharOID:
		return encodeText(v, oid), nil
	case pgtype.IntervalOID:
		if iv, ok := v.(query.Interval); ok {
			b := binary.BigEndian.AppendUint64(nil, uint64(iv.Micros))
			b = binary.BigEndian.AppendUint32(b, uint32(iv.Days))
			return binary.BigEndian.AppendUint32(b, uint32(iv.Months)), nil
		}
	default:
		return encodeText(v, oid), nil
	}
	return nil, fmt.Errorf("pgwire: cannot encode %T as binary type %d", v, oid)
}

func toInt64(v any) (int64, error) {
	switch x := v.(type) {
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case int64:
		return x, nil
	case int:
		return int64(x), nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint64:
		return int64(x), nil
	}
	return 0, fmt.Errorf("pgwire: %T is not an integer", v)
}

func toFloat64(v any) (float64, error) {
	switch x := v.(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	}
	n, err := toInt64(v)
	return float64(n), err
}

// encodeNumeric writes PostgreSQL's binary numeric: base-10000 digits with
// a weight, a sign and a display scale.
func encodeNumeric(s string) ([]byte, error) {
	sign := uint16(0)
	if strings.HasPrefix(s, "-") {
		sign, s = 0x4000, s[1:]
	}
	intPart, frac, _ := strings.Cut(s, ".")
	for _, c := range intPart + frac {
		if c < '0' || c > '9' {
			return nil, fmt.Errorf("pgwire: %q is not a number", s)
		}
	}
	dscale := len(frac)
	// Pad the integer part to whole groups of 4 on the left and the
	// fraction on the right.
	intPart = strings.Repeat("0", (4-len(intPart)%4)%4) + intPart
	frac += strings.Repeat("0", (4-len(frac)%4)%4)
	all := intPart + frac
	digits := make([]uint16, 0, len(all)/4)
	for i := 0; i < len(all); i += 4 {
		d, _ := strconv.Atoi(all[i : i+4])
		digits = append(digits, uint16(d))
	}
	weight := len(intPart)/4 - 1
	for len(digits) > 0 && digits[0] == 0 { // leading zero groups
		digits = digits[1:]
		weight--
	}
	for len(digits) > 0 && digits[len(digits)-1] == 0 { // trailing zero groups
		digits = digits[:len(digits)-1]
	}
	if len(digits) == 0 {
		weight, sign = 0, 0
	}
	b := binary.BigEndian.AppendUint16(nil, uint16(len(digits)))
	b = binary.BigEndian.AppendUint16(b, uint16(int16(weight)))
	b = binary.BigEndian.AppendUint16(b, sign)
	b = binary.BigEndian.AppendUint16(b, uint16(dscale))
	for _, d := range digits {
		b = binary.BigEndian.AppendUint16(b, d)
	}
	return b, nil
}

// decodeNumeric reads PostgreSQL's binary numeric as decimal text.
func decodeNumeric(b []byte) (string, error) {
	if len(b) < 8 {
		return "", fmt.Errorf("pgwire: numeric of %d bytes", len(b))
	}
	n := int(binary.BigEndian.Uint16(b))
	weight := int(int16(binary.BigEndian.Uint16(b[2:])))
	sign := binary.BigEndian.Uint16(b[4:])
	dscale := int(binary.BigEndian.Uint16(b[6:]))
	if len(b) != 8+2*n {
		return "", fmt.Errorf("pgwire: numeric with %d digits in %d bytes", n, len(b))
	}
	if sign == 0xC000 {
		return "NaN", nil
	}
	digit := func(i int) int {
		if i < 0 || i >= n {
			return 0
		}
		return int(binary.BigEndian.Uint16(b[8+2*i:]))
	}
	// value = Σ digit(i) × 10000^(weight−i)
	in := "0"
	if weight >= 0 {
		var ip strings.Builder
		for i := 0; i <= weight; i++ {
			if i == 0 {
				fmt.Fprintf(&ip, "%d", digit(i))
			} else {
				fmt.Fprintf(&ip, "%04d", digit(i))
			}
		}
		in = ip.String()
	}
	var fp strings.Builder
	for i := weight + 1; i < n; i++ {
		fmt.Fprintf(&fp, "%04d", digit(i))
	}
	f := fp.String()
	for len(f) < dscale {
		f += "0"
	}
	f = f[:dscale]
	out := in
	if dscale > 0 {
		out += "." + f
	}
	if sign == 0x4000 {
		out = "-" + out
	}
	return out, nil
}

// decodeParam turns a bound parameter into a Go value DuckDB accepts.
func decodeParam(b []byte, oid uint32, format int16) (any, error) {
	if b == nil {
		return nil, nil
	}
	if format == 0 { // text: DuckDB casts strings where it needs to
		switch oid {
		case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID:
			return strconv.ParseInt(string(b), 10, 64)
		case pgtype.Float4OID, pgtype.Float8OID:
			return strconv.ParseFloat(string(b), 64)
		case pgtype.BoolOID:
			return strconv.ParseBool(string(b))
		}
		return string(b), nil
	}
	switch oid {
	case pgtype.BoolOID:
		return len(b) == 1 && b[0] == 1, nil
	case pgtype.Int2OID:
		if len(b) == 2 {
			return int64(int16(binary.BigEndian.Uint16(b))), nil
		}
	case pgtype.Int4OID:
		if len(b) == 4 {
			return int64(int32(binary.BigEndian.Uint32(b))), nil
		}
	case pgtype.Int8OID:
		if len(b) == 8 {
			return int64(binary.BigEndian.Uint64(b)), nil
		}
	case pgtype.Float4OID:
		if len(b) == 4 {
			return float64(math.Float32frombits(binary.BigEndian.Uint32(b))), nil
		}
	case pgtype.Float8OID:
		if len(b) == 8 {
			return math.Float64frombits(binary.BigEndian.Uint64(b)), nil
		}
	case pgtype.TextOID, pgtype.VarcharOID:
		return string(b), nil
	case pgtype.ByteaOID:
		return b, nil
	case pgtype.DateOID:
		if len(b) == 4 {
			return pgEpoch.AddDate(0, 0, int(int32(binary.BigEndian.Uint32(b)))), nil
		}
	case pgtype.TimestampOID, pgtype.TimestamptzOID:
		if len(b) == 8 {
			return time.UnixMicro(pgEpoch.UnixMicro() + int64(binary.BigEndian.Uint64(b))).UTC(), nil
		}
	case pgtype.NumericOID:
		return decodeNumeric(b)
	case pgtype.UUIDOID:
		if len(b) == 16 {
			return formatUUID(b), nil
		}
	case pgtype.TimeOID:
		if len(b) == 8 {
			us := int64(binary.BigEndian.Uint64(b))
			return time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(us) * time.Microsecond).Format("15:04:05.999999"), nil
		}
	case pgtype.IntervalOID:
		if len(b) == 16 {
			return query.Interval{Micros: int64(binary.BigEndian.Uint64(b)), Days: int32(binary.BigEndian.Uint32(b[8:])),
				Months: int32(binary.BigEndian.Uint32(b[12:]))}, nil
		}
	case pgtype.JSONOID:
		return string(b), nil
	default:
		return nil, fmt.Errorf("pgwire: parameters of type %d are taken in text format only", oid)
	}
	return nil, fmt.Errorf("pgwire: bad binary parameter of %d bytes for type %d", len(b), oid)
}

// typeSize is pg_type.typlen: the width of a fixed-size type, -1 otherwise.
func typeSize(t query.Type) int16 {
	switch t.Kind {
	case query.TypeBool:
		return 1
	case query.TypeInt16:
		return 2
	case query.TypeInt32, query.TypeFloat32, query.TypeDate:
		return 4
	case query.TypeInt64, query.TypeFloat64, query.TypeTime, query.TypeTimestamp, query.TypeTimestampTZ:
		return 8
	case query.TypeInterval, query.TypeUUID:
		return 16
	}
	return -1
}

// typeModifier is PostgreSQL's atttypmod: numeric(p,s) is ((p << 16) | s) + 4.
func typeModifier(t query.Type) int32 {
	if t.Kind == query.TypeNumeric && t.Precision > 0 {
		return int32(t.Precision)<<16 | int32(t.Scale) + 4
	}
	return -1
}
