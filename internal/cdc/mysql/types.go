package mysql

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/japanese"
	"golang.org/x/text/encoding/korean"
	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/encoding/traditionalchinese"
	"golang.org/x/text/encoding/unicode"
	"golang.org/x/text/encoding/unicode/utf32"

	"github.com/retinadb/retina/internal/types"
)

// Type mapping (README "MySQL and MariaDB types"). Every value keeps its
// exact MySQL value:
//
//	TINYINT, SMALLINT, MEDIUMINT, INT, BIGINT  int8, int16, int32, int32, int64
//	  … UNSIGNED                               int16, int32, int32, int64, decimal(20,0)
//	DECIMAL(p,s), p ≤ 38                        decimal(p,s)
//	DECIMAL(p,s), p > 38                        string (exact digits)
//	FLOAT, DOUBLE                               float32, float64
//	DATE                                        date
//	DATETIME(n)                                 timestamp (µs)
//	TIMESTAMP(n)                                timestamptz (µs, UTC: the instant,
//	                                            whatever the server's time zone)
//	TIME(n)                                     string "[-]HH:MM:SS[.fraction]" (hours up to 838)
//	YEAR                                        int16
//	CHAR, VARCHAR, TEXT (any character set)     string (UTF-8, converted from the column's charset)
//	BINARY(n), VARBINARY, BLOB                  bytes (BINARY padded with zero bytes to n)
//	JSON                                        string (JSON text)
//	ENUM                                        string (the value's name)
//	SET                                         string (names joined with commas, in definition order)
//	BIT(1)                                      bool
//	BIT(2…63), BIT(64)                          int64, decimal(20,0)
//	GEOMETRY and spatial types                  bytes (MySQL's internal form: SRID + WKB)
//
// Zero dates ('0000-00-00', or with a zero month or day) have no Retina
// value: they stop the source with the table, column and position named.
// So do text values that are not valid in their character set.

// kind is a MySQL column type family.
type kind uint8

const (
	kInt kind = iota + 1
	kDecimal
	kFloat
	kDouble
	kDate
	kDatetime
	kTimestamp
	kTime
	kYear
	kText
	kBinary
	kJSON
	kEnum
	kSet
	kBit
	kGeometry
)

// column is one source column and how its values become Retina values.
type column struct {
	Name     string
	Kind     kind
	Bits     int // integers: 8, 16, 24, 32, 64; BIT: its width
	Unsigned bool
	// Precision and Scale of DECIMAL; Scale is the fractional digits of
	// DATETIME, TIMESTAMP and TIME.
	Precision, Scale int
	Charset          string   // text, ENUM and SET: the character set
	Pad              int      // BINARY(n): n
	Values           []string // ENUM and SET: the names, in order
	Nullable         bool
	SQLType          string // for messages
	Type             types.Type
	decode           func([]byte) (string, error)
	utf8             bool // text in a UTF-8 character set: valid UTF-8 is the value
}

// mapType picks the Retina type of a column.
func (c *column) mapType() types.Type {
	switch c.Kind {
	case kInt:
		switch {
		case c.Bits == 8 && !c.Unsigned:
			return types.Of(types.Int8)
		case c.Bits == 8 || c.Bits == 16 && !c.Unsigned:
			return types.Of(types.Int16)
		case c.Bits <= 24 || c.Bits == 32 && !c.Unsigned:
			return types.Of(types.Int32)
		case c.Bits == 32 || !c.Unsigned:
			return types.Of(types.Int64)
		}
		return types.DecimalOf(20, 0)
	case kDecimal:
		if c.Precision >= 1 && c.Precision <= types.MaxDecimalPrecision && c.Scale <= c.Precision {
			return types.DecimalOf(uint8(c.Precision), uint8(c.Scale))
		}
		return types.Of(types.String)
	case kFloat:
		return types.Of(types.Float32)
	case kDouble:
		return types.Of(types.Float64)
	case kDate:
		return types.Of(types.Date)
	case kDatetime:
		return types.Of(types.Timestamp)
	case kTimestamp:
		return types.Of(types.TimestampTZ)
	case kYear:
		return types.Of(types.Int16)
	case kBinary, kGeometry:
		return types.Of(types.Bytes)
	case kBit:
		switch {
		case c.Bits == 1:
			return types.Of(types.Bool)
		case c.Bits < 64:
			return types.Of(types.Int64)
		}
		return types.DecimalOf(20, 0)
	}
	return types.Of(types.String) // TIME, text, JSON, ENUM, SET
}

