package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/checkpoint"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/visibility"
	"github.com/retinadb/retina/internal/writebuffer"
)

// Recovery is the normal start path: whatever ended the last process, a
// clean stop or a kill -9, the replay state is restored from the last
// checkpoint, at its timestamp c:
//
//   - files the checkpoint does not name were born after c: their objects
//     and catalog entries go;
//   - a file that was a write buffer's at c becomes a regular file of the
//     rows it had at c (its sealed blocks combined), and rows a later
//     combination added are hidden for good;
//   - every file gets its deleted set at c back;
//   - the index is rebuilt from the files (a Pebble index after a clean
//     stop is kept as it is);
//   - each source resumes from its position at c, and the sink drops what
//     it redelivers of what was applied.
//
// The transaction service starts above every timestamp handed out before,
// so nothing written above c can become visible. Anything that does not
// match the checkpoint stops the start with the file and the check named.

// Recovery describes the start.
type Recovery struct {
	// Checkpoint is the timestamp restored (0: there was none), Written
	// when it was taken, Clean whether a clean stop took it.
	Checkpoint uint64
	Written    time.Time
	Clean      bool
	// Dropped are files born after it, Combined write-buffer files made
	// regular; Duration is the time the restore took.
	Dropped, Combined int
	Duration          time.Duration
	// IndexKept says the index on disk was the checkpoint's and was kept
	// rather than rebuilt from the files.
	IndexKept bool
}

// loadCheckpoint reads the last checkpoint; an older version's clean stop
// (sink-<n>.json and visibility/<file>.vis) is converted first.
func (n *Node) loadCheckpoint() (*checkpoint.Manifest, error) {
	m, err := n.ckpts.Load()
	if err != nil {
		return nil, fmt.Errorf("server: %w: the start is refused rather than serving part of a state; restore the data directory from a backup, or start over with an empty one (every source is then read again from its start)", err)
	}
	if m != nil {
		return m, nil
	}
	return n.legacyCheckpoint()
}

// legacyCheckpoint builds a manifest from what a clean stop of an earlier
// version left: sink-<n>.json per source and visibility/<file>.vis for
// every file it had. Files without a visibility file came after that stop.
func (n *Node) legacyCheckpoint() (*checkpoint.Manifest, error) {
	dir := n.Config.DataDir
	var sources []checkpoint.Source
	for i := 0; ; i++ {
		path := filepath.Join(dir, "sink-"+strconv.Itoa(i)+".json")
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		var st struct {
			Source     string            `json:"source"`
			Checkpoint change.Checkpoint `json:"checkpoint"`
		}
		if err := json.Unmarshal(data, &st); err != nil || st.Source == "" {
			return nil, fmt.Errorf("server: %s is corrupt (%v): it holds where source %d resumes; restore it, or start over with an empty data directory", path, err, i)
		}
		sources = append(sources, checkpoint.Source{URI: st.Source, Resume: st.Checkpoint})
	}
	if len(sources) == 0 {
		return nil, nil
	}
	m := &checkpoint.Manifest{Clean: true, Buckets: n.Config.Buckets, Replayers: n.Config.Replayers, Sources: sources}
	vis := map[uint64][]byte{}
	snap := n.Catalog.Snapshot()
	for _, t := range snap.Tables() {
		for _, f := range snap.LiveFiles(t.ID) {
			path := filepath.Join(dir, checkpoint.VisDir, strconv.FormatUint(f.ID, 10)+".vis")
			data, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("server: %w", err)
			}
			var cp visibility.Checkpoint
			if err := cp.UnmarshalBinary(data); err != nil {
				return nil, fmt.Errorf("server: %s: %w", path, err)
			}
			m.TS = max(m.TS, cp.TS)
			m.Files = append(m.Files, checkpoint.File{ID: f.ID, Table: t.ID, Replayer: f.Replayer, Rows: f.Rows(), Capacity: cp.Rows})
			if slices.ContainsFunc(cp.Bitmap, func(w uint64) bool { return w != 0 }) {
				vis[f.ID] = data
			}
		}
	}
	if err := n.ckpts.Write(m, vis); err != nil {
		return nil, fmt.Errorf("server: convert the clean stop of an earlier version: %w", err)
	}
	for i := range sources {
		os.Remove(filepath.Join(dir, "sink-"+strconv.Itoa(i)+".json"))
	}
	n.log.Info("converted the data directory of an earlier version", "files", len(m.Files), "sources", len(sources))
	return m, nil
}

