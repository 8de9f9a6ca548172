package engine

import (
	"bytes"
	"sort"
)

// Row is one row a scan yields: its primary key, its row and, for a
// secondary-index scan, its index key.
type Row struct {
	Sec []byte
	Key []byte
	Val []byte
}

// OwnWrite is a write of the scanning transaction itself.
type OwnWrite struct {
	Key     []byte
	Row     []byte
	Deleted bool
}

// Overlay merges a transaction's own writes into the rows a scan found at
// its snapshot, for the range lo ≤ k < hi where k is the primary key
// (secKey nil) or secKey(row). The result is in scan order.
func Overlay(base []Row, own []OwnWrite, secKey func([]byte) []byte, lo, hi []byte) []Row {
	if len(own) == 0 {
		return base
	}
	mine := make(map[string]bool, len(own))
	for _, w := range own {
		mine[string(w.Key)] = true
	}
	out := base[:0:0]
	for _, r := range base {
		if !mine[string(r.Key)] {
			out = append(out, r)
		}
	}
	for _, w := range own {
		if w.Deleted {
			continue
		}
		k := w.Key
		var sec []byte
		if secKey != nil {
			if sec = secKey(w.Row); sec == nil {
				continue
			}
			k = sec
		}
		if InRange(k, lo, hi) {
			out = append(out, Row{Sec: sec, Key: w.Key, Val: w.Row})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if c := bytes.Compare(out[i].Sec, out[j].Sec); c != 0 {
			return c < 0
		}
		return bytes.Compare(out[i].Key, out[j].Key) < 0
	})
	return out
}

// InRange reports lo ≤ k < hi (hi nil: unbounded).
func InRange(k, lo, hi []byte) bool {
	return bytes.Compare(k, lo) >= 0 && (hi == nil || bytes.Compare(k, hi) < 0)
}

// Emit calls fn for rows in order until it returns false.
func Emit(rows []Row, fn func(key, row []byte) bool) {
	for _, r := range rows {
		if !fn(r.Key, r.Val) {
			return
		}
	}
}