// prepare sets the column's Retina type and text decoder.
func (c *column) prepare() error {
	c.Type = c.mapType()
	if c.Kind == kText || c.Kind == kEnum || c.Kind == kSet || c.Kind == kJSON {
		d, err := decoder(c.Charset)
		if err != nil {
			return fmt.Errorf("column %s (%s): %w", c.Name, c.SQLType, err)
		}
		c.decode = d
		c.utf8 = c.Charset == "utf8mb4" || c.Charset == "utf8mb3" || c.Charset == "utf8"
	}
	return nil
}

// errZeroDate: MySQL's zero dates have no Retina value.
var errZeroDate = errors.New("a zero date (or a date with a zero month or day) has no Retina value: set sql_mode NO_ZERO_DATE,NO_ZERO_IN_DATE and update such rows to NULL or a real date")

// value turns one column's value, as the binlog decoder or the client
// (the copy's binary protocol) gives it, into its Retina value. The caller names the
// table and the position; the error names the column.
func (c *column) value(v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	// The common cases first, without the error wrapping.
	switch c.Kind {
	case kInt:
		if n, ok := v.(int64); ok && (!c.Unsigned || n >= 0) && c.Bits < 64 {
			return n, nil
		}
	case kText:
		if b, ok := v.([]byte); ok && c.utf8 {
			if utf8.Valid(b) {
				return string(b), nil
			}
		}
	}
	out, err := c.convert(v)
	if err != nil {
		return nil, fmt.Errorf("column %s (%s): value %.60s: %w", c.Name, c.SQLType, show(v), err)
	}
	return out, nil
}

// field is value for a value the client read (the copy's binary protocol),
// converted without boxing the raw value first in the common cases (the
// copy's hot path).
func (c *column) field(fv *gomysql.FieldValue) (any, error) {
	switch fv.Type {
	case gomysql.FieldValueTypeNull:
		return nil, nil
	case gomysql.FieldValueTypeSigned:
		if c.Kind == kInt && !c.Unsigned {
			return fv.AsInt64(), nil
		}
		return c.value(fv.AsInt64())
	case gomysql.FieldValueTypeUnsigned:
		return c.value(fv.AsUint64())
	case gomysql.FieldValueTypeFloat:
		if c.Kind == kDouble {
			return fv.AsFloat64(), nil
		}
		return c.value(fv.AsFloat64())
	}
	b := fv.AsString()
	switch {
	case c.Kind == kText && c.utf8:
		if utf8.Valid(b) {
			return string(b), nil
		}
	case c.Kind == kDecimal && c.Type.Kind == types.Decimal:
		if d, ok := decimalDigits(b, c.Precision, c.Scale); ok {
			return d, nil
		}
	case c.Kind == kDatetime || c.Kind == kTimestamp:
		if us, ok := datetimeDigits(b); ok {
			return types.TimestampMicros(us), nil
		}
	}
	return c.value(b)
}

// text returns the bytes of a valid UTF-8 text value as they are stored:
// ok is false for every other value, which field converts.
func (c *column) text(fv *gomysql.FieldValue) ([]byte, bool) {
	if fv.Type != gomysql.FieldValueTypeString || c.Kind != kText || !c.utf8 {
		return nil, false
	}
	b := fv.AsString()
	return b, utf8.Valid(b)
}

// decimalDigits is parseDecimal's fast path, over the client's bytes or
// the binlog's string: ok is false for what it does not handle (the caller
// falls back).
func decimalDigits[T string | []byte](b T, precision, scale int) (decimal128.Num, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	var n uint64
	digits, fracDigits, seenDot := 0, 0, false
	for i := 0; i < len(b); i++ {
		ch := b[i]
		switch {
		case ch == '.' && !seenDot:
			seenDot = true
		case ch >= '0' && ch <= '9':
			n = n*10 + uint64(ch-'0')
			digits++
			if seenDot {
				fracDigits++
			}
		default:
			return decimal128.Num{}, false
		}
	}
	if digits == 0 || digits > 18 || fracDigits > scale || digits-fracDigits+scale > 18 {
		return decimal128.Num{}, false
	}
	for range scale - fracDigits {
		n *= 10
	}
	v := decimal128.FromU64(n)
	if neg {
		v = v.Negate()
	}
	return v, v.FitsInPrecision(int32(precision))
}

