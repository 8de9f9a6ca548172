package index

import (
	"bytes"
	"cmp"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/decimal128"

	"github.com/retinadb/retina/internal/types"
)

var allTypes = []types.Type{
	types.Of(types.Int8), types.Of(types.Int16), types.Of(types.Int32), types.Of(types.Int64),
	types.Of(types.Float32), types.Of(types.Float64), types.DecimalOf(38, 4), types.DecimalOf(5, 2),
	types.Of(types.String), types.Of(types.Bytes), types.Of(types.Bool), types.Of(types.Date),
	types.Of(types.Timestamp), types.Of(types.TimestampTZ),
}

// randomValue draws edge values often.
func randomValue(rng *rand.Rand, t types.Type) any {
	if rng.IntN(10) == 0 {
		return nil
	}
	pick := func(edges []int64, bits uint) int64 {
		if rng.IntN(3) == 0 {
			return edges[rng.IntN(len(edges))]
		}
		return rng.Int64() >> (64 - bits)
	}
	switch t.Kind {
	case types.Int8, types.Int16, types.Int32, types.Int64:
		b := t.Kind.IntBits()
		lo, hi := int64(-1)<<(b-1), int64(uint64(1)<<(b-1)-1)
		return pick([]int64{lo, hi, 0, -1, 1}, b)
	case types.Float32:
		edges := []float64{0, math.Copysign(0, -1), 1, -1, math.Inf(1), math.Inf(-1), math.NaN(), math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32}
		if rng.IntN(2) == 0 {
			return edges[rng.IntN(len(edges))]
		}
		return float64(float32(rng.NormFloat64() * 1e6))
	case types.Float64:
		edges := []float64{0, math.Copysign(0, -1), 1, -1, math.Inf(1), math.Inf(-1), math.NaN(), math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64}
		if rng.IntN(2) == 0 {
			return edges[rng.IntN(len(edges))]
		}
		return rng.NormFloat64() * 1e12
	case types.Decimal:
		limit := decimal128.GetMaxValue(int32(t.Precision))
		edges := []decimal128.Num{limit, limit.Negate(), decimal128.FromI64(0), decimal128.FromI64(-1), decimal128.FromI64(1)}
		if rng.IntN(3) == 0 {
			return edges[rng.IntN(len(edges))]
		}
		d := decimal128.New(rng.Int64()>>40, rng.Uint64())
		if !d.FitsInPrecision(int32(t.Precision)) {
			d = decimal128.FromI64(rng.Int64N(99999) - 50000)
		}
		return d
	case types.String, types.Bytes:
		n := rng.IntN(6)
		b := make([]byte, n)
		for i := range b {
			b[i] = []byte{0, 1, 0xFF, 'a', 'b'}[rng.IntN(5)]
		}
		if t.Kind == types.String {
			return string(b)
		}
		return b
	case types.Bool:
		return rng.IntN(2) == 0
	case types.Date:
		return types.DateDays(pick([]int64{math.MinInt32, math.MaxInt32, 0, -1}, 32))
	case types.Timestamp, types.TimestampTZ:
		return types.TimestampMicros(pick([]int64{math.MinInt64, math.MaxInt64, 0, -1}, 64))
	}
	panic("unreachable")
}

// compareValues is the order keys must follow: NULL first, -0 = +0, NaN last.
func compareValues(t types.Type, a, b any) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	switch t.Kind {
	case types.Float32, types.Float64:
		x, y := a.(float64), b.(float64)
		if t.Kind == types.Float32 {
			x, y = float64(float32(x)), float64(float32(y))
		}
		switch {
		case math.IsNaN(x) && math.IsNaN(y):
			return 0
		case math.IsNaN(x):
			return 1
		case math.IsNaN(y):
			return -1
		}
		return cmp.Compare(x, y)
	case types.Decimal:
		return a.(decimal128.Num).Cmp(b.(decimal128.Num))
	case types.String:
		return cmp.Compare(a.(string), b.(string))
	case types.Bytes:
		return bytes.Compare(a.([]byte), b.([]byte))
	case types.Bool:
		x, y := a.(bool), b.(bool)
		switch {
		case x == y:
			return 0
		case !x:
			return -1
		}
		return 1
	case types.Date:
		return cmp.Compare(a.(types.DateDays), b.(types.DateDays))
	case types.Timestamp, types.TimestampTZ:
		return cmp.Compare(a.(types.TimestampMicros), b.(types.TimestampMicros))
	}
	return cmp.Compare(a.(int64), b.(int64))
}

