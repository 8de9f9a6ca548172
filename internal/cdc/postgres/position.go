package postgres

import (
	"math"
	"strings"

	"github.com/jackc/pglogrepl"

	"github.com/retinadb/retina/internal/cdc"
)

// Positions. Every change of a transaction sits at the transaction's commit
// LSN in the stream "postgres/SLOT" and its end one before the end of the
// commit record, so the replay checkpoint's resume offset of that stream is
// the end of the last applied commit: exactly the LSN to restart streaming
// from (PostgreSQL skips commits that start before it), the flush LSN the
// slot may confirm, and the point before which every commit is applied
// (retina_wait_lsn). Between transactions the source also marks the
// server's sent position minus one as handled, so an idle or unrelated WAL
// stream still lets the slot release WAL.
//
// The initial copy uses a stream of its own, "postgres/SLOT/snapshot@LSN"
// (LSN: the slot's consistent point), offsets 0 (the truncate that precedes
// a restarted copy) then 1, 2, … one per row, and a last offset
// snapshotDone once every table is copied. A checkpoint whose snapshot
// stream resumes at math.MaxInt64 has the whole copy applied.
const snapshotDone = math.MaxInt64 - 1

func mainStream(slot string) string { return "postgres/" + slot }

func snapshotStream(slot string, consistent pglogrepl.LSN) string {
	return mainStream(slot) + "/snapshot@" + consistent.String()
}

// resumeState is what a replay checkpoint says about this source.
type resumeState struct {
	// streamFrom is where streaming resumes, valid when copied is true.
	streamFrom pglogrepl.LSN
	// copied: the initial copy is applied in full.
	copied bool
	// delivered: something of this slot was delivered before (a restarted
	// copy must truncate first).
	delivered bool
}

func readResume(slot string, resume map[string]int64) resumeState {
	var st resumeState
	main := mainStream(slot)
	off, hasMain := resume[main]
	for name, o := range resume {
		if name == main || strings.HasPrefix(name, main+"/snapshot@") {
			st.delivered = true
			if o == math.MaxInt64 {
				st.copied = true
			}
		}
	}
	st.copied = st.copied && hasMain
	st.streamFrom = pglogrepl.LSN(off)
	return st
}

func record(pos cdc.Position, r cdc.Record) cdc.Message {
	r.Pos = pos
	return cdc.Message{Pos: pos, Record: &r}
}
