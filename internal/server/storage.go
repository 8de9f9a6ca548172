package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/visibility"
)

// Storage is what the lake holds against what queries can still read: the
// figures that say whether storage GC keeps up.
type Storage struct {
	// LakeBytes is every object in the lake; LiveBytes is the share of the
	// live files' objects that holds versions visible at the snapshot
	// (each object weighted by its visible rows).
	LakeBytes, LiveBytes int64
	// Versions are the row versions in live files (buffered ones too);
	// Stale are those deleted at or before the snapshot, which every new
	// scan reads and filters out.
	Versions, Stale int64
	Files           int
	// ByTable splits Versions and Stale by table name.
	ByTable map[string]TableVersions
}

// TableVersions are one table's stored and stale row versions.
type TableVersions struct {
	Versions int64 `json:"versions"`
	Stale    int64 `json:"stale"`
}

// Storage measures the lake and the live files at snapshot at.
func (n *Node) Storage(ctx context.Context, at uint64) (Storage, error) {
	st := Storage{ByTable: map[string]TableVersions{}}
	objects, err := n.Lake.List(ctx, "")
	if err != nil {
		return st, fmt.Errorf("server: list the lake: %w", err)
	}
	size := make(map[string]int64, len(objects))
	for _, o := range objects {
		size[o.Key] = o.Size
		st.LakeBytes += o.Size
	}
	snap := n.Catalog.Snapshot()
	stale := (&staleCounter{at: at}).count
	for _, t := range snap.Tables() {
		before := [2]int64{st.Versions, st.Stale}
		for _, f := range snap.LiveFiles(t.ID) {
			st.Files++
			var vis *visibility.RowGroup
			if int(f.Replayer) < len(n.Replayers) {
				vis, _ = n.Replayers[f.Replayer].FileVisibility(f.ID)
			}
			if f.State != catalog.Virtual {
				rows := int(f.Rows())
				dead, err := stale(vis, 0, rows)
				if err != nil {
					return st, fmt.Errorf("server: file %d of %s: %w", f.ID, t.Name, err)
				}
				st.Versions += int64(rows)
				st.Stale += dead
				if rows > 0 {
					st.LiveBytes += size[f.Key] * (int64(rows) - dead) / int64(rows)
				}
				continue
			}
			if int(f.Replayer) >= len(n.Replayers) {
				continue
			}
			wb, err := n.Replayers[f.Replayer].Buffer(t.ID)
			if err != nil {
				return st, err
			}
			view := wb.View(f.ID) // a file combined meanwhile is missed this once
			for _, fv := range view.Files {
				for _, b := range fv.Blocks {
					dead, err := stale(fv.Vis, int(b.First), b.Rows)
					if err != nil {
						view.Release()
						return st, fmt.Errorf("server: file %d of %s: %w", f.ID, t.Name, err)
					}
					st.Versions += int64(b.Rows)
					st.Stale += dead
					if b.Key != "" && b.Rows > 0 {
						st.LiveBytes += size[b.Key] * (int64(b.Rows) - dead) / int64(b.Rows)
					}
				}
			}
			view.Release()
		}
		st.ByTable[t.Name] = TableVersions{Versions: st.Versions - before[0], Stale: st.Stale - before[1]}
	}
	return st, nil
}

// staleCounter counts deleted versions at one snapshot, reusing its bitmap
// buffer from call to call.
type staleCounter struct {
	at  uint64
	buf []uint64
}

// count is the number of rows of [first, first+rows) of vis deleted at the
// counter's snapshot (none when vis is nil).
func (c *staleCounter) count(vis *visibility.RowGroup, first, rows int) (int64, error) {
	if vis == nil || rows == 0 {
		return 0, nil
	}
	bm, bit, err := vis.BitmapRange(c.at, first, rows, c.buf)
	if err != nil {
		return 0, err
	}
	c.buf = bm
	return countBits(bm, bit, rows), nil
}

// countAtBound is count for a GC round whose bound (the counter's
// snapshot) was read a moment before: memory GC, which runs on its own,
// may since have collected vis past it because the low watermark moved
// on. The deleted set at the collected point is then counted; no running
// snapshot is below it. bound is how far memory GC may collect now, and a
// collected point above it is a broken invariant (a snapshot still
// running may have lost versions): an error, never skipped.
func (c *staleCounter) countAtBound(vis *visibility.RowGroup, first, rows int, bound func() (uint64, error)) (int64, error) {
	n, err := c.count(vis, first, rows)
	if !errors.Is(err, visibility.ErrSnapshotTooOld) {
		return n, err
	}
	collected := vis.Collected()
	now, berr := bound()
	if berr != nil {
		return 0, berr
	}
	if collected > now {
		return 0, fmt.Errorf("memory GC collected its visibility to %d, above %d, the most the low watermark allows now: %w", collected, now, err)
	}
	moved := staleCounter{at: collected, buf: c.buf}
	n, err = moved.count(vis, first, rows)
	c.buf = moved.buf
	return n, err
}