func compareKeys(cols []types.Type, a, b []any) int {
	for i, t := range cols {
		if c := compareValues(t, a[i], b[i]); c != 0 {
			return c
		}
	}
	return 0
}

// canonical is what decoding returns for v: -0 as +0, float32 rounding.
func canonical(t types.Type, v any) any {
	f, ok := v.(float64)
	if !ok {
		return v
	}
	if t.Kind == types.Float32 {
		f = float64(float32(f))
	}
	if f == 0 {
		return 0.0
	}
	return f
}

func sameValue(t types.Type, a, b any) bool {
	if fa, ok := a.(float64); ok && math.IsNaN(fa) {
		fb, ok := b.(float64)
		return ok && math.IsNaN(fb)
	}
	return reflect.DeepEqual(canonical(t, a), canonical(t, b))
}

// TestKeyOrderAndRoundTrip: for random composite keys, byte order equals
// value order, equal bytes mean equal values, and decoding inverts encoding.
func TestKeyOrderAndRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 300 {
		n := 1 + rng.IntN(3)
		cols := make([]types.Type, n)
		for i := range cols {
			cols[i] = allTypes[rng.IntN(len(allTypes))]
		}
		keys := make([][]any, 40)
		encs := make([][]byte, len(keys))
		for i := range keys {
			keys[i] = make([]any, n)
			for j := range keys[i] {
				keys[i][j] = randomValue(rng, cols[j])
			}
			var err error
			if encs[i], err = AppendKey(nil, 7, cols, keys[i]); err != nil {
				t.Fatalf("round %d: encode %v: %v", round, keys[i], err)
			}
			id, back, err := DecodeKey(encs[i], cols)
			if err != nil || id != 7 {
				t.Fatalf("round %d: decode %x: id %d, %v", round, encs[i], id, err)
			}
			for j := range back {
				if !sameValue(cols[j], back[j], keys[i][j]) {
					t.Fatalf("round %d: column %d (%s): %v decoded as %v", round, j, cols[j], keys[i][j], back[j])
				}
			}
		}
		for i := range keys {
			for j := range keys {
				want := compareKeys(cols, keys[i], keys[j])
				if got := bytes.Compare(encs[i], encs[j]); got != want {
					t.Fatalf("round %d, cols %v: %v vs %v: bytes compare %d, values %d", round, cols, keys[i], keys[j], got, want)
				}
			}
		}
	}
}

// TestKeysArePrefixFree: no key of a column list is a prefix of another, so a
// row-id or timestamp suffix never makes two keys collide.
func TestKeysArePrefixFree(t *testing.T) {
	cols := []types.Type{types.Of(types.String), types.Of(types.Bytes)}
	vals := [][]any{{"a", []byte{}}, {"a", []byte{0}}, {"a\x00", []byte{}}, {"", []byte("a")}, {"a", nil}, {nil, nil}}
	for i, a := range vals {
		ea, _ := AppendKey(nil, 1, cols, a)
		for j, b := range vals {
			eb, _ := AppendKey(nil, 1, cols, b)
			if i != j && bytes.HasPrefix(eb, ea) {
				t.Fatalf("%q is a prefix of %q", ea, eb)
			}
		}
	}
}

