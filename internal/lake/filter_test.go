package lake

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
)

// TestFilterAgainstNaive compares the word-at-a-time filter with a per-row
// loop over random bitmaps, word boundaries and the all/none cases.
func TestFilterAgainstNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	schema := testSchema()
	for round := range 60 {
		n := []int{0, 1, 63, 64, 65, 127, 128, 129, 1000}[round%9] + rng.IntN(3)*int(round/30)
		rec := randomRecord(rng, schema, n, func(i int) int64 { return int64(1 + rng.IntN(100)) })
		deleted := make([]uint64, (n+63)/64)
		mode := round % 4
		for i := range n {
			switch {
			case mode == 0: // nothing deleted
			case mode == 1: // everything deleted
				deleted[i/64] |= 1 << (i % 64)
			case rng.IntN(3) == 0:
				deleted[i/64] |= 1 << (i % 64)
			}
		}
		snapshot := uint64(rng.IntN(120))
		filterTS := round%3 != 0
		ts := rec.Column(int(rec.NumCols()) - 1).(*array.Int64).Int64Values()
		var tsArg []int64
		if filterTS {
			tsArg = ts
		}
		mask, visible := VisibleMask(nil, n, deleted, tsArg, snapshot)
		var wantRows []int
		for i := range n {
			if deleted[i/64]>>(i%64)&1 == 0 && (!filterTS || uint64(ts[i]) <= snapshot) {
				wantRows = append(wantRows, i)
			}
		}
		if visible != len(wantRows) {
			t.Fatalf("round %d: %d visible, naive %d", round, visible, len(wantRows))
		}
		out, err := FilterVisible(context.Background(), rec, mask, visible, nil)
		if err != nil {
			t.Fatal(err)
		}
		if out.NumRows() != int64(len(wantRows)) {
			t.Fatalf("round %d: %d rows out, want %d", round, out.NumRows(), len(wantRows))
		}
		for j, i := range wantRows {
			for c := range int(rec.NumCols()) {
				if !sameCell(out.Column(c), j, rec.Column(c), i) {
					t.Fatalf("round %d: row %d column %d differs", round, i, c)
				}
			}
		}
		out.Release()
		rec.Release()
	}
	// Trailing bits past n in the deleted words never leak in.
	mask, v := VisibleMask(nil, 3, []uint64{0}, nil, 0)
	if v != 3 || mask[0] != 0b111 {
		t.Fatalf("3 rows, none deleted: mask %b, %d visible", mask[0], v)
	}
}
