package server

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/scan"
	"github.com/retinadb/retina/internal/visibility"
	"github.com/retinadb/retina/internal/writebuffer"
)

// rebuildIndex puts every live row of every file into the primary and
// secondary indexes: after a crash the index is the files' (the restart
// path, so files are indexed on every core at once; each key lives in one
// file, so they never race).
func (n *Node) rebuildIndex(ctx context.Context, snap *catalog.Snapshot) error {
	type job struct {
		t  *catalog.Table
		f  *catalog.File
		rp *replay.Replayer
	}
	var jobs []job
	for _, t := range snap.Tables() {
		defined := map[uint32]bool{}
		for _, f := range snap.LiveFiles(t.ID) {
			rp := n.Replayers[f.Replayer]
			if !defined[f.Replayer] {
				if _, err := rp.Buffer(t.ID); err != nil { // defines the table's indexes
					return err
				}
				defined[f.Replayer] = true
			}
			jobs = append(jobs, job{t, f, rp})
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan job)
	errs := make(chan error, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for j := range next {
				if err := n.indexFile(ctx, j.t, j.f, j.rp); err != nil {
					errs <- fmt.Errorf("server: index file %d of %s: %w", j.f.ID, j.t.Name, err)
					cancel()
					return
				}
			}
		})
	}
feed:
	for _, j := range jobs {
		select {
		case next <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs
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
	if err := pf.Widen(writebuffer.Schema(writebuffer.TableColumns(t.Schema))); err != nil {
		return fmt.Errorf("file %d of %s: %w", f.ID, t.Name, err)
	}
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