// restore makes the catalog, the lake, the replayers and the index match
// the checkpoint m (nil: none was ever taken, so nothing is kept).
func (n *Node) restore(ctx context.Context, m *checkpoint.Manifest, rebuildIndex bool) error {
	start := time.Now()
	if m == nil {
		m = &checkpoint.Manifest{Buckets: n.Config.Buckets, Replayers: n.Config.Replayers}
	}
	if m.Buckets != n.Config.Buckets || m.Replayers != n.Config.Replayers {
		return fmt.Errorf("server: the checkpoint was taken with --buckets %d --replayers %d, this start asks for --buckets %d --replayers %d: start with those", m.Buckets, m.Replayers, n.Config.Buckets, n.Config.Replayers)
	}
	rec := Recovery{Checkpoint: m.TS, Written: m.Written, Clean: m.Clean, IndexKept: !rebuildIndex}
	keep := make(map[uint64]bool, len(m.Files))
	for _, f := range m.Files {
		keep[f.ID] = true
	}
	snap := n.Catalog.Snapshot()
	for _, t := range snap.Tables() {
		for _, f := range snap.Files(t.ID) {
			if !keep[f.ID] {
				if err := n.dropFile(ctx, f); err != nil {
					return err
				}
				rec.Dropped++
			}
		}
	}
	if err := n.sweepGCObjects(ctx); err != nil {
		return err
	}
	n.Config.Failpoints.Hit(failpoint.RestoreMidway)
	for _, cf := range m.Files {
		snap := n.Catalog.Snapshot()
		f, ok := snap.File(cf.ID)
		if ok && f.State == catalog.Retired {
			// Storage GC replaced it after the checkpoint; the checkpoint's
			// state has it, so it comes back (its object is kept until a
			// checkpoint without it is durable).
			if _, err := n.Catalog.SetFileState(ctx, f.ID, catalog.Regular, nil); err != nil {
				return fmt.Errorf("server: revive file %d that storage GC replaced after the checkpoint: %w", cf.ID, err)
			}
			snap = n.Catalog.Snapshot()
			f, ok = snap.File(cf.ID)
		}
		if !ok || !f.Live() {
			return fmt.Errorf("server: the checkpoint names file %d, which the catalog does not have live: the catalog is older than the checkpoint; restore the data directory from a backup, or start over with an empty one", cf.ID)
		}
		t, _ := snap.TableByID(f.TableID)
		if int(cf.Replayer) >= len(n.Replayers) {
			return fmt.Errorf("server: file %d belongs to replayer %d, but only %d run: keep the replayer count", cf.ID, cf.Replayer, len(n.Replayers))
		}
		hidden, combined, err := n.settleFile(ctx, t, f, cf)
		if err != nil {
			return err
		}
		if combined {
			rec.Combined++
		}
		vis, err := n.restoredVisibility(m.TS, cf, hidden)
		if err != nil {
			return err
		}
		f, _ = n.Catalog.Snapshot().File(cf.ID)
		if err := n.Replayers[cf.Replayer].AdoptFile(ctx, f, vis); err != nil {
			return fmt.Errorf("server: adopt file %d: %w", f.ID, err)
		}
	}
	if rebuildIndex {
		if err := n.rebuildIndex(ctx, n.Catalog.Snapshot()); err != nil {
			return err
		}
	}
	rec.Duration = time.Since(start)
	n.Recovery = rec
	n.restored = m
	if m.Clean {
		// Writes come next: a later crash must not take the index on disk
		// for the one at c.
		m2 := *m
		m2.Clean, m2.Written = false, time.Time{}
		vis := map[uint64][]byte{}
		for _, f := range m2.Files {
			data, err := n.ckpts.Visibility(f)
			if err != nil {
				return err
			}
			if data != nil {
				vis[f.ID] = data
			}
		}
		if err := n.ckpts.Write(&m2, vis); err != nil {
			return fmt.Errorf("server: %w", err)
		}
	}
	return nil
}

