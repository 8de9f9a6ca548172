package scan

import (
	"math/rand/v2"
	"testing"
)

func TestBitsAtMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	bm := make([]uint64, 10)
	for i := range bm {
		bm[i] = rng.Uint64()
	}
	bit := func(i int) uint64 {
		if i/64 >= len(bm) {
			return 0
		}
		return bm[i/64] >> (i % 64) & 1
	}
	for off := range 200 {
		for _, n := range []int{0, 1, 63, 64, 65, 130, 640 - off} {
			if n < 0 {
				continue
			}
			got := bitsAt(bm, off, n)
			for i := range n {
				if got[i/64]>>(i%64)&1 != bit(off+i) {
					t.Fatalf("off %d n %d: bit %d wrong", off, n, i)
				}
			}
		}
	}
	if bitsAt(nil, 5, 10) != nil {
		t.Fatal("no bitmap must stay no bitmap")
	}
}
