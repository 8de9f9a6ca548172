package iceberg

import "math/bits"

// Bitmaps here are []uint64 with bit i of word j standing for position
// 64j+i, as the visibility package writes them.

// bitAt says bit i of bm is set (bits beyond bm are clear).
func bitAt(bm []uint64, i int64) bool {
	w := i / 64
	return w < int64(len(bm)) && bm[w]&(1<<(i%64)) != 0
}

func setBit(bm []uint64, i int64) { bm[i/64] |= 1 << (i % 64) }

// setRange sets bits [lo, hi) of bm.
func setRange(bm []uint64, lo, hi int64) {
	for i := lo; i < hi; {
		if i%64 == 0 && hi-i >= 64 {
			bm[i/64] = ^uint64(0)
			i += 64
			continue
		}
		setBit(bm, i)
		i++
	}
}

// count is the number of set bits of bm.
func count(bm []uint64) int64 {
	var n int
	for _, w := range bm {
		n += bits.OnesCount64(w)
	}
	return int64(n)
}

// words is the number of words n bits take.
func words(n int64) int { return int((n + 63) / 64) }

// trimmed is bm cut to n bits: the words they take, the bits beyond n
// clear. It copies only when it must clear bits.
func trimmed(bm []uint64, n int64) []uint64 {
	w := words(n)
	if len(bm) < w {
		out := make([]uint64, w)
		copy(out, bm)
		return out
	}
	bm = bm[:w]
	if r := n % 64; r != 0 && bm[w-1]>>r != 0 {
		out := append([]uint64(nil), bm...)
		out[w-1] &= 1<<r - 1
		return out
	}
	return bm
}

// eachSet calls fn with every set bit of bm, ascending.
func eachSet(bm []uint64, fn func(i int64)) {
	for j, w := range bm {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			fn(int64(j*64 + b))
			w &= w - 1
		}
	}
}

// eachRun calls fn with every maximal run [lo, hi) of set bits of bm.
func eachRun(bm []uint64, fn func(lo, hi int64)) {
	lo, hi := int64(-1), int64(-1)
	eachSet(bm, func(i int64) {
		if i == hi {
			hi++
			return
		}
		if lo >= 0 {
			fn(lo, hi)
		}
		lo, hi = i, i+1
	})
	if lo >= 0 {
		fn(lo, hi)
	}
}

// andNot is a &^ b over the words of a.
func andNot(a, b []uint64) []uint64 {
	out := make([]uint64, len(a))
	for i, w := range a {
		if i < len(b) {
			w &^= b[i]
		}
		out[i] = w
	}
	return out
}

// bitsFrom is n bits of bm starting at bit off, as words from bit 0.
func bitsFrom(bm []uint64, off, n int64) []uint64 {
	out := make([]uint64, words(n))
	if off%64 == 0 {
		lo := int(off / 64)
		if lo < len(bm) {
			copy(out, bm[lo:])
		}
		return trimmed(out, n)
	}
	w, s := int(off/64), uint(off%64)
	for i := range out {
		var v uint64
		if w+i < len(bm) {
			v = bm[w+i] >> s
		}
		if w+i+1 < len(bm) {
			v |= bm[w+i+1] << (64 - s)
		}
		out[i] = v
	}
	return trimmed(out, n)
}