// settleFile makes a file of the checkpoint a regular file of the rows it
// had at c. It returns the rows after those (hidden: a combination after c
// added them) and whether it combined the file's blocks now.
func (n *Node) settleFile(ctx context.Context, t *catalog.Table, f *catalog.File, cf checkpoint.File) (hidden [2]int64, combined bool, err error) {
	switch {
	case !cf.Virtual || f.State != catalog.Virtual:
		// Regular at c, or combined since: its object holds the rows of c
		// first; what follows came later.
		if _, err := n.Lake.Size(ctx, f.Key); err != nil {
			return hidden, false, fmt.Errorf("server: file %d of %s: object %s: %w (the lake lost a file the checkpoint names)", f.ID, t.Name, f.Key, err)
		}
		if f.Rows() < cf.Rows {
			return hidden, false, fmt.Errorf("server: file %d of %s has %d rows, the checkpoint says %d", f.ID, t.Name, f.Rows(), cf.Rows)
		}
		hidden = [2]int64{cf.Rows, f.Rows()}
		return hidden, false, n.deleteBlocks(ctx, f)
	}
	objs, err := n.Lake.List(ctx, writebuffer.BlockPrefix(t.ID, f.ID))
	if err != nil {
		return hidden, false, fmt.Errorf("server: file %d of %s: list its blocks: %w", f.ID, t.Name, err)
	}
	type blk struct {
		key   string
		first uint32
	}
	var blocks []blk
	for _, o := range objs {
		first, ok := writebuffer.BlockFirst(o.Key)
		if ok && int64(first) < cf.Rows {
			blocks = append(blocks, blk{o.Key, first})
		}
	}
	slices.SortFunc(blocks, func(a, b blk) int { return int(a.first) - int(b.first) })
	if len(blocks) == 0 || blocks[0].first != 0 {
		return hidden, false, fmt.Errorf("server: file %d of %s: the checkpoint says its first %d rows are in block objects under %s, and the lake does not have them", f.ID, t.Name, cf.Rows, writebuffer.BlockPrefix(t.ID, f.ID))
	}
	keys := make([]string, len(blocks))
	for i, b := range blocks {
		keys[i] = b.key
	}
	groups, err := writebuffer.CombineBlocks(ctx, n.Lake, lake.FileSchema(writebuffer.Schema(writebuffer.TableColumns(t.Schema))), t.ID, f.ID, keys, writebuffer.CombinedGroupRows(n.Config.BlockRows))
	if err != nil {
		return hidden, false, fmt.Errorf("server: file %d of %s: combine its blocks: %w", f.ID, t.Name, err)
	}
	var rows int64
	for _, g := range groups {
		rows += g.Rows
	}
	if rows != cf.Rows {
		return hidden, false, fmt.Errorf("server: file %d of %s: its blocks hold %d rows, the checkpoint says %d", f.ID, t.Name, rows, cf.Rows)
	}
	if _, err := n.Catalog.SetFileState(ctx, f.ID, catalog.Regular, groups); err != nil {
		return hidden, false, fmt.Errorf("server: file %d of %s: %w", f.ID, t.Name, err)
	}
	return hidden, true, n.deleteBlocks(ctx, f)
}

// restoredVisibility is a file's deleted set at ts from the checkpoint,
// with the rows in hidden deleted too.
func (n *Node) restoredVisibility(ts uint64, cf checkpoint.File, hidden [2]int64) (*visibility.RowGroup, error) {
	data, err := n.ckpts.Visibility(cf)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	cp := visibility.Checkpoint{TS: ts, Rows: cf.Capacity, Bitmap: make([]uint64, (cf.Capacity+63)/64)}
	if data != nil {
		if err := cp.UnmarshalBinary(data); err != nil {
			return nil, fmt.Errorf("server: %s: %w", n.ckpts.VisPath(cf.Vis), err)
		}
		if cp.Rows != cf.Capacity {
			return nil, fmt.Errorf("server: %s covers %d rows, the checkpoint says %d", n.ckpts.VisPath(cf.Vis), cp.Rows, cf.Capacity)
		}
	}
	if hidden[1] > int64(cp.Rows) {
		return nil, fmt.Errorf("server: file %d has %d rows, more than the %d its visibility covers", cf.ID, hidden[1], cp.Rows)
	}
	for o := hidden[0]; o < hidden[1]; o++ {
		cp.Bitmap[o/64] |= 1 << (o % 64)
	}
	return visibility.Restore(cp)
}

