package sqlstore

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"

	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/types"
)

// ValueError is a value that does not fit its column.
type ValueError struct {
	Table, Column string
	Msg           string
	// TooLong and OutOfRange pick MySQL's error code.
	TooLong, OutOfRange bool
}

func (e *ValueError) Error() string {
	return fmt.Sprintf("table %s, column %s: %s", e.Table, e.Column, e.Msg)
}

// ToStored converts a SQL value to the Go value column c of table t stores
// (package types' representation; nil for NULL). NOT NULL is the caller's
// check.
func ToStored(t *Table, c *Column, v sqltypes.Value) (any, error) {
	if v.IsNull() {
		return nil, nil
	}
	bad := func(format string, args ...any) error {
		return &ValueError{Table: t.Name, Column: c.Name, Msg: fmt.Sprintf(format, args...)}
	}
	switch k := c.Type.Kind; k {
	case types.Int8, types.Int16, types.Int32, types.Int64:
		var i int64
		var err error
		switch {
		case v.IsSigned():
			i, err = v.ToInt64()
		case v.IsUnsigned():
			var u uint64
			u, err = v.ToUint64()
			if u > math.MaxInt64 {
				return nil, &ValueError{Table: t.Name, Column: c.Name, Msg: fmt.Sprintf("%d is out of range for %s", u, c.SQLType), OutOfRange: true}
			}
			i = int64(u)
		default:
			var f float64
			f, err = strconv.ParseFloat(strings.TrimSpace(v.ToString()), 64)
			if err == nil && (f >= math.MaxInt64 || f < math.MinInt64) {
				return nil, &ValueError{Table: t.Name, Column: c.Name, Msg: fmt.Sprintf("%s is out of range for %s", v.ToString(), c.SQLType), OutOfRange: true}
			}
			i = int64(math.Round(f))
		}
		if err != nil {
			return nil, bad("%q is not an integer", v.ToString())
		}
		if bits := k.IntBits(); bits < 64 && (i < -(1<<(bits-1)) || i >= 1<<(bits-1)) {
			return nil, &ValueError{Table: t.Name, Column: c.Name, Msg: fmt.Sprintf("%d is out of range for %s", i, c.SQLType), OutOfRange: true}
		}
		return i, nil
	case types.Float32, types.Float64:
		f, err := strconv.ParseFloat(strings.TrimSpace(v.ToString()), 64)
		if err != nil {
			return nil, bad("%q is not a number", v.ToString())
		}
		return f, nil
	case types.Decimal:
		s := strings.TrimSpace(v.ToString())
		n, err := decimal128.FromString(s, int32(c.Type.Precision), int32(c.Type.Scale))
		if err != nil {
			return nil, &ValueError{Table: t.Name, Column: c.Name, Msg: fmt.Sprintf("%q does not fit %s", s, c.SQLType), OutOfRange: true}
		}
		return n, nil
	case types.String:
		s := v.ToString()
		if c.MaxLen > 0 && utf8.RuneCountInString(s) > c.MaxLen {
			return nil, &ValueError{Table: t.Name, Column: c.Name, Msg: fmt.Sprintf("a value of %d characters is longer than %s allows", utf8.RuneCountInString(s), c.SQLType), TooLong: true}
		}
		return s, nil
	case types.Bytes:
		b := []byte(v.ToString())
		if c.MaxLen > 0 && len(b) > c.MaxLen {
			return nil, &ValueError{Table: t.Name, Column: c.Name, Msg: fmt.Sprintf("a value of %d bytes is longer than %s allows", len(b), c.SQLType), TooLong: true}
		}
		return b, nil
	case types.Bool:
		i, err := v.ToInt64()
		if err != nil {
			return nil, bad("%q is not a boolean", v.ToString())
		}
		return i != 0, nil
	case types.Date:
		tm, err := parseTime(v.ToString())
		if err != nil {
			return nil, bad("%q is not a date (YYYY-MM-DD)", v.ToString())
		}
		return types.DateDays(tm.Unix() / 86400), nil
	case types.Timestamp, types.TimestampTZ:
		tm, err := parseTime(v.ToString())
		if err != nil {
			return nil, bad("%q is not a datetime (YYYY-MM-DD hh:mm:ss[.ffffff])", v.ToString())
		}
		return types.TimestampMicros(tm.UnixMicro()), nil
	}
	return nil, bad("type %s is not supported", c.Type)
}

var timeLayouts = []string{"2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999", "2006-01-02", "20060102150405", "20060102"}

func parseTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	var err error
	for _, l := range timeLayouts {
		var tm time.Time
		if tm, err = time.ParseInLocation(l, s, time.UTC); err == nil {
			return tm, nil
		}
	}
	return time.Time{}, err
}

