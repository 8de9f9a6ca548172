package replay

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/visibility"
)

// Undo records
//
// Every write Apply makes for a bucket is recorded until the transaction
// that made it commits: a version put into an index, a delete timestamp
// given to a row version, a row version appended to a write buffer. A
// rollback walks the records back from the newest and undoes those at or
// above its timestamp: index versions are removed exactly (older versions
// stay), delete entries are taken back, and appended versions are deleted
// at their own timestamp, so no snapshot ever sees them (their rows stay in
// the buffer; their timestamps are aborted and never reused).

type undoKind uint8

const (
	undoIndex  undoKind = iota + 1 // key (and row, for non-unique) versioned at ts
	undoDelete                     // row deleted at ts
	undoAppend                     // row appended with create_ts = ts
)

type undoRecord struct {
	kind undoKind
	ts   uint64
	row  uint64
	key  index.Key
}

// undoLog is one bucket's records, oldest first. The bucket's Apply and
// Rollback calls hold its lock throughout (uncontended in the pipeline,
// where a bucket's calls come one at a time anyway).
type undoLog struct {
	mu    sync.Mutex
	recs  []undoRecord
	spill *undoSpill // older records on disk (undospill.go), nil when none
}

func (u *undoLog) add(r undoRecord) { u.recs = append(u.recs, r) }

// forget drops the records of committed transactions. Records are in
// timestamp order across Apply calls (within one call a later phase may
// record a smaller timestamp), so a prefix below stable goes.
func (u *undoLog) forget(stable uint64) {
	i := 0
	for i < len(u.recs) && u.recs[i].ts < stable {
		i++
	}
	if i == 0 {
		return
	}
	if i == len(u.recs) {
		u.recs = u.recs[:0]
		return
	}
	u.recs = append(u.recs[:0], u.recs[i:]...)
}

func (r *Replayer) undoLog(bucket int) *undoLog {
	r.undoMu.Lock()
	defer r.undoMu.Unlock()
	u := r.undo[bucket]
	if u == nil {
		u = &undoLog{}
		r.undo[bucket] = u
	}
	return u
}

// Rollback undoes everything Apply wrote for the bucket at timestamps ≥
// from: afterwards no snapshot, at any timestamp, sees any of it, and the
// bucket's next Apply starts from the state below from. The caller makes
// sure no query reads at or above from before the timestamps are aborted
// (they are above HWM). An error means the undo is incomplete: the state
// must not be served as it is.
func (r *Replayer) Rollback(ctx context.Context, bucket int, from uint64) error {
	u := r.undoLog(bucket)
	u.mu.Lock()
	defer u.mu.Unlock()
	var errs []error
	// Newest first: the records in memory, then the spilled ones chunk by
	// chunk from the newest, each chunk's index versions reverted with it.
	errs = append(errs, r.undoRecords(ctx, u.recs, from)...)
	kept := 0
	for _, rec := range u.recs {
		if rec.ts < from {
			u.recs[kept] = rec
			kept++
		}
	}
	clear(u.recs[kept:])
	u.recs = u.recs[:kept]
	if sp := u.spill; sp != nil {
		var older []undoRecord // spilled records below from stay
		for i := len(sp.chunks) - 1; i >= 0; i-- {
			recs, err := sp.chunk(i)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, r.undoRecords(ctx, recs, from)...)
			var below []undoRecord
			for _, rec := range recs {
				if rec.ts < from {
					below = append(below, rec)
				}
			}
			older = append(below, older...)
		}
		errs = append(errs, sp.close())
		u.spill = nil
		u.recs = append(older, u.recs...)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("replay: rollback of bucket %d from %d: %w", bucket, from, err)
	}
	return nil
}

// undoRecords takes back the records at or above from, newest first.
func (r *Replayer) undoRecords(ctx context.Context, recs []undoRecord, from uint64) []error {
	var revert []index.Written
	var errs []error
	for i := len(recs) - 1; i >= 0; i-- {
		rec := recs[i]
		if rec.ts < from {
			continue
		}
		switch rec.kind {
		case undoIndex:
			revert = append(revert, index.Written{Key: rec.key, RowID: rec.row, TS: rec.ts})
		case undoDelete:
			if err := r.undeleteVersion(rec.row, rec.ts); err != nil {
				errs = append(errs, fmt.Errorf("take back the delete of row %d at %d: %w", rec.row, rec.ts, err))
			}
		case undoAppend:
			if err := r.deleteVersion(rec.row, rec.ts); err != nil {
				errs = append(errs, fmt.Errorf("hide row %d appended at %d: %w", rec.row, rec.ts, err))
			}
		}
	}
	if err := r.cfg.Index.Revert(ctx, revert); err != nil {
		errs = append(errs, fmt.Errorf("revert %d index versions: %w", len(revert), err))
	}
	return errs
}

// undeleteVersion takes back a row version's delete timestamp.
func (r *Replayer) undeleteVersion(rowID, ts uint64) error {
	vis, off, err := r.rowVisibility(rowID)
	if err != nil {
		return err
	}
	return vis.Undelete(off, ts)
}

// rowVisibility finds the visibility and offset of a row version.
func (r *Replayer) rowVisibility(rowID uint64) (*visibility.RowGroup, uint32, error) {
	loc, err := r.cfg.Index.Locate(context.Background(), rowID)
	if err != nil {
		return nil, 0, err
	}
	vis, ok := r.FileVisibility(loc.FileID)
	if !ok {
		return nil, 0, fmt.Errorf("replay: file %d (row %d) is not owned by replayer %d", loc.FileID, rowID, r.cfg.ID)
	}
	return vis, loc.Offset, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// BucketOf is the bucket of an encoded primary key (index.Store.Key) among
// n. It is fixed: a key must land in the same bucket, and so the same
// replayer, after a restart.
func BucketOf(key []byte, n int) int {
	return int(crc32.Checksum(key, castagnoli) % uint32(n))
}

// BucketFor is the bucket of a row of table t with the encoded primary key
// among n: BucketOf the key, or, for a table whose rows are found by
// content (catalog.Schema.GeneratedKey), one bucket for the whole table.
func BucketFor(t *catalog.Table, key []byte, n int) int {
	if t.Schema.GeneratedKey {
		return int(t.ID % uint32(n))
	}
	return BucketOf(key, n)
}