// dropFile removes a file the checkpoint does not have: its objects, then
// its catalog entry.
func (n *Node) dropFile(ctx context.Context, f *catalog.File) error {
	if !n.keeps(f.Key) { // else an Iceberg snapshot names it: the publisher deletes it
		if err := n.Lake.Delete(ctx, f.Key); err != nil {
			return fmt.Errorf("server: drop file %d born after the checkpoint: %w", f.ID, err)
		}
	}
	if err := n.deleteBlocks(ctx, f); err != nil {
		return err
	}
	if f.State != catalog.Retired {
		if _, err := n.Catalog.SetFileState(ctx, f.ID, catalog.Retired, nil); err != nil {
			return fmt.Errorf("server: drop file %d born after the checkpoint: %w", f.ID, err)
		}
	}
	if err := n.Catalog.DeleteFile(ctx, f.ID); err != nil {
		return fmt.Errorf("server: drop file %d born after the checkpoint: %w", f.ID, err)
	}
	return nil
}

// sweepGCObjects deletes the objects storage GC wrote for files no catalog
// entry names: a rewrite the process did not live to switch in.
func (n *Node) sweepGCObjects(ctx context.Context) error {
	snap := n.Catalog.Snapshot()
	for _, t := range snap.Tables() {
		named := map[string]bool{}
		for _, f := range snap.Files(t.ID) {
			named[f.Key] = true
		}
		objs, err := n.Lake.List(ctx, replay.GCPrefix(t.ID))
		if err != nil {
			return fmt.Errorf("server: list the storage-GC files of %s: %w", t.Name, err)
		}
		for _, o := range objs {
			if named[o.Key] || n.keeps(o.Key) {
				continue
			}
			if err := n.Lake.Delete(ctx, o.Key); err != nil {
				return fmt.Errorf("server: delete %s, a storage-GC file never switched in: %w", o.Key, err)
			}
		}
	}
	return nil
}

// deleteBlocks removes a file's block objects.
func (n *Node) deleteBlocks(ctx context.Context, f *catalog.File) error {
	objs, err := n.Lake.List(ctx, writebuffer.BlockPrefix(f.TableID, f.ID))
	if err != nil {
		return fmt.Errorf("server: file %d: list its blocks: %w", f.ID, err)
	}
	for _, o := range objs {
		if err := n.Lake.Delete(ctx, o.Key); err != nil {
			return fmt.Errorf("server: file %d: delete block %s: %w", f.ID, o.Key, err)
		}
	}
	return nil
}

// Resume is where source i (uri) resumes: from the restored checkpoint, or
// from its start when the checkpoint has no such source.
func (n *Node) Resume(i int, uri string) (change.Checkpoint, error) {
	m := n.restored
	if m == nil || i >= len(m.Sources) {
		return change.Checkpoint{}, nil
	}
	if m.Sources[i].URI != uri {
		return change.Checkpoint{}, fmt.Errorf("server: source %d was %q when the data directory was last used, now %q: give the sources in the same order", i, m.Sources[i].URI, uri)
	}
	return m.Sources[i].Resume, nil
}

// CheckSources refuses a start that leaves out a source the data directory
// was fed by: its position would be lost with the next checkpoint.
func (n *Node) CheckSources(uris []string) error {
	m := n.restored
	if m == nil || len(uris) >= len(m.Sources) {
		return nil
	}
	var missing []string
	for _, s := range m.Sources[len(uris):] {
		missing = append(missing, s.URI)
	}
	return fmt.Errorf("server: the data directory was also fed by %s: give every source, in the same order", strings.Join(missing, ", "))
}