// datetimeDigits reads "YYYY-MM-DD HH:MM:SS[.ffffff]" as microseconds
// since the epoch (UTC); ok is false for anything else, zero dates
// included (the caller falls back, and names the error).
func datetimeDigits[T string | []byte](b T) (int64, bool) {
	if len(b) < 19 || b[4] != '-' || b[7] != '-' || b[10] != ' ' || b[13] != ':' || b[16] != ':' {
		return 0, false
	}
	num := func(s T) (int, bool) {
		n := 0
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return 0, false
			}
			n = n*10 + int(s[i]-'0')
		}
		return n, true
	}
	y, ok1 := num(b[0:4])
	mo, ok2 := num(b[5:7])
	d, ok3 := num(b[8:10])
	h, ok4 := num(b[11:13])
	mi, ok5 := num(b[14:16])
	sec, ok6 := num(b[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 59 {
		return 0, false
	}
	us := 0
	if len(b) > 19 {
		if b[19] != '.' || len(b) > 26 || len(b) == 20 {
			return 0, false
		}
		f, ok := num(b[20:])
		if !ok {
			return 0, false
		}
		for i := len(b) - 20; i < 6; i++ {
			f *= 10
		}
		us = f
	}
	t := time.Date(y, time.Month(mo), d, h, mi, sec, 0, time.UTC)
	if t.Day() != d { // 31 February and the like
		return 0, false
	}
	return t.Unix()*1e6 + int64(us), true
}

// convert is value for every type.
func (c *column) convert(v any) (any, error) {
	switch c.Kind {
	case kInt:
		n, u, err := integer(v, c.Bits, c.Unsigned)
		if err != nil {
			return nil, err
		}
		if c.Unsigned {
			if c.Bits == 64 {
				return decimal128.FromU64(u), nil
			}
			return int64(u), nil
		}
		return n, nil
	case kYear:
		n, _, err := integer(v, 16, false)
		return n, err
	case kDecimal:
		s := text(v)
		if c.Type.Kind == types.String {
			return s, nil
		}
		return parseDecimal(s, c.Precision, c.Scale)
	case kFloat, kDouble:
		var f float64
		switch x := v.(type) {
		case float32:
			f = float64(x)
		case float64:
			f = x
		default:
			p, err := strconv.ParseFloat(text(v), 64)
			if err != nil {
				return nil, err
			}
			f = p
		}
		if c.Kind == kFloat {
			f = float64(float32(f))
		}
		return f, nil
	case kDate:
		t, err := parseTime(text(v), "2006-01-02")
		if err != nil {
			return nil, err
		}
		return types.DateDays(t.Unix() / 86400), nil
	case kDatetime, kTimestamp:
		if s, ok := v.(string); ok { // the binlog's text: the common case
			if us, ok := datetimeDigits(s); ok {
				return types.TimestampMicros(us), nil
			}
		}
		t, err := parseTime(text(v), "2006-01-02 15:04:05.999999")
		if err != nil {
			return nil, err
		}
		return types.TimestampMicros(t.UnixMicro()), nil
	case kTime:
		return canonicalTime(text(v), c.Scale)
	case kText, kJSON:
		return c.decode(bytesOf(v))
	case kBinary:
		b := append([]byte(nil), bytesOf(v)...)
		if len(b) < c.Pad {
			b = append(b, make([]byte, c.Pad-len(b))...)
		}
		return b, nil
	case kGeometry:
		return append([]byte(nil), bytesOf(v)...), nil
	case kEnum:
		if n, ok := v.(int64); ok {
			if n == 0 {
				return "", nil // MySQL's error value of a non-strict insert
			}
			if n < 0 || int(n) > len(c.Values) {
				return nil, fmt.Errorf("enum index %d of %d values", n, len(c.Values))
			}
			return c.Values[n-1], nil
		}
		return c.decode(bytesOf(v))
	case kSet:
		if n, ok := v.(int64); ok {
			var names []string
			for i, name := range c.Values {
				if n&(1<<i) != 0 {
					names = append(names, name)
				}
			}
			return strings.Join(names, ","), nil
		}
		return c.decode(bytesOf(v))
	case kBit:
		var u uint64
		switch x := v.(type) {
		case int64:
			u = uint64(x)
		default:
			for _, b := range bytesOf(v) {
				u = u<<8 | uint64(b)
			}
		}
		switch {
		case c.Bits == 1:
			return u != 0, nil
		case c.Bits < 64:
			return int64(u), nil
		}
		return decimal128.FromU64(u), nil
	}
	return nil, fmt.Errorf("no mapping for this type")
}

// parseDecimal reads MySQL's text of a DECIMAL(precision, scale) value
// exactly: digits that fit 18 places directly, longer ones through
// decimal128's general parser.
func parseDecimal(s string, precision, scale int) (decimal128.Num, error) {
	if d, ok := decimalDigits(s, precision, scale); ok {
		return d, nil
	}
	return decimal128.FromString(s, int32(precision), int32(scale))
}

// integer reads an integer of the given width: the binlog decoder gives
// MySQL's bits as a signed Go integer of the column's width, the client a
// parsed int64 or uint64.
func integer(v any, bits int, unsigned bool) (int64, uint64, error) {
	var n int64
	switch x := v.(type) {
	case int8:
		n = int64(x)
	case int16:
		n = int64(x)
	case int32:
		n = int64(x)
	case int64:
		n = x
	case int:
		n = int64(x)
	case uint64:
		if !unsigned && x > math.MaxInt64 {
			return 0, 0, fmt.Errorf("out of range")
		}
		return int64(x), x, nil
	default:
		s := text(v)
		if unsigned {
			u, err := strconv.ParseUint(s, 10, 64)
			return int64(u), u, err
		}
		p, err := strconv.ParseInt(s, 10, 64)
		return p, uint64(p), err
	}
	if !unsigned || n >= 0 {
		return n, uint64(n), nil
	}
	// A negative value of an unsigned column: the bits of its width.
	if bits >= 64 {
		return n, uint64(n), nil
	}
	u := uint64(n) & (1<<bits - 1)
	return int64(u), u, nil
}

func parseTime(s, layout string) (time.Time, error) {
	if strings.HasPrefix(s, "0000-00-00") || len(s) >= 10 && (s[5:7] == "00" || s[8:10] == "00") {
		return time.Time{}, errZeroDate
	}
	t, err := time.ParseInLocation(layout, s, time.UTC)
	if err != nil {
		return time.Time{}, fmt.Errorf("not a date or time: %w", err)
	}
	return t, nil
}

// canonicalTime writes TIME as [-]HH:MM:SS with the column's fractional
// digits, however the value came.
func canonicalTime(s string, digits int) (string, error) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	whole, frac, _ := strings.Cut(s, ".")
	parts := strings.Split(whole, ":")
	if len(parts) != 3 {
		return "", fmt.Errorf("not a TIME value")
	}
	var hms [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return "", fmt.Errorf("not a TIME value")
		}
		hms[i] = n
	}
	for len(frac) < digits {
		frac += "0"
	}
	frac = frac[:digits]
	out := fmt.Sprintf("%02d:%02d:%02d", hms[0], hms[1], hms[2])
	if digits > 0 {
		out += "." + frac
	}
	if neg && strings.Trim(out, "0:.") != "" {
		out = "-" + out
	}
	return out, nil
}

