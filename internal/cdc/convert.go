package cdc

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/valyala/fastjson"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/types"
)

// Kafka Connect and Debezium logical type names.
const (
	ltDate           = "io.debezium.time.Date"
	ltTime           = "io.debezium.time.Time"
	ltMicroTime      = "io.debezium.time.MicroTime"
	ltNanoTime       = "io.debezium.time.NanoTime"
	ltTimestamp      = "io.debezium.time.Timestamp"
	ltMicroTimestamp = "io.debezium.time.MicroTimestamp"
	ltNanoTimestamp  = "io.debezium.time.NanoTimestamp"
	ltZonedTimestamp = "io.debezium.time.ZonedTimestamp"
	ltIsoTimestamp   = "io.debezium.time.IsoTimestamp"
	ltVarDecimal     = "io.debezium.data.VariableScaleDecimal"
	ltJSON           = "io.debezium.data.Json"
	ltUUID           = "io.debezium.data.Uuid"
	ltEnum           = "io.debezium.data.Enum"
	ltEnumSet        = "io.debezium.data.EnumSet"
	ltXML            = "io.debezium.data.Xml"
	ltConnectDecimal = "org.apache.kafka.connect.data.Decimal"
	ltConnectDate    = "org.apache.kafka.connect.data.Date"
	ltConnectTime    = "org.apache.kafka.connect.data.Time"
	ltConnectTS      = "org.apache.kafka.connect.data.Timestamp"
)

// VariableScaleDecimalType is the column type given to variable-scale
// decimals when a table is created from a message schema.
var VariableScaleDecimalType = types.DecimalOf(38, 10)

func (d *Decoder) warnOnce(logical string) {
	if !d.warned[logical] {
		d.warned[logical] = true
		d.log.Warn("cdc: unknown logical type; using its primitive type", "logical", logical)
	}
}

// convert turns one JSON value into the Go value of a column.
func (d *Decoder) convert(v *fastjson.Value, c catalog.Column, f field) (any, error) {
	if v == nil || v.Type() == fastjson.TypeNull {
		return nil, nil
	}
	switch c.Type.Kind {
	case types.Int8, types.Int16, types.Int32, types.Int64:
		n, err := v.Int64()
		if err != nil {
			return nil, fmt.Errorf("want an integer: %v", err)
		}
		switch f.logical {
		case ltTime, ltConnectTime: // milliseconds of the day → µs
			n *= 1000
		case ltNanoTime:
			n /= 1000
		}
		if bits := c.Type.Kind.IntBits(); bits < 64 && (n < -(1<<(bits-1)) || n >= 1<<(bits-1)) {
			return nil, fmt.Errorf("%d out of range for %s", n, c.Type)
		}
		return n, nil
	case types.Float32, types.Float64:
		if v.Type() == fastjson.TypeString { // "NaN", "Infinity" in some converters
			return strconv.ParseFloat(string(v.GetStringBytes()), 64)
		}
		return v.Float64()
	case types.Decimal:
		return convertDecimal(v, c.Type, f, d.opts.Decimals)
	case types.String:
		switch v.Type() {
		case fastjson.TypeString:
			return string(v.GetStringBytes()), nil
		case fastjson.TypeObject, fastjson.TypeArray: // JSON columns sent as objects
			return string(v.MarshalTo(nil)), nil
		}
		return nil, fmt.Errorf("want a string, got %s", v.Type())
	case types.Bytes:
		s, err := v.StringBytes()
		if err != nil {
			return nil, fmt.Errorf("want base64 bytes: %v", err)
		}
		b, err := base64.StdEncoding.DecodeString(string(s))
		if err != nil {
			return nil, fmt.Errorf("bad base64: %v", err)
		}
		return b, nil
	case types.Bool:
		return v.Bool()
	case types.Date:
		if v.Type() == fastjson.TypeString {
			t, err := time.Parse(time.DateOnly, string(v.GetStringBytes()))
			if err != nil {
				return nil, fmt.Errorf("bad date: %v", err)
			}
			return types.DateDays(t.Unix() / 86400), nil
		}
		n, err := v.Int64()
		if err != nil {
			return nil, fmt.Errorf("want days since 1970: %v", err)
		}
		return types.DateDays(n), nil
	case types.Timestamp, types.TimestampTZ:
		return convertTimestamp(v, f)
	}
	return nil, fmt.Errorf("unsupported column type %s", c.Type)
}