// FromStored converts a stored Go value of column c back to a SQL value.
func FromStored(c *Column, x any) sqltypes.Value {
	if x == nil {
		return sqltypes.NULL
	}
	typ := QueryType(c)
	switch v := x.(type) {
	case int64:
		return sqltypes.MakeTrusted(typ, strconv.AppendInt(nil, v, 10))
	case float64:
		bits := 64
		if c.Type.Kind == types.Float32 {
			bits = 32
		}
		return sqltypes.MakeTrusted(typ, strconv.AppendFloat(nil, v, 'g', -1, bits))
	case decimal128.Num:
		return sqltypes.MakeTrusted(typ, []byte(v.ToString(int32(c.Type.Scale))))
	case string:
		return sqltypes.MakeTrusted(typ, []byte(v))
	case []byte:
		return sqltypes.MakeTrusted(typ, v)
	case bool:
		if v {
			return sqltypes.MakeTrusted(typ, []byte("1"))
		}
		return sqltypes.MakeTrusted(typ, []byte("0"))
	case types.DateDays:
		return sqltypes.MakeTrusted(typ, []byte(time.Unix(int64(v)*86400, 0).UTC().Format("2006-01-02")))
	case types.TimestampMicros:
		tm := time.UnixMicro(int64(v)).UTC()
		if tm.Nanosecond() == 0 {
			return sqltypes.MakeTrusted(typ, []byte(tm.Format("2006-01-02 15:04:05")))
		}
		return sqltypes.MakeTrusted(typ, []byte(tm.Format("2006-01-02 15:04:05.000000")))
	}
	return sqltypes.NULL
}

// QueryType is the wire type of column c.
func QueryType(c *Column) querypb.Type {
	switch c.Type.Kind {
	case types.Int8, types.Bool:
		return querypb.Type_INT8
	case types.Int16:
		return querypb.Type_INT16
	case types.Int32:
		return querypb.Type_INT32
	case types.Int64:
		return querypb.Type_INT64
	case types.Float32:
		return querypb.Type_FLOAT32
	case types.Float64:
		return querypb.Type_FLOAT64
	case types.Decimal:
		return querypb.Type_DECIMAL
	case types.String:
		return querypb.Type_VARCHAR
	case types.Bytes:
		return querypb.Type_VARBINARY
	case types.Date:
		return querypb.Type_DATE
	case types.Timestamp, types.TimestampTZ:
		return querypb.Type_DATETIME
	}
	return querypb.Type_VARCHAR
}

// Key prefixes.

func tablePrefix(dst []byte, tableID uint32) []byte {
	return binary.BigEndian.AppendUint32(dst, tableID)
}

// KeyPrefix is the start of every key of table t's index ixID (0: the
// primary key) whose leading columns equal vals.
func KeyPrefix(t *Table, ixID uint32, vals []any) ([]byte, error) {
	cols := t.pkTypes()
	if ixID != 0 {
		ix, err := t.indexByID(ixID)
		if err != nil {
			return nil, err
		}
		cols = t.colTypes(ix.Columns)
	}
	if len(vals) > len(cols) {
		return nil, fmt.Errorf("table %s: %d key values for %d key columns", t.Name, len(vals), len(cols))
	}
	k, err := index.AppendKey(tablePrefix(nil, t.ID), ixID, cols[:len(vals)], vals)
	if err != nil {
		return nil, fmt.Errorf("table %s: %w", t.Name, err)
	}
	return k, nil
}

// KeyEnd is the smallest key above every key that starts with prefix.
func KeyEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xFF {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

func (t *Table) indexByID(id uint32) (*Index, error) {
	for i := range t.Indexes {
		if t.Indexes[i].ID == id {
			return &t.Indexes[i], nil
		}
	}
	return nil, fmt.Errorf("table %s has no index %d", t.Name, id)
}

// pkValues extracts the primary-key values of a row (stored values).
func (t *Table) pkValues(row []any, hidden int64) []any {
	if t.HiddenPK() {
		return []any{hidden}
	}
	out := make([]any, len(t.PK))
	for i, c := range t.PK {
		out[i] = row[c]
	}
	return out
}

func (t *Table) rowKey(pk []any) ([]byte, error) {
	return index.AppendKey(tablePrefix(nil, t.ID), 0, t.pkTypes(), pk)
}

func (t *Table) encodeRow(row []any) ([]byte, error) {
	return index.AppendKey(nil, 0, t.allTypes(), row)
}

func (t *Table) decodeRow(b []byte) ([]any, error) {
	_, vals, err := index.DecodeKey(b, t.allTypes())
	if err != nil {
		return nil, fmt.Errorf("table %s: corrupt row: %w", t.Name, err)
	}
	return vals, nil
}

// encodePK is the value of an index entry: the primary key.
func (t *Table) encodePK(pk []any) ([]byte, error) {
	return index.AppendKey(nil, 0, t.pkTypes(), pk)
}

func (t *Table) decodePK(b []byte) ([]any, error) {
	_, vals, err := index.DecodeKey(b, t.pkTypes())
	if err != nil {
		return nil, fmt.Errorf("table %s: corrupt index entry: %w", t.Name, err)
	}
	return vals, nil
}

// indexKey is the key of row's entry in ix, and whether it is the unique
// form (no primary key appended).
func (t *Table) indexKey(ix *Index, row, pk []any) ([]byte, bool, error) {
	vals := make([]any, len(ix.Columns))
	unique := ix.Unique
	for i, c := range ix.Columns {
		vals[i] = row[c]
		if vals[i] == nil {
			unique = false // NULLs never collide
		}
	}
	k, err := index.AppendKey(tablePrefix(nil, t.ID), ix.ID, t.colTypes(ix.Columns), vals)
	if err != nil {
		return nil, false, fmt.Errorf("table %s, index %s: %w", t.Name, ix.Name, err)
	}
	if unique {
		return k, true, nil
	}
	// The primary key's columns without their 4-byte id.
	pkEnc, err := t.encodePK(pk)
	if err != nil {
		return nil, false, err
	}
	return append(k, pkEnc[4:]...), false, nil
}
