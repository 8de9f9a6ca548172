package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/durable"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/scan"
	"github.com/retinadb/retina/internal/visibility"
)

// Persisted state of a clean shutdown, in the data directory:
//
//	visibility/<file id>.vis   each file's deletes (checkpoint encoding)
//	sink-<n>.json              each source's resume point
//
// The catalog, the transaction store and (with Pebble) the index persist
// themselves. A clean shutdown makes every file regular first, so a restart
// adopts regular files only.

func (n *Node) visDir() string { return filepath.Join(n.Config.DataDir, "visibility") }

// SaveVisibility writes every owned file's deleted set at ts.
func (n *Node) SaveVisibility(ts uint64) error {
	if err := os.MkdirAll(n.visDir(), 0o755); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, rp := range n.Replayers {
		for _, id := range rp.Files() {
			vis, _ := rp.FileVisibility(id)
			cp, err := vis.Checkpoint(ts)
			if err != nil {
				return fmt.Errorf("server: visibility of file %d: %w", id, err)
			}
			data, err := cp.MarshalBinary()
			if err != nil {
				return err
			}
			name := strconv.FormatUint(id, 10) + ".vis"
			if err := durable.WriteFile(filepath.Join(n.visDir(), name), data); err != nil {
				return err
			}
			keep[name] = true
		}
	}
	entries, err := os.ReadDir(n.visDir())
	if err != nil {
		return err
	}
	for _, e := range entries { // files dropped since the last save
		if strings.HasSuffix(e.Name(), ".vis") && !keep[e.Name()] {
			os.Remove(filepath.Join(n.visDir(), e.Name()))
		}
	}
	return nil
}

// restore gives each replayer its files back with their deletes, and
// rebuilds an in-memory index from the files.
func (n *Node) restore(ctx context.Context) error {
	snap := n.Catalog.Snapshot()
	restored := 0
	for _, t := range snap.Tables() {
		for _, f := range snap.LiveFiles(t.ID) {
			if f.State == catalog.Virtual {
				return fmt.Errorf("server: file %d of %s is still virtual: the last shutdown was not clean (crash recovery from a replay checkpoint is not implemented yet; restore the data directory from a clean stop)", f.ID, t.Name)
			}
			if int(f.Replayer) >= len(n.Replayers) {
				return fmt.Errorf("server: file %d belongs to replayer %d, but only %d run: keep the replayer count", f.ID, f.Replayer, len(n.Replayers))
			}
			vis, err := n.loadVisibility(f.ID)
			if err != nil {
				return err
			}
			if err := n.Replayers[f.Replayer].AdoptFile(ctx, f, vis); err != nil {
				return fmt.Errorf("server: adopt file %d: %w", f.ID, err)
			}
			restored++
		}
	}
	if restored > 0 && n.Config.IndexBackend == "memory" {
		return n.rebuildIndex(ctx, snap)
	}
	return nil
}

func (n *Node) loadVisibility(file uint64) (*visibility.RowGroup, error) {
	data, err := os.ReadFile(filepath.Join(n.visDir(), strconv.FormatUint(file, 10)+".vis"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // never had deletes recorded: none
	}
	if err != nil {
		return nil, err
	}
	var cp visibility.Checkpoint
	if err := cp.UnmarshalBinary(data); err != nil {
		return nil, fmt.Errorf("server: visibility of file %d: %w", file, err)
	}
	return visibility.Restore(cp)
}

// rebuildIndex puts every live row of every file into the (in-memory)
// primary and secondary indexes: the memory backend's durability is the
// lake itself.
func (n *Node) rebuildIndex(ctx context.Context, snap *catalog.Snapshot) error {
	for _, t := range snap.Tables() {
		owner := map[uint32]*replay.Replayer{}
		for _, f := range snap.LiveFiles(t.ID) {
			rp := n.Replayers[f.Replayer]
			if owner[f.Replayer] == nil {
				if _, err := rp.Buffer(t.ID); err != nil { // defines the table's indexes
					return err
				}
				owner[f.Replayer] = rp
			}
			if err := n.indexFile(ctx, t, f, rp); err != nil {
				return fmt.Errorf("server: index file %d of %s: %w", f.ID, t.Name, err)
			}
		}
	}
	return nil
}

type indexCols struct {
	id     uint32
	cols   []int
	unique bool
}

func (n *Node) indexFile(ctx context.Context, t *catalog.Table, f *catalog.File, rp *replay.Replayer) error {
	idxs := []indexCols{{id: t.PrimaryIndexID, cols: t.Schema.KeyColumns(), unique: true}}
	for _, ix := range t.Schema.Indexes {
		c := indexCols{id: ix.ID, unique: ix.Unique}
		for _, name := range ix.Columns {
			c.cols = append(c.cols, t.Schema.ColumnIndex(name))
		}
		idxs = append(idxs, c)
	}
	var need []int // the columns to read, and where each index finds its own
	pos := map[int]int{}
	for _, ix := range idxs {
		for _, c := range ix.cols {
			if _, ok := pos[c]; !ok {
				pos[c] = len(need)
				need = append(need, c)
			}
		}
	}
	vis, _ := rp.FileVisibility(f.ID)
	r, err := n.Lake.ReaderAt(ctx, f.Key)
	if err != nil {
		return err
	}
	pf, err := lake.OpenFile(r, nil)
	if err != nil {
		return err
	}
	defer pf.Close()
	var deleted []uint64
	if vis != nil {
		deleted = make([]uint64, vis.BitmapWords())
		if err := vis.Bitmap(visibility.MaxTimestamp, deleted); err != nil {
			return err
		}
	}
	var b index.Batch
	offset := 0
	for g, meta := range pf.RowGroups() {
		rec, err := pf.ReadRowGroup(ctx, g, need, true)
		if err != nil {
			return err
		}
		ts := rec.Column(len(need)).(*array.Int64)
		for i := range int(rec.NumRows()) {
			o := offset + i
			if deleted != nil && deleted[o/64]>>(o%64)&1 == 1 {
				continue
			}
			for _, ix := range idxs {
				vals := make([]any, len(ix.cols))
				for k, c := range ix.cols {
					if vals[k], err = scan.Value(rec.Column(pos[c]), i); err != nil {
						rec.Release()
						return err
					}
				}
				key, err := n.Index.Key(ix.id, vals...)
				if err != nil {
					rec.Release()
					return err
				}
				b.Put(key, uint64(ts.Value(i)), replay.RowID(f.ID, uint32(o)))
			}
			if b.Len() >= 8192 {
				if err := n.Index.Apply(ctx, &b); err != nil {
					rec.Release()
					return err
				}
				b.Reset()
			}
		}
		offset += int(meta.Rows)
		rec.Release()
	}
	return n.Index.Apply(ctx, &b)
}