func text(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	}
	return fmt.Sprint(v)
}

func bytesOf(v any) []byte {
	switch x := v.(type) {
	case []byte:
		return x
	case string:
		return []byte(x)
	}
	return []byte(fmt.Sprint(v))
}

// show prints a value for an error message: text as it is when printable,
// bytes in hex.
func show(v any) string {
	if b, ok := v.([]byte); ok {
		if utf8.Valid(b) {
			return strconv.Quote(string(b))
		}
		return fmt.Sprintf("x'%x'", b)
	}
	if s, ok := v.(string); ok {
		if utf8.ValidString(s) {
			return strconv.Quote(s)
		}
		return fmt.Sprintf("x'%x'", s)
	}
	return fmt.Sprint(v)
}

// decoder returns the conversion of a character set's bytes to UTF-8. It
// refuses bytes that are not valid in the character set.
func decoder(charset string) (func([]byte) (string, error), error) {
	switch charset {
	case "utf8mb4", "utf8mb3", "utf8", "":
		return func(b []byte) (string, error) {
			if !utf8.Valid(b) {
				return "", fmt.Errorf("invalid UTF-8 (character set %s)", orUTF8(charset))
			}
			return string(b), nil
		}, nil
	case "ascii":
		return func(b []byte) (string, error) {
			for _, c := range b {
				if c >= 0x80 {
					return "", fmt.Errorf("byte 0x%02x is not ASCII (character set ascii)", c)
				}
			}
			return string(b), nil
		}, nil
	case "binary":
		return func(b []byte) (string, error) {
			if !utf8.Valid(b) {
				return "", fmt.Errorf("invalid UTF-8 in a binary string")
			}
			return string(b), nil
		}, nil
	case "latin1":
		// MySQL's latin1 is Windows-1252 with its five undefined bytes
		// mapped to the C1 controls of the same number.
		return func(b []byte) (string, error) {
			var sb strings.Builder
			sb.Grow(len(b))
			for _, c := range b {
				switch {
				case c < 0x80:
					sb.WriteByte(c)
				case c == 0x81 || c == 0x8d || c == 0x8f || c == 0x90 || c == 0x9d:
					sb.WriteRune(rune(c))
				default:
					sb.WriteRune(charmap.Windows1252.DecodeByte(c))
				}
			}
			return sb.String(), nil
		}, nil
	}
	enc, ok := encodings[charset]
	if !ok {
		return nil, fmt.Errorf("character set %s has no conversion to UTF-8 in Retina: convert the column (ALTER TABLE … CONVERT TO CHARACTER SET utf8mb4) or leave the table out (tables=…)", charset)
	}
	return func(b []byte) (string, error) {
		out, err := enc.NewDecoder().Bytes(b)
		if err != nil {
			return "", fmt.Errorf("not valid %s: %w", charset, err)
		}
		if strings.ContainsRune(string(out), utf8.RuneError) {
			return "", fmt.Errorf("bytes that are not valid %s", charset)
		}
		return string(out), nil
	}, nil
}