func convertTimestamp(v *fastjson.Value, f field) (any, error) {
	if v.Type() == fastjson.TypeString {
		s := string(v.GetStringBytes())
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			// ISO timestamps without a zone are local to the source: UTC.
			if t, err = time.Parse("2006-01-02T15:04:05.999999999", s); err != nil {
				return nil, fmt.Errorf("bad timestamp %q", s)
			}
		}
		return types.TimestampMicros(t.UnixMicro()), nil
	}
	n, err := v.Int64()
	if err != nil {
		return nil, fmt.Errorf("want a timestamp: %v", err)
	}
	switch f.logical {
	case ltTimestamp, ltConnectTS:
		if n > math.MaxInt64/1000 || n < math.MinInt64/1000 {
			return nil, fmt.Errorf("timestamp %d ms out of range", n)
		}
		n *= 1000
	case ltNanoTimestamp:
		n /= 1000
	}
	return types.TimestampMicros(n), nil
}

var errDecimal = errors.New("bad decimal")

// convertDecimal reads Debezium's decimal encodings: precise (base64 of the
// big-endian unscaled value, scale in the schema), VariableScaleDecimal
// ({"scale":s,"value":base64}), string ("12.34") and double (12.34); the
// result is rescaled to the column's scale. Which one a JSON string is
// comes from the field's schema, or from mode when the message has none.
func convertDecimal(v *fastjson.Value, t types.Type, f field, mode DecimalMode) (any, error) {
	var unscaled *big.Int
	scale := int32(t.Scale)
	switch v.Type() {
	case fastjson.TypeObject: // VariableScaleDecimal
		raw, err := base64.StdEncoding.DecodeString(string(v.GetStringBytes("value")))
		if err != nil {
			return nil, fmt.Errorf("%w: variable-scale value: %v", errDecimal, err)
		}
		unscaled, scale = twosComplement(raw), int32(v.GetInt("scale"))
	case fastjson.TypeString:
		s := string(v.GetStringBytes())
		asText := f.typ == "string" || f.typ == "" && mode == DecimalString
		switch {
		case f.typ == "" && mode == DecimalDouble:
			return nil, fmt.Errorf("%w: %q is a string, and decimal handling is double (a JSON number)", errDecimal, s)
		case asText:
			num, err := decimal128.FromString(s, int32(t.Precision), int32(t.Scale))
			if err != nil {
				return nil, fmt.Errorf("%w: %q: %v", errDecimal, s, err)
			}
			if !num.FitsInPrecision(int32(t.Precision)) {
				return nil, fmt.Errorf("%w: %q has more than %d digits", errDecimal, s, t.Precision)
			}
			return num, nil
		}
		var buf [32]byte
		n, err := base64.StdEncoding.Decode(buf[:], []byte(s))
		if err != nil || base64.StdEncoding.DecodedLen(len(s)) > len(buf) {
			hint := ""
			if f.typ == "" {
				hint = " (if the connector sends decimals as text, set decimal handling to string)"
			}
			return nil, fmt.Errorf("%w: %q is not the base64 of an unscaled value%s", errDecimal, s, hint)
		}
		raw := buf[:n]
		if ps, ok := f.params["scale"]; ok {
			n, err := strconv.Atoi(ps)
			if err != nil {
				return nil, fmt.Errorf("%w: scale parameter %q", errDecimal, ps)
			}
			scale = int32(n)
		}
		if len(raw) <= 8 && scale == int32(t.Scale) { // the common case, without big.Int
			var v int64
			if len(raw) > 0 && raw[0]&0x80 != 0 {
				v = -1
			}
			for _, b := range raw {
				v = v<<8 | int64(b)
			}
			num := decimal128.FromI64(v)
			if !num.FitsInPrecision(int32(t.Precision)) {
				return nil, fmt.Errorf("%w: more than %d digits", errDecimal, t.Precision)
			}
			return num, nil
		}
		unscaled = twosComplement(raw)
	case fastjson.TypeNumber:
		fv, _ := v.Float64()
		num, err := decimal128.FromFloat64(fv, int32(t.Precision), int32(t.Scale))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errDecimal, err)
		}
		return num, nil
	default:
		return nil, fmt.Errorf("%w: got %s", errDecimal, v.Type())
	}
	// Rescale unscaled × 10^-scale to the column's scale. Beyond 76 digits
	// of shift no value fits 38 digits (and a hostile scale must not make
	// the exponentiation run away).
	diff := int32(t.Scale) - scale
	if diff > 2*types.MaxDecimalPrecision || diff < -2*types.MaxDecimalPrecision {
		return nil, fmt.Errorf("%w: scale %d is out of range", errDecimal, scale)
	}
	ten := big.NewInt(10)
	switch {
	case diff > 0:
		unscaled.Mul(unscaled, new(big.Int).Exp(ten, big.NewInt(int64(diff)), nil))
	case diff < 0:
		q, r := new(big.Int).QuoRem(unscaled, new(big.Int).Exp(ten, big.NewInt(int64(-diff)), nil), new(big.Int))
		if r.Sign() != 0 {
			return nil, fmt.Errorf("%w: value has more than %d decimal places", errDecimal, t.Scale)
		}
		unscaled = q
	}
	if unscaled.BitLen() > 127 {
		return nil, fmt.Errorf("%w: too large", errDecimal)
	}
	num := decimal128.FromBigInt(unscaled)
	if !num.FitsInPrecision(int32(t.Precision)) {
		return nil, fmt.Errorf("%w: more than %d digits", errDecimal, t.Precision)
	}
	return num, nil
}

