package lake

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"golang.org/x/sync/errgroup"
)

// Point reads: one row of a file, for a primary-key lookup. Files carry an
// offset index per column chunk (the first row and byte range of every
// page), so a point read fetches, for each projected column, the page that
// holds the row and the column's dictionary page, all at once and in
// parallel (a local file: reads them where it is mapped), and decodes only
// those. A scan never reads this way.

// pointReadBuffer is how much the Parquet reader reads at a page's start
// (its header, and its body when that fits), and so the least a point read
// fetches of each page.
const pointReadBuffer = 16 << 10

// pointReadFetches bounds a point read's parallel range reads.
const pointReadFetches = 8

// ReadRow reads one row, by its position in the file, of the projected
// table columns (as ReadRowGroup does, without create_ts). A file without
// an offset index is read page header by page header up to the row.
func (f *File) ReadRow(ctx context.Context, row int64, cols []int) (arrow.RecordBatch, error) {
	rg, within := -1, row
	for g, meta := range f.groups {
		if within < meta.Rows {
			rg = g
			break
		}
		within -= meta.Rows
	}
	if row < 0 || rg < 0 {
		return nil, fmt.Errorf("lake: row %d of a file of %d rows", row, row-within)
	}
	idx, missing, err := f.leaves(cols, false)
	if err != nil {
		return nil, err
	}
	var rec arrow.RecordBatch
	if len(idx) == 0 {
		rec = array.NewRecordBatch(arrow.NewSchema(nil, nil), nil, 1)
	} else if rec, err = f.readRow(ctx, rg, within, idx); err != nil {
		return nil, fmt.Errorf("lake: read row %d (row group %d): %w", row, rg, err)
	}
	if !missing {
		return rec, nil
	}
	defer rec.Release()
	return f.withAdded(rec, cols, false), nil
}

// readRow reads row within of row group rg, Parquet columns idx.
func (f *File) readRow(ctx context.Context, rg int, within int64, idx []int) (arrow.RecordBatch, error) {
	// A reader of its own over the same footer: it streams column chunks
	// (a scan's reader fetches each whole) and decodes batches of one row.
	// A local file is read where it is mapped (mapped.go); from any other
	// store the pages the row needs are fetched up front, in parallel.
	var src parquet.ReaderAtSeeker = f.src
	fetching := !isLocal(f.src)
	if fetching {
		src = &pointSource{src: f.src}
	}
	arena := &pointArena{}
	defer arena.release()
	props := parquet.NewReaderProperties(arena)
	props.BufferedStreamEnabled = true
	props.BufferSize = pointReadBuffer
	pf, err := file.NewParquetReader(src, file.WithReadProps(props), file.WithMetadata(f.pf.MetaData()))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	// Not closed: closing would close f's source, which it shares.
	if fetching {
		spans, err := pageSpans(pf, rg, within, idx)
		if err != nil {
			return nil, fmt.Errorf("offset index: %w", err) // a read's error or a bad index
		}
		if err := src.(*pointSource).fetch(ctx, spans); err != nil {
			return nil, err
		}
	}
	// The columns seek and decode in parallel: a lookup waits for all of
	// them, and decoding their pages is most of its time.
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{BatchSize: 1, Parallel: true}, arena)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	rr, err := fr.GetRecordReader(ctx, idx, []int{rg})
	if err != nil {
		return nil, err
	}
	defer rr.Release()
	if err := rr.SeekToRow(within); err != nil {
		return nil, fmt.Errorf("seek: %w", err)
	}
	rec, err := rr.Read() // owned by rr
	if err != nil {
		return nil, err
	}
	if rec.NumRows() != 1 {
		return nil, fmt.Errorf("%w: a batch of one row at the row held %d", ErrBadFile, rec.NumRows())
	}
	// rec is in the arena's buffers (and owned by rr): the caller gets a copy.
	out, err := copyRow(rec, f.mem)
	if err != nil {
		return nil, fmt.Errorf("copy the row: %w", err)
	}
	return out, nil
}

// span is a byte range of a file.
type span struct{ off, end int64 }

