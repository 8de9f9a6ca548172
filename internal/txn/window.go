package txn

import (
	"fmt"
	"math/bits"
)

// commitWindow tracks which allocated timestamps in [hwm, next) are done
// (committed or abandoned). Bit ts%64 of ring word (ts/64)%len(ring) is set
// once ts is done; bits below hwm are cleared as hwm passes them, so the ring
// only ever needs to span [hwm, next).
type commitWindow struct {
	hwm  uint64
	next uint64
	ring []uint64
}

func newCommitWindow(start uint64) commitWindow {
	return commitWindow{hwm: start, next: start, ring: make([]uint64, 64)}
}

// allocate extends the window by n timestamps and returns the first.
func (w *commitWindow) allocate(n int) uint64 {
	first := w.next
	if need := int((first+uint64(n)+63)/64 - w.hwm/64); need > len(w.ring) {
		w.grow(need)
	}
	w.next += uint64(n)
	return first
}

// grow re-lays the ring, which holds [hwm, next), into a larger power of two.
func (w *commitWindow) grow(need int) {
	size := len(w.ring)
	for size < need {
		size *= 2
	}
	ring := make([]uint64, size)
	if w.next > w.hwm {
		for word := w.hwm / 64; word <= (w.next-1)/64; word++ {
			ring[word%uint64(size)] = w.ring[word%uint64(len(w.ring))]
		}
	}
	w.ring = ring
}

func (w *commitWindow) slot(ts uint64) (*uint64, uint64) {
	return &w.ring[(ts/64)%uint64(len(w.ring))], 1 << (ts % 64)
}

// markDone marks every timestamp done, or none of them if one is not
// allocated, already done, or repeated in the call.
func (w *commitWindow) markDone(ts []uint64) error {
	for i, t := range ts {
		var err error
		switch {
		case t >= w.next || t == 0:
			err = fmt.Errorf("%w: %d (next to allocate is %d)", ErrNotAllocated, t, w.next)
		case t < w.hwm:
			err = fmt.Errorf("%w: %d (HWM is %d)", ErrAlreadyCommitted, t, w.hwm)
		default:
			word, bit := w.slot(t)
			if *word&bit != 0 {
				err = fmt.Errorf("%w: %d", ErrAlreadyCommitted, t)
			} else {
				*word |= bit
			}
		}
		if err != nil {
			for _, u := range ts[:i] { // undo this call's marks
				word, bit := w.slot(u)
				*word &^= bit
			}
			return err
		}
	}
	return nil
}

// advance moves hwm over the done prefix and reports whether it moved.
func (w *commitWindow) advance() bool {
	start := w.hwm
	for w.hwm < w.next {
		word, _ := w.slot(w.hwm)
		off := w.hwm % 64
		pending := ^*word >> off // zero bits from hwm on are not done
		run := uint64(bits.TrailingZeros64(pending))
		if pending == 0 {
			run = 64 - off
		}
		if run == 0 {
			break
		}
		run = min(run, w.next-w.hwm)
		*word &^= (^uint64(0) >> (64 - run)) << off
		w.hwm += run
	}
	return w.hwm != start
}