// twosComplement reads a big-endian two's-complement integer.
func twosComplement(b []byte) *big.Int {
	n := new(big.Int).SetBytes(b)
	if len(b) > 0 && b[0]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	return n
}

// columnType maps a Kafka Connect field to a column type.
func (d *Decoder) columnType(f field) (types.Type, error) {
	switch f.logical {
	case ltDate, ltConnectDate:
		return types.Of(types.Date), nil
	case ltTimestamp, ltMicroTimestamp, ltNanoTimestamp, ltConnectTS, ltIsoTimestamp:
		return types.Of(types.Timestamp), nil
	case ltZonedTimestamp:
		return types.Of(types.TimestampTZ), nil
	case ltTime, ltMicroTime, ltNanoTime, ltConnectTime:
		return types.Of(types.Int64), nil // microseconds of the day
	case ltVarDecimal:
		return VariableScaleDecimalType, nil
	case ltConnectDecimal:
		scale, _ := strconv.Atoi(f.params["scale"])
		prec := types.MaxDecimalPrecision
		if p, err := strconv.Atoi(f.params["connect.decimal.precision"]); err == nil && p > 0 {
			prec = min(p, types.MaxDecimalPrecision)
		}
		t := types.DecimalOf(uint8(prec), uint8(min(scale, prec)))
		return t, t.Validate()
	case ltJSON, ltUUID, ltEnum, ltEnumSet, ltXML:
		return types.Of(types.String), nil
	case "":
	default:
		d.warnOnce(f.logical)
	}
	switch f.typ {
	case "int8":
		return types.Of(types.Int8), nil
	case "int16":
		return types.Of(types.Int16), nil
	case "int32":
		return types.Of(types.Int32), nil
	case "int64":
		return types.Of(types.Int64), nil
	case "float32", "float":
		return types.Of(types.Float32), nil
	case "float64", "double":
		return types.Of(types.Float64), nil
	case "boolean":
		return types.Of(types.Bool), nil
	case "string":
		return types.Of(types.String), nil
	case "bytes":
		return types.Of(types.Bytes), nil
	}
	return types.Type{}, fmt.Errorf("field %s: unsupported Connect type %q", f.name, f.typ)
}
