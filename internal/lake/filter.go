package lake

import (
	"context"
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/compute"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// VisibleMask computes, 64 rows per word, which of n rows are visible: bit i
// is set iff row i is not in deleted (one bit per row, as the visibility
// package produces; nil means none deleted) and, when createTS is not nil,
// createTS[i] ≤ snapshot. dst is reused when large enough.
func VisibleMask(dst []uint64, n int, deleted []uint64, createTS []int64, snapshot uint64) ([]uint64, int) {
	words := (n + 63) / 64
	if cap(dst) < words {
		dst = make([]uint64, words)
	}
	dst = dst[:words]
	visible := 0
	for w := range dst {
		m := ^uint64(0)
		if w < len(deleted) {
			m = ^deleted[w]
		}
		if rest := n - w*64; rest < 64 {
			m &= 1<<rest - 1
		}
		if createTS != nil && m != 0 {
			m &= tsMask(createTS[w*64:min(w*64+64, n)], snapshot)
		}
		dst[w] = m
		visible += bits.OnesCount64(m)
	}
	return dst, visible
}

// tsMask sets bit j for each create timestamp ≤ snapshot. The comparison is
// branch-free so the loop stays a straight run of compares and shifts.
func tsMask(ts []int64, snapshot uint64) uint64 {
	var m uint64
	for j, t := range ts {
		after := (snapshot - uint64(t)) >> 63 // 1 iff t > snapshot (both < 2^63)
		m |= (after ^ 1) << j
	}
	return m
}

// FilterVisible returns the rows of rec selected by mask (from VisibleMask,
// with visible rows counted). All visible: rec itself, retained. None: an
// empty record. Otherwise the rows are copied out by Arrow's filter kernel,
// with the mask used directly as the selection bitmap.
func FilterVisible(ctx context.Context, rec arrow.RecordBatch, mask []uint64, visible int, mem memory.Allocator) (arrow.RecordBatch, error) {
	n := int(rec.NumRows())
	switch visible {
	case n:
		rec.Retain()
		return rec, nil
	case 0:
		return rec.NewSlice(0, 0), nil
	}
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	// Arrow booleans are LSB-first bitmaps, the same layout as the mask
	// words on a little-endian machine.
	buf := memory.NewBufferBytes(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(mask))), len(mask)*8))
	sel := array.NewBoolean(n, buf, nil, 0)
	defer sel.Release()
	ctx = compute.WithAllocator(ctx, mem)
	out, err := compute.FilterRecordBatch(ctx, rec, sel, compute.DefaultFilterOptions())
	if err != nil {
		return nil, fmt.Errorf("lake: filter visible rows: %w", err)
	}
	return out, nil
}
