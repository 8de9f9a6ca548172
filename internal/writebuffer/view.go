package writebuffer

import (
	"sync"

	"github.com/apache/arrow-go/v18/arrow"

	"github.com/retinadb/retina/internal/visibility"
)

// BlockView is a run of a virtual file's rows that a reader can scan.
type BlockView struct {
	First uint32 // offset of the first row in the file
	Rows  int    // rows in the run
	// Records are the rows in memory, held for the view: a block not yet
	// flushed, or a flushed one the block cache still has; nil otherwise.
	Records []arrow.RecordBatch
	Key     string // lake object of a flushed block (one row group)
}

// FileView is what a reader scans for one file id.
type FileView struct {
	FileID uint64
	// Regular means the file was combined (or the buffer no longer knows
	// it): read the regular object Key from the lake.
	Regular bool
	Key     string
	Vis     *visibility.RowGroup // nil when the buffer no longer knows the file
	Blocks  []BlockView
}

// View is a consistent, reference-counted picture of some virtual files: a
// concurrent flush or combination never makes it miss or double rows, and
// the objects it names stay in the lake until Release.
type View struct {
	Files []FileView
	buf   *Buffer
	held  []*VirtualFile
	once  sync.Once
}

// View captures the given files. Rows appended later are not in it; rows
// appended before are, whether in memory, flushed, or combined.
func (b *Buffer) View(ids ...uint64) *View {
	b.mu.Lock()
	defer b.mu.Unlock()
	v := &View{buf: b}
	cutDone := false
	for _, id := range ids {
		f, ok := b.files[id]
		if !ok {
			v.Files = append(v.Files, FileView{FileID: id, Regular: true, Key: RegularKey(b.cfg.TableID, id)})
			continue
		}
		if f.combined {
			v.Files = append(v.Files, FileView{FileID: id, Regular: true, Key: RegularKey(b.cfg.TableID, id), Vis: f.vis})
			continue
		}
		f.readers++
		v.held = append(v.held, f)
		fv := FileView{FileID: id, Vis: f.vis}
		for _, blk := range f.blocks {
			bv := BlockView{First: blk.first, Rows: blk.rows}
			if blk.segs != nil {
				for _, s := range blk.segs {
					s.Retain()
				}
				bv.Records = append([]arrow.RecordBatch(nil), blk.segs...)
			} else {
				bv.Key = blk.key
				if b.cfg.Cache != nil {
					bv.Records = b.cfg.Cache.retain(blk.cached)
				}
			}
			fv.Blocks = append(fv.Blocks, bv)
		}
		if f == b.cur && b.build.rows > 0 {
			if !cutDone {
				b.build.cut()
				cutDone = true
			}
			bv := BlockView{First: b.build.first, Rows: b.build.rows}
			for _, s := range b.build.segs {
				s.Retain()
				bv.Records = append(bv.Records, s)
			}
			fv.Blocks = append(fv.Blocks, bv)
		}
		v.Files = append(v.Files, fv)
	}
	return v
}

// Release lets go of the view's records and objects. It is idempotent.
func (v *View) Release() {
	v.once.Do(func() {
		for _, fv := range v.Files {
			for _, bv := range fv.Blocks {
				for _, r := range bv.Records {
					r.Release()
				}
			}
		}
		b := v.buf
		b.mu.Lock()
		for _, f := range v.held {
			f.readers--
			b.maybeClean(f)
		}
		b.mu.Unlock()
	})
}