// pageSpans lists what a read of row within of row group rg needs of
// columns idx: the page holding the row and the dictionary page, each at
// least pointReadBuffer long, within its column chunk. Without an offset
// index it lists nothing.
func pageSpans(pf *file.Reader, rg int, within int64, idx []int) ([]span, error) {
	rgIndex, err := pf.GetPageIndexReader().RowGroup(rg)
	if err != nil || rgIndex == nil {
		return nil, err
	}
	md := pf.MetaData().RowGroup(rg)
	var spans []span
	for _, c := range idx {
		cc, err := md.ColumnChunk(c)
		if err != nil {
			return nil, err
		}
		oi, err := rgIndex.GetOffsetIndex(c)
		if err != nil {
			return nil, err
		}
		if oi == nil {
			continue
		}
		locs := oi.GetPageLocations()
		p := sort.Search(len(locs), func(i int) bool { return locs[i].FirstRowIndex > within }) - 1
		if p < 0 {
			continue
		}
		start := cc.DataPageOffset()
		dict := cc.HasDictionaryPage() && cc.DictionaryPageOffset() > 0
		if dict {
			start = min(start, cc.DictionaryPageOffset())
		}
		end := start + cc.TotalCompressedSize()
		at := locs[p].Offset
		// And a buffer's worth after it: the reader looks at the next
		// page's header once it has the row.
		spans = append(spans, span{at, min(end, at+max(int64(locs[p].CompressedPageSize), pointReadBuffer)+pointReadBuffer)})
		if d := cc.DictionaryPageOffset(); dict && d < locs[0].Offset {
			spans = append(spans, span{d, min(end, d+max(locs[0].Offset-d, pointReadBuffer))})
		}
	}
	return spans, nil
}

// pointSource is a file as one point read sees it: the spans it fetched
// up front and every read it made (each column's reader reads the row
// group's offset indexes again) are answered from memory.
type pointSource struct {
	src  parquet.ReaderAtSeeker
	mu   sync.Mutex
	have []fetched
}

type fetched struct {
	off  int64
	data []byte
}

// fetch reads spans, in parallel where each read waits for a remote store.
func (p *pointSource) fetch(ctx context.Context, spans []span) error {
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(pointReadFetches)
	for _, s := range spans {
		g.Go(func() error {
			buf := make([]byte, s.end-s.off)
			n, err := p.src.ReadAt(buf, s.off)
			if n < len(buf) {
				return fmt.Errorf("read %d bytes at %d: %w", len(buf), s.off, err)
			}
			p.keep(s.off, buf)
			return nil
		})
	}
	return g.Wait()
}

func (p *pointSource) keep(off int64, data []byte) {
	p.mu.Lock()
	p.have = append(p.have, fetched{off, data})
	p.mu.Unlock()
}

func (p *pointSource) ReadAt(b []byte, off int64) (int, error) {
	p.mu.Lock()
	for _, h := range p.have {
		if off >= h.off && off+int64(len(b)) <= h.off+int64(len(h.data)) {
			n := copy(b, h.data[off-h.off:])
			p.mu.Unlock()
			return n, nil
		}
	}
	p.mu.Unlock()
	n, err := p.src.ReadAt(b, off)
	if err == nil {
		p.keep(off, append([]byte(nil), b[:n]...))
	}
	return n, err
}

func (p *pointSource) Seek(offset int64, whence int) (int64, error) {
	return p.src.Seek(offset, whence)
}

// tailBytes is how much of a file's end one read fetches when it is
// opened: its footer and the offset indexes before it (for a dozen
// columns, a few KiB per row group).
const tailBytes = 128 << 10

// tailReader answers reads of a file's last tailBytes from one read of
// them, made at the first such read: opening a file reads its last eight
// bytes, then its footer, then a point read its offset indexes, each a
// request to the object store otherwise.
type tailReader struct {
	src  parquet.ReaderAtSeeker
	size int64
	once sync.Once
	tail []byte // nil if the tail read failed: reads go to src
}

func newTailReader(src parquet.ReaderAtSeeker) (*tailReader, error) {
	size, err := src.Seek(0, io.SeekEnd)
	if err == nil {
		_, err = src.Seek(0, io.SeekStart)
	}
	if err != nil {
		return nil, fmt.Errorf("lake: size of a file: %w", err)
	}
	return &tailReader{src: src, size: size}, nil
}

func (t *tailReader) ReadAt(p []byte, off int64) (int, error) {
	start := max(0, t.size-tailBytes)
	if off < start || off+int64(len(p)) > t.size {
		return t.src.ReadAt(p, off)
	}
	t.once.Do(func() {
		buf := make([]byte, t.size-start)
		if n, _ := t.src.ReadAt(buf, start); n < len(buf) {
			return
		}
		t.tail = buf
	})
	if t.tail == nil {
		return t.src.ReadAt(p, off) // as asked, for its own error
	}
	return copy(p, t.tail[off-start:]), nil
}

// Local reports a source on local disk.
func (t *tailReader) Local() bool { return isLocal(t.src) }

// isLocal reports a source whose reads are local file reads.
func isLocal(src any) bool {
	l, ok := src.(interface{ Local() bool })
	return ok && l.Local()
}

func (t *tailReader) Seek(offset int64, whence int) (int64, error) {
	return t.src.Seek(offset, whence)
}
