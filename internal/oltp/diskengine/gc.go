package diskengine

import (
	"bytes"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Version GC. A background pass every GCInterval advances the readers'
// bound (tsorder.Readers: Begin registers the snapshot, a snapshot below
// the horizon is refused with ErrSnapshotUnavailable) and sweeps the next
// gcChunk rows from a cursor that wraps around the table space. In each
// row it deletes the versions older than the newest one at or below the
// bound, and that one too when it is a delete: no reader can see any of
// them. The bound never passes the ForgetThrough mark, so recovery never
// takes out a transaction whose older versions are gone. The deletes are
// unsynced: after a crash a few old versions may come back and go again.
//
// Secondary index entries are not collected: readers check them against
// the row, so a stale entry costs a lookup, not a wrong answer.

const gcChunk = 4096

func (e *Engine) gcLoop() {
	defer close(e.gcDone)
	if e.gcInterval < 0 {
		<-e.gcStop
		return
	}
	tick := time.NewTicker(e.gcInterval)
	defer tick.Stop()
	for {
		select {
		case <-e.gcStop:
			return
		case <-tick.C:
			if _, err := e.gcPass(); err != nil {
				e.logger.Warn("storage engine version GC pass failed; it retries on the next pass", "err", err)
			}
		}
	}
}

// gcPass advances the bound and sweeps one chunk; it reports how many
// versions it deleted.
func (e *Engine) gcPass() (int, error) {
	bound := min(e.readers.Advance(e.clock.Visible()), e.forgot.Load())
	if bound == 0 {
		return 0, nil
	}
	lower := e.gcCursor
	if lower == nil {
		lower = []byte{prefixRow}
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: []byte{prefixRow + 1}})
	if err != nil {
		return 0, fmt.Errorf("storage engine: %s: version GC iterator: %w", e.dir, err)
	}
	defer it.Close()
	b := e.db.NewBatch()
	defer b.Close()
	deleted, rows := 0, 0
	var row []byte     // prefix of the row being swept
	var keptOld bool   // the row's newest version at or below bound is behind us
	var pending []byte // that version's key, when it is a delete
	flushRow := func() {
		if pending != nil {
			_ = b.Delete(pending, nil)
			deleted++
		}
		pending = nil
	}
	e.gcCursor = nil
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) < 9 {
			continue
		}
		rp := k[:len(k)-8]
		if !bytes.Equal(rp, row) {
			flushRow()
			if rows == gcChunk {
				e.gcCursor = bytes.Clone(k)
				break
			}
			rows++
			row, keptOld = append(row[:0], rp...), false
			// A row whose newest version is at or below bound and a
			// delete has nothing any reader can see.
			if ts := versionTS(k); ts <= bound {
				keptOld = true
				if v := it.Value(); len(v) > 0 && v[0] == kindDelete {
					pending = bytes.Clone(k)
				}
			}
			continue
		}
		if keptOld {
			_ = b.Delete(k, nil)
			deleted++
			continue
		}
		if versionTS(k) <= bound {
			keptOld = true
		}
	}
	if e.gcCursor == nil {
		flushRow()
	}
	if err := it.Error(); err != nil {
		return 0, fmt.Errorf("storage engine: %s: version GC: %w", e.dir, err)
	}
	if deleted == 0 {
		return 0, nil
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return 0, fmt.Errorf("storage engine: %s: version GC: %w", e.dir, err)
	}
	return deleted, nil
}
