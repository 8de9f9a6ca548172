package replay

// Storage GC, the replayer's part. A rewrite happens in three steps:
//
//  1. Rewrite (in the background, beside replay): the versions of one or
//     more regular files that are not deleted at a snapshot every running
//     query is at or above are written into one new object under a new
//     file id; nothing else changes, so a crash here leaves only an object
//     no catalog entry names (the restore sweeps it).
//  2. Switch (while nothing is being applied, at a replay checkpoint): the
//     new file's visibility is carried over from the old files (deletes
//     that landed during step 1 included, with their timestamps), the
//     catalog swaps the files in one transaction (with the other rewrites
//     the same checkpoint switches in), and the main index points
//     the old row ids at the new offsets. Deletes from then on reach the new
//     file; a query planned before the swap still reads the old files, whose
//     deleted sets hold every delete at or below its snapshot.
//  3. Drop (once the checkpoint that took the switch is durable and no
//     query can still read the old files): their objects, visibility and
//     catalog entries go.
//
// Doing the switch at a quiescent point is what makes the paper's dual
// delete unnecessary: no delete can land between carrying the deleted sets
// over and the swap.

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/visibility"
	"github.com/retinadb/retina/internal/writebuffer"
)

// GCKey is the object key of a file storage GC wrote.
func GCKey(table uint32, file uint64) string { return fmt.Sprintf("t%d/g%d.parquet", table, file) }

// GCPrefix is the prefix of the objects storage GC wrote for a table.
func GCPrefix(table uint32) string { return fmt.Sprintf("t%d/g", table) }

// Rewritten is a new file written by storage GC, not yet switched in.
type Rewritten struct {
	Table *catalog.Table
	Old   []*catalog.File
	// Kept lists, per old file, the offsets whose versions moved, in
	// order; they follow each other in the new file.
	Kept [][]uint32
	New  catalog.File // zero when no version was live
	// At is the snapshot the rewrite kept the live versions of.
	At uint64
	// Rows and Dropped count the versions moved and left behind.
	Rows, Dropped int64
}

// Pace is called after each row group a rewrite reads, with the time the
// work took; it may sleep to leave the cores to replay.
type Pace func(ctx context.Context, worked time.Duration) error

// Rewrite writes the versions of the regular files of table t that are not
// deleted at snapshot at into one new object (step 1). Every file must be
// owned by this replayer; a file written before the table gained columns
// is rewritten with them, NULL.
func (r *Replayer) Rewrite(ctx context.Context, t *catalog.Table, files []*catalog.File, at uint64, pace Pace) (*Rewritten, error) {
	rw := &Rewritten{Table: t, Old: files, At: at}
	var buf bytes.Buffer
	schema := writebuffer.Schema(writebuffer.TableColumns(t.Schema))
	w, err := lake.NewFileWriter(&buf, lake.FileSchema(schema), lake.WriterOptions{RowGroupRows: int64(max(r.cfg.BlockRows, 1))})
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		switch {
		case f.TableID != t.ID || f.State != catalog.Regular:
			return nil, fmt.Errorf("replay: storage GC: file %d is %s in table %d, want a regular file of %s", f.ID, f.State, f.TableID, t.Name)
		case f.Replayer != r.cfg.ID:
			return nil, fmt.Errorf("replay: storage GC: file %d belongs to replayer %d, not %d", f.ID, f.Replayer, r.cfg.ID)
		}
		vis, ok := r.FileVisibility(f.ID)
		if !ok {
			return nil, fmt.Errorf("replay: storage GC: no visibility for file %d", f.ID)
		}
		// The deleted set is taken before the slow part: memory GC may
		// fold deletes above at meanwhile (LWM moves on), and then at
		// moves up with it, which is as safe (no query is below it).
		deleted, fileAt, err := deletedAt(vis, at)
		if err != nil {
			return nil, fmt.Errorf("replay: storage GC: deletes of file %d: %w", f.ID, err)
		}
		rw.At = max(rw.At, fileAt)
		start := time.Now()
		data, err := r.cfg.Lake.Get(ctx, f.Key)
		if err != nil {
			return nil, fmt.Errorf("replay: storage GC: read file %d: %w", f.ID, err)
		}
		pf, err := lake.OpenFile(bytes.NewReader(data), nil)
		if err != nil {
			return nil, fmt.Errorf("replay: storage GC: file %d: %w", f.ID, err)
		}
		if err := pf.Widen(schema); err != nil {
			pf.Close()
			return nil, fmt.Errorf("replay: storage GC: file %d of table %s: %w", f.ID, t.Name, err)
		}
		kept, err := r.copyLive(ctx, w, pf, schema.NumFields(), deleted, start, pace)
		pf.Close()
		if err != nil {
			return nil, fmt.Errorf("replay: storage GC: file %d: %w", f.ID, err)
		}
		rw.Kept = append(rw.Kept, kept)
		rw.Rows += int64(len(kept))
		rw.Dropped += f.Rows() - int64(len(kept))
	}
	groups, err := w.Close()
	if err != nil {
		return nil, err
	}
	if rw.Rows == 0 {
		return rw, nil // nothing live: the files just go (New stays zero)
	}
	id, err := r.cfg.Catalog.AllocateFileIDs(ctx, 1)
	if err != nil {
		return nil, fmt.Errorf("replay: storage GC: allocate a file id: %w", err)
	}
	rw.New = catalog.File{ID: id, TableID: t.ID, Key: GCKey(t.ID, id), State: catalog.Regular, Replayer: r.cfg.ID, RowGroups: groups}
	if err := r.cfg.Lake.Put(ctx, rw.New.Key, buf.Bytes()); err != nil {
		return nil, fmt.Errorf("replay: storage GC: write %s: %w", rw.New.Key, err)
	}
	r.cfg.Failpoints.Hit(failpoint.GCRewritten)
	return rw, nil
}