func TestKeyMismatch(t *testing.T) {
	cases := []struct {
		col types.Type
		v   any
	}{
		{types.Of(types.Int64), "1"},
		{types.Of(types.Int8), int64(200)},
		{types.Of(types.Int16), int64(-40000)},
		{types.Of(types.String), []byte("x")},
		{types.DecimalOf(3, 0), decimal128.FromI64(1000)},
		{types.Of(types.Date), int64(3)},
		{types.Of(types.Timestamp), types.DateDays(1)},
	}
	for _, c := range cases {
		if _, err := AppendKey(nil, 1, []types.Type{c.col}, []any{c.v}); !errors.Is(err, ErrKeyMismatch) {
			t.Errorf("%s ← %T %v: got %v", c.col, c.v, c.v, err)
		}
	}
	if _, err := AppendKey(nil, 1, []types.Type{types.Of(types.Int64)}, nil); !errors.Is(err, ErrKeyMismatch) {
		t.Errorf("wrong value count: %v", err)
	}
}

func FuzzDecodeKey(f *testing.F) {
	cols := []types.Type{types.Of(types.Int32), types.Of(types.String), types.DecimalOf(10, 2), types.Of(types.Float64)}
	seed, _ := AppendKey(nil, 3, cols, []any{int64(5), "a\x00b", decimal128.FromI64(-12345), 1.5})
	f.Add(seed)
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		id, vals, err := DecodeKey(data, cols)
		if err != nil {
			if !errors.Is(err, ErrBadKey) {
				t.Fatalf("error not wrapping ErrBadKey: %v", err)
			}
			return
		}
		again, err := AppendKey(nil, id, cols, vals)
		if err != nil {
			t.Fatalf("decoded values do not re-encode: %v", err)
		}
		// Canonical NaN/−0 aside, decoding is the inverse of encoding.
		_, vals2, err := DecodeKey(again, cols)
		if err != nil || !bytes.Equal(mustEncode(t, id, cols, vals2), again) {
			t.Fatalf("re-encoding is not stable: %x → %x", data, again)
		}
	})
}

func mustEncode(t *testing.T, id uint32, cols []types.Type, vals []any) []byte {
	b, err := AppendKey(nil, id, cols, vals)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every key Pebble makes from ours (index-block separators, successors, a
// prefix's immediate successor, a bare prefix) orders as "prefix by split,
// then version", as Pebble requires of a comparer with a Split (its
// invariant builds check it: the default separators broke it, and so did a
// split that cut eight bytes off a bare prefix).
func TestComparerKeysSplitConsistently(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	cols := []types.Type{types.Of(types.Int64), types.Of(types.String)}
	var keys [][]byte
	for range 400 {
		entry, err := AppendKey(nil, uint32(1+rng.IntN(2)), cols, []any{rng.Int64N(50), randomValue(rng, cols[1])})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, spiKey(nil, entry, 1+rng.Uint64N(1<<40)))
	}
	splitCompare := func(a, b []byte) int {
		na, nb := split(a), split(b)
		if c := bytes.Compare(a[:na], b[:nb]); c != 0 {
			return c
		}
		return bytes.Compare(a[na:], b[nb:])
	}
	check := func(what string, a, b []byte) {
		if got, want := comparer.Compare(a, b), splitCompare(a, b); got != want {
			t.Fatalf("%s: Compare(%x, %x) = %d, by split %d", what, a, b, got, want)
		}
	}
	for i := 1; i < len(keys); i++ {
		a, b := keys[i-1], keys[i]
		if comparer.Compare(a, b) > 0 {
			a, b = b, a
		}
		sep := comparer.Separator(nil, a, b)
		succ := comparer.Successor(nil, a)
		next := comparer.ImmediateSuccessor(nil, a[:split(a)])
		prefix := a[:split(a)]
		if split(prefix) != len(prefix) {
			t.Fatalf("split cuts the bare prefix %x to %d bytes", prefix, split(prefix))
		}
		for _, k := range keys {
			check("separator", sep, k)
			check("successor", succ, k)
			check("immediate successor", next, k)
			check("bare prefix", prefix, k) // Pebble compares prefixes of seeks
			check("bare prefix", prefix, k[:split(k)])
		}
		if comparer.Compare(next, a) <= 0 {
			t.Fatalf("the immediate successor %x of %x's prefix is not after it", next, a)
		}
	}
}
