package index

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/apache/arrow-go/v18/arrow/decimal128"

	"github.com/retinadb/retina/internal/types"
)

// Key encoding
//
// An index key is the index id as 4 big-endian bytes followed by each key
// column. A column is one marker byte, 0x00 for NULL (sorts first) or 0x01
// for a value, then the value:
//
//	intN, date, timestamp  N/8 bytes big-endian with the sign bit flipped
//	float32, float64       IEEE bits big-endian; negative numbers have every
//	                       bit inverted, others only the sign bit; -0 is
//	                       written as +0 and every NaN as one NaN (last)
//	decimal(p,s)           the unscaled 128-bit value, 16 bytes big-endian
//	                       with the sign bit flipped (the scale is the
//	                       column's, so equal values have equal bytes)
//	string, bytes          the bytes with 0x00 written as 0x00 0xFF, then
//	                       the terminator 0x00 0x01
//	bool                   0x00 or 0x01
//
// Bytewise order of encodings equals the order of the values column by
// column, and for a fixed column list no encoding is a prefix of another,
// so two different keys never share bytes and a versioned suffix can be
// appended safely.

const (
	markNull  = 0x00
	markValue = 0x01
	escByte   = 0xFF
	termByte  = 0x01
)

// ErrKeyMismatch is wrapped when key values do not fit the index's columns.
var ErrKeyMismatch = errors.New("index: key does not match the index columns")

// ErrBadKey is wrapped when bytes do not decode as a key of the index.
var ErrBadKey = errors.New("index: malformed key")

// AppendKey appends the encoding of (index id, values) to dst, checking each
// value against its column type.
func AppendKey(dst []byte, id uint32, cols []types.Type, vals []any) ([]byte, error) {
	if len(vals) != len(cols) {
		return dst, fmt.Errorf("%w: %d values for %d columns", ErrKeyMismatch, len(vals), len(cols))
	}
	dst = binary.BigEndian.AppendUint32(dst, id)
	for i, v := range vals {
		var err error
		if dst, err = appendColumn(dst, cols[i], v); err != nil {
			return dst, fmt.Errorf("key column %d: %w", i, err)
		}
	}
	return dst, nil
}

func appendColumn(dst []byte, t types.Type, v any) ([]byte, error) {
	if v == nil {
		return append(dst, markNull), nil
	}
	if err := t.Check(v); err != nil {
		return dst, fmt.Errorf("%w: %w", ErrKeyMismatch, err)
	}
	dst = append(dst, markValue)
	switch t.Kind {
	case types.Int8:
		return append(dst, byte(v.(int64))^0x80), nil
	case types.Int16:
		return binary.BigEndian.AppendUint16(dst, uint16(v.(int64))^1<<15), nil
	case types.Int32:
		return binary.BigEndian.AppendUint32(dst, uint32(v.(int64))^1<<31), nil
	case types.Int64:
		return binary.BigEndian.AppendUint64(dst, uint64(v.(int64))^1<<63), nil
	case types.Date:
		return binary.BigEndian.AppendUint32(dst, uint32(v.(types.DateDays))^1<<31), nil
	case types.Timestamp, types.TimestampTZ:
		return binary.BigEndian.AppendUint64(dst, uint64(v.(types.TimestampMicros))^1<<63), nil
	case types.Float32:
		return binary.BigEndian.AppendUint32(dst, orderedFloat32(float32(v.(float64)))), nil
	case types.Float64:
		return binary.BigEndian.AppendUint64(dst, orderedFloat64(v.(float64))), nil
	case types.Decimal:
		d := v.(decimal128.Num)
		dst = binary.BigEndian.AppendUint64(dst, uint64(d.HighBits())^1<<63)
		return binary.BigEndian.AppendUint64(dst, d.LowBits()), nil
	case types.String:
		return appendEscaped(dst, v.(string)), nil
	case types.Bytes:
		return appendEscaped(dst, v.([]byte)), nil
	case types.Bool:
		if v.(bool) {
			return append(dst, 1), nil
		}
		return append(dst, 0), nil
	}
	return dst, fmt.Errorf("%w: kind %s", ErrKeyMismatch, t.Kind)
}

func appendEscaped[S string | []byte](dst []byte, s S) []byte {
	for i := range len(s) {
		if s[i] == 0 {
			dst = append(dst, 0, escByte)
		} else {
			dst = append(dst, s[i])
		}
	}
	return append(dst, 0, termByte)
}

func orderedFloat64(f float64) uint64 {
	switch {
	case f == 0:
		f = 0 // -0 and +0 are one value
	case math.IsNaN(f):
		return math.MaxUint64
	}
	b := math.Float64bits(f)
	if b>>63 == 1 {
		return ^b
	}
	return b | 1<<63
}

func orderedFloat32(f float32) uint32 {
	switch {
	case f == 0:
		f = 0
	case f != f: // NaN
		return math.MaxUint32
	}
	b := math.Float32bits(f)
	if b>>31 == 1 {
		return ^b
	}
	return b | 1<<31
}