// deletedAt is a file's deleted set at snapshot at, or at the point memory
// GC collected it up to when that is higher, with the snapshot used.
func deletedAt(vis *visibility.RowGroup, at uint64) ([]uint64, uint64, error) {
	bm := make([]uint64, vis.BitmapWords())
	var err error
	for range 3 { // memory GC may move between reading its point and the bitmap
		at = max(at, vis.Collected())
		if err = vis.Bitmap(at, bm); err == nil {
			return bm, at, nil
		}
	}
	return nil, 0, err
}

// copyLive appends the rows of pf not in deleted to w and returns their
// offsets.
func (r *Replayer) copyLive(ctx context.Context, w *lake.FileWriter, pf *lake.File, columns int, deleted []uint64, start time.Time, pace Pace) ([]uint32, error) {
	all := make([]int, columns) // table columns; create_ts comes with them
	for i := range all {
		all[i] = i
	}
	var kept []uint32
	offset := 0
	for g, meta := range pf.RowGroups() {
		n := int(meta.Rows)
		if n == 0 {
			continue
		}
		if offset+n > len(deleted)*64 {
			return nil, fmt.Errorf("row group %d ends at row %d, past the %d rows its visibility covers", g, offset+n, len(deleted)*64)
		}
		mask := make([]uint64, (n+63)/64)
		visible := 0
		for i := range n {
			b := offset + i
			if deleted[b/64]>>(b%64)&1 == 0 {
				mask[i/64] |= 1 << (i % 64)
				kept = append(kept, uint32(offset+i))
				visible++
			}
		}
		if visible > 0 {
			rec, err := pf.ReadRowGroup(ctx, g, all, true)
			if err != nil {
				return nil, err
			}
			out, err := lake.FilterVisible(ctx, rec, mask, visible, nil)
			rec.Release()
			if err != nil {
				return nil, err
			}
			err = w.Write(out)
			out.Release()
			if err != nil {
				return nil, err
			}
		}
		offset += n
		if pace != nil {
			if err := pace(ctx, time.Since(start)); err != nil {
				return nil, err
			}
			start = time.Now()
		}
	}
	return kept, nil
}

// A switch puts a rewritten file in the place of the files it replaces
// (step 2), in three calls: PrepareSwitch, the catalog swap it returns
// (the caller makes the swaps of every rewrite a checkpoint takes in one
// catalog change), then FinishSwitch, or AbandonSwitch if the swap failed.
// Nothing may be applied meanwhile (the caller quiesces replay).