func orUTF8(cs string) string {
	if cs == "" {
		return "utf8mb4"
	}
	return cs
}

// encodings are the other character sets MySQL and MariaDB have that
// golang.org/x/text converts.
var encodings = map[string]encoding.Encoding{
	"latin2": charmap.ISO8859_2, "latin5": charmap.ISO8859_9, "latin7": charmap.ISO8859_13,
	"greek": charmap.ISO8859_7, "hebrew": charmap.ISO8859_8, "cp1250": charmap.Windows1250,
	"cp1251": charmap.Windows1251, "cp1256": charmap.Windows1256, "cp1257": charmap.Windows1257,
	"cp850": charmap.CodePage850, "cp852": charmap.CodePage852, "cp866": charmap.CodePage866,
	"koi8r": charmap.KOI8R, "koi8u": charmap.KOI8U, "macroman": charmap.Macintosh,
	"gbk": simplifiedchinese.GBK, "gb2312": simplifiedchinese.GBK, "gb18030": simplifiedchinese.GB18030,
	"big5": traditionalchinese.Big5, "sjis": japanese.ShiftJIS, "cp932": japanese.ShiftJIS,
	"ujis": japanese.EUCJP, "eucjpms": japanese.EUCJP, "euckr": korean.EUCKR,
	"ucs2": unicode.UTF16(unicode.BigEndian, unicode.IgnoreBOM), "utf16": unicode.UTF16(unicode.BigEndian, unicode.IgnoreBOM),
	"utf16le": unicode.UTF16(unicode.LittleEndian, unicode.IgnoreBOM), "utf32": utf32.UTF32(utf32.BigEndian, utf32.IgnoreBOM),
}
