package iceberg

// Pieces. Rows that no regular Parquet file holds yet, those of virtual
// files (write buffers), are published in Parquet files of their own, the
// pieces. A piece holds, in order, the rows of one or more segments: runs
// [Lo, Hi) of a virtual file's offsets, of which it has the rows that were
// visible when it was written. A row of a piece is masked by the table's
// delete information once it is deleted, and once its file is regular:
// from then on the regular file publishes it. A piece whose rows are all
// masked leaves the table.
//
// Each publication writes at most one piece per table: the rows virtual
// files gained since the last one, as a piece of their own while the table
// has room for one (its allowance: twice its Retina files, less its
// regular files), and otherwise merged with the newest pieces as long as
// an older piece is not larger than what follows it, which keeps the
// pieces' sizes roughly halving from the oldest to the newest (a lazy
// binary counter: a row is rewritten about log2 of the publications its
// file takes to fill, less log2 of the allowance).

// segment is a run of a virtual file's offsets in a piece.
type segment struct {
	File   uint64
	Lo, Hi int64
	// Written marks the offsets of [Lo, Hi) the piece has a row of (bit i
	// for offset Lo+i); Rows counts them.
	Written []uint64
	Rows    int64
}

// piece is a published Parquet file of virtual files' rows.
type piece struct {
	*entry
	// Segs are its segments in row order; a piece loaded at a start has
	// none: every file it held rows of is regular by then.
	Segs []segment
}

// virtualAt is what a publication knows of a virtual file at its
// timestamp: its rows and its deleted set.
type virtualAt struct {
	Rows    int64
	Deleted []uint64
}

// masked is the piece's positions that are not visible at the publication:
// rows deleted by then, and every row of a file that is no longer virtual.
// live counts the others.
func (p *piece) masked(virtual map[uint64]virtualAt) (bm []uint64, live int64) {
	bm = make([]uint64, words(p.Records))
	if len(p.Segs) == 0 {
		setRange(bm, 0, p.Records)
		return bm, 0
	}
	base := int64(0)
	for _, s := range p.Segs {
		v, ok := virtual[s.File]
		if !ok {
			setRange(bm, base, base+s.Rows)
			base += s.Rows
			continue
		}
		pos := base
		eachSet(s.Written, func(i int64) {
			if bitAt(v.Deleted, s.Lo+i) {
				setBit(bm, pos)
			} else {
				live++
			}
			pos++
		})
		base += s.Rows
	}
	return bm, live
}

// span is a run of a virtual file's offsets to write into a new piece.
type span struct {
	File   uint64
	Lo, Hi int64
}

// mergeFrom chooses which pieces (or positional delete files) a
// publication rewrites together with the new rows: the returned index i
// means pieces[i:] (oldest first, live rows in live) are merged with fresh
// rows into one. Nothing is merged while there is room for one more;
// otherwise an older piece joins while it is not larger than what follows
// it, or while the table would have more than maxPieces.
func mergeFrom(live []int64, fresh int64, maxPieces int) int {
	if len(live)+1 <= maxPieces {
		return len(live)
	}
	i, acc := len(live), fresh
	for i > 0 && (live[i-1] <= acc || i+1 > maxPieces) {
		i--
		acc += live[i]
	}
	return i
}

// spansOf lists the runs of still-virtual files that the pieces cover, to
// write again (adjacent runs of one file joined), followed by fresh runs.
func spansOf(pieces []*piece, virtual map[uint64]virtualAt, fresh []span) []span {
	var out []span
	add := func(s span) {
		if n := len(out); n > 0 && out[n-1].File == s.File && out[n-1].Hi == s.Lo {
			out[n-1].Hi = s.Hi
			return
		}
		out = append(out, s)
	}
	for _, p := range pieces {
		for _, s := range p.Segs {
			if _, ok := virtual[s.File]; ok {
				add(span{s.File, s.Lo, s.Hi})
			}
		}
	}
	for _, s := range fresh {
		add(s)
	}
	return out
}