// PrepareSwitch readies rw's switch and returns its catalog swap. lwm must
// be at or below every running query's snapshot: the new file answers
// every snapshot from there on. An error leaves everything as it was (the
// caller deletes the object).
func (r *Replayer) PrepareSwitch(rw *Rewritten, lwm uint64) (catalog.FileSwap, error) {
	if t, ok := r.cfg.Catalog.Snapshot().TableByID(rw.Table.ID); !ok || t.SchemaVersion != rw.Table.SchemaVersion {
		// The new file holds the columns of the schema it was written with.
		return catalog.FileSwap{}, fmt.Errorf("replay: storage GC: table %s changed its schema during the rewrite", rw.Table.Name)
	}
	sw := catalog.FileSwap{Table: rw.Table.ID, Remove: make([]uint64, len(rw.Old))}
	for i, f := range rw.Old {
		sw.Remove[i] = f.ID
	}
	if rw.New.ID == 0 { // every version was stale
		return sw, nil
	}
	sources := make([]visibility.Source, len(rw.Old))
	for i, f := range rw.Old {
		vis, ok := r.FileVisibility(f.ID)
		if !ok {
			return catalog.FileSwap{}, fmt.Errorf("replay: storage GC: no visibility for file %d", f.ID)
		}
		sources[i] = visibility.Source{From: vis, Kept: rw.Kept[i]}
	}
	vis, err := visibility.Carry(max(lwm, rw.At), sources)
	if err != nil {
		return catalog.FileSwap{}, fmt.Errorf("replay: storage GC: carry the deletes of file %d on: %w", rw.Old[0].ID, err)
	}
	r.filesMu.Lock()
	r.files[rw.New.ID] = vis // before the swap: a query planned after it finds it
	r.filesMu.Unlock()
	sw.Add = []catalog.File{rw.New}
	return sw, nil
}

// AbandonSwitch undoes PrepareSwitch after its catalog swap failed.
func (r *Replayer) AbandonSwitch(rw *Rewritten) {
	if rw.New.ID != 0 {
		r.filesMu.Lock()
		delete(r.files, rw.New.ID)
		r.filesMu.Unlock()
	}
}

// FinishSwitch points the index at the rows' new places once the catalog
// swap is durable. An error wraps ErrSwitchHalfDone: the replay state must
// be restored from the last checkpoint.
func (r *Replayer) FinishSwitch(ctx context.Context, rw *Rewritten) error {
	if rw.New.ID == 0 {
		old := make([]uint64, len(rw.Old))
		for i, f := range rw.Old {
			old[i] = f.ID
		}
		if _, err := r.cfg.Index.DropRanges(ctx, old...); err != nil {
			return fmt.Errorf("%w: drop the rows of files %v: %w", ErrSwitchHalfDone, old, err)
		}
		return nil
	}
	base := uint32(0)
	for i, f := range rw.Old {
		if err := r.cfg.Index.RemapFile(ctx, f.ID, rw.New.ID, base, rw.Kept[i]); err != nil {
			return fmt.Errorf("%w: remap the rows of file %d to file %d: %w", ErrSwitchHalfDone, f.ID, rw.New.ID, err)
		}
		base += uint32(len(rw.Kept[i]))
	}
	return nil
}

// ErrSwitchHalfDone says a storage-GC switch failed after the catalog
// swap: the replay state is no longer consistent.
var ErrSwitchHalfDone = fmt.Errorf("replay: storage GC switch half done")

// DropRetired removes a file storage GC replaced (step 3): its visibility,
// object and catalog entry. Call it only once no query can read the file
// and a durable checkpoint no longer names it.
func (r *Replayer) DropRetired(ctx context.Context, f *catalog.File) error {
	if f.State != catalog.Retired {
		return fmt.Errorf("replay: storage GC: file %d is %s, not retired", f.ID, f.State)
	}
	r.cfg.Failpoints.Hit(failpoint.GCBeforeDrop)
	if r.cfg.Keeps == nil || !r.cfg.Keeps(f.Key) {
		if err := r.cfg.Lake.Delete(ctx, f.Key); err != nil {
			return fmt.Errorf("replay: storage GC: delete %s: %w", f.Key, err)
		}
	}
	if err := r.cfg.Catalog.DeleteFile(ctx, f.ID); err != nil {
		return fmt.Errorf("replay: storage GC: forget file %d: %w", f.ID, err)
	}
	r.filesMu.Lock()
	delete(r.files, f.ID)
	r.filesMu.Unlock()
	return nil
}