// DecodeKey splits a key into its index id and column values. It is the
// inverse of AppendKey for keys that AppendKey produced (NaN and -0 decode
// as the canonical NaN and +0) and rejects anything else.
func DecodeKey(key []byte, cols []types.Type) (uint32, []any, error) {
	id, vals, rest, err := decodePrefix(key, cols)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%w: %d trailing bytes", ErrBadKey, len(rest))
	}
	return id, vals, err
}

// decodePrefix decodes the id and columns and returns what follows them.
func decodePrefix(key []byte, cols []types.Type) (uint32, []any, []byte, error) {
	if len(key) < 4 {
		return 0, nil, nil, fmt.Errorf("%w: %d bytes, shorter than an index id", ErrBadKey, len(key))
	}
	id := binary.BigEndian.Uint32(key)
	rest := key[4:]
	vals := make([]any, len(cols))
	for i, t := range cols {
		var err error
		if vals[i], rest, err = decodeColumn(rest, t); err != nil {
			return 0, nil, nil, fmt.Errorf("key column %d (%s): %w", i, t, err)
		}
	}
	return id, vals, rest, nil
}

// fixedWidth is the encoded width of a fixed-size kind, 0 for the others.
func fixedWidth(k types.Kind) int {
	switch k {
	case types.Int8, types.Bool:
		return 1
	case types.Int16:
		return 2
	case types.Int32, types.Date, types.Float32:
		return 4
	case types.Int64, types.Timestamp, types.TimestampTZ, types.Float64:
		return 8
	case types.Decimal:
		return 16
	}
	return 0
}

func decodeColumn(b []byte, t types.Type) (any, []byte, error) {
	short := fmt.Errorf("%w: truncated", ErrBadKey)
	if len(b) == 0 {
		return nil, nil, short
	}
	switch b[0] {
	case markNull:
		return nil, b[1:], nil
	case markValue:
	default:
		return nil, nil, fmt.Errorf("%w: marker byte %#x", ErrBadKey, b[0])
	}
	b = b[1:]
	if len(b) < fixedWidth(t.Kind) {
		return nil, nil, short
	}
	switch t.Kind {
	case types.Int8:
		return int64(int8(b[0] ^ 0x80)), b[1:], nil
	case types.Int16:
		return int64(int16(binary.BigEndian.Uint16(b) ^ 1<<15)), b[2:], nil
	case types.Int32:
		return int64(int32(binary.BigEndian.Uint32(b) ^ 1<<31)), b[4:], nil
	case types.Int64:
		return int64(binary.BigEndian.Uint64(b) ^ 1<<63), b[8:], nil
	case types.Date:
		return types.DateDays(int32(binary.BigEndian.Uint32(b) ^ 1<<31)), b[4:], nil
	case types.Timestamp, types.TimestampTZ:
		return types.TimestampMicros(int64(binary.BigEndian.Uint64(b) ^ 1<<63)), b[8:], nil
	case types.Float32:
		u := binary.BigEndian.Uint32(b)
		switch {
		case u == math.MaxUint32:
			return math.NaN(), b[4:], nil
		case u>>31 == 1:
			u &^= 1 << 31
		default:
			u = ^u
		}
		return float64(math.Float32frombits(u)), b[4:], nil
	case types.Float64:
		u := binary.BigEndian.Uint64(b)
		switch {
		case u == math.MaxUint64:
			return math.NaN(), b[8:], nil
		case u>>63 == 1:
			u &^= 1 << 63
		default:
			u = ^u
		}
		return math.Float64frombits(u), b[8:], nil
	case types.Decimal:
		hi := int64(binary.BigEndian.Uint64(b) ^ 1<<63)
		d := decimal128.New(hi, binary.BigEndian.Uint64(b[8:]))
		if !d.FitsInPrecision(int32(t.Precision)) {
			return nil, nil, fmt.Errorf("%w: decimal wider than %d digits", ErrBadKey, t.Precision)
		}
		return d, b[16:], nil
	case types.Bool:
		if b[0] > 1 {
			return nil, nil, fmt.Errorf("%w: bool byte %#x", ErrBadKey, b[0])
		}
		return b[0] == 1, b[1:], nil
	case types.String, types.Bytes:
		var out []byte
		for i := 0; ; i++ {
			if i >= len(b) {
				return nil, nil, short
			}
			if b[i] != 0 {
				out = append(out, b[i])
				continue
			}
			if i+1 >= len(b) {
				return nil, nil, short
			}
			switch b[i+1] {
			case escByte:
				out = append(out, 0)
				i++
			case termByte:
				if t.Kind == types.String {
					return string(out), b[i+2:], nil
				}
				if out == nil {
					out = []byte{}
				}
				return out, b[i+2:], nil
			default:
				return nil, nil, fmt.Errorf("%w: byte %#x after 0x00 in a string", ErrBadKey, b[i+1])
			}
		}
	}
	return nil, nil, fmt.Errorf("%w: kind %s", ErrBadKey, t.Kind)
}
