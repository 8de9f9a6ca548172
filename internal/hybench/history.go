package hybench

// history is a movement table (transfer or checking) as the generator
// knows it: its rows have the ids oldest..next-1, and a purge deletes the
// oldest. Base rows (ids up to base) are regenerated from their id for a
// delete's before image; streamed rows are kept only when the generator
// retains history, since nothing else can say what they were.
type history struct {
	name     string
	baseKind int        // the base rows' table number for rowRand
	base     int64      // ids 1..base are base rows
	oldest   int64      // the oldest id still there
	next     int64      // the id the next row gets
	streamed []movement // rows base+1.. still there, oldest first (retained only)
}

func newHistory(name string, baseKind int, base int64) history {
	return history{name: name, baseKind: baseKind, base: base, oldest: 1, next: base + 1}
}

// live is how many rows the table has.
func (h *history) live() int64 { return h.next - h.oldest }

// add records a new row and returns its id.
func (h *history) add(m movement, retain bool) int64 {
	id := h.next
	h.next++
	if retain {
		h.streamed = append(h.streamed, m)
	}
	return id
}

// purgeable says a purge can delete the oldest row: any row when history
// is retained, else only base rows (streamed rows' images are not kept).
func (h *history) purgeable(retain bool) bool {
	return h.live() > 0 && (retain || h.oldest <= h.base)
}

// deleteOldest appends the delete of the oldest row; purgeable must hold.
func (g *Generator) deleteOldest(dst []byte, h *history) []byte {
	id := h.oldest
	h.oldest++
	var m movement
	if id <= h.base {
		m = g.baseMovement(h.baseKind, id)
	} else {
		m = h.streamed[0] // base rows go first, so the oldest is streamed[0]
		h.streamed[0] = movement{}
		h.streamed = h.streamed[1:]
	}
	return g.appendChange(dst, 'd', h.name, func(b []byte) []byte { return appendMovement(b, id, m) }, nil)
}
