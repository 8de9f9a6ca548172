// Package writebuffer holds the newest tuple versions of one table for one
// replayer: an active block of Arrow column builders, immutable blocks
// awaiting flush, and the virtual files they belong to.
//
// A virtual file has a file id registered in the catalog before its first
// row, a fixed capacity, one row group and a visibility structure covering
// that capacity. A row's location (file id, row group 0, offset) is fixed
// when it is appended and never changes: flushed blocks become small lake
// objects, and when a full file's blocks are all flushed they are combined
// into one regular Parquet file under the same file id and the small objects
// are deleted once no reader holds them.
package writebuffer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/visibility"
)

// Catalog is what the buffer needs from the catalog.
type Catalog interface {
	AllocateFileIDs(ctx context.Context, n int) (uint64, error)
	RegisterFile(ctx context.Context, f catalog.File) (*catalog.File, error)
	SetFileState(ctx context.Context, id uint64, state catalog.FileState, groups []lake.RowGroupMeta) (*catalog.File, error)
}

// Lake is what the buffer needs from object storage.
type Lake interface {
	Put(ctx context.Context, key string, data []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
	Delete(ctx context.Context, key string) error
}

// ErrClosed reports use of a closed buffer.
var ErrClosed = errors.New("writebuffer: closed")

// Config configures one table's buffer.
type Config struct {
	TableID  uint32
	Columns  []Column
	Replayer uint32
	Catalog  Catalog
	Lake     Lake
	// BlockRows is the size of a block (default 8192).
	BlockRows int
	// FileBlocks is a virtual file's capacity in blocks (default 128).
	FileBlocks int
	// FlushWorkers upload blocks in parallel (default 4).
	FlushWorkers int
	// MaxUnflushedBytes bounds memory held by blocks not yet durable;
	// Append waits above it (default 256 MiB).
	MaxUnflushedBytes int64
	// OnNewFile runs when a virtual file is created, before its first row,
	// with the buffer locked: register its row-id range and visibility.
	OnNewFile func(*VirtualFile) error
	// TileSize of the files' visibility (default visibility.DefaultTileSize).
	TileSize int
	// Failpoints, when set, can stop the process inside a flush or a
	// combination (crash tests).
	Failpoints *failpoint.Set
	Logger     *slog.Logger
}

// RegularKey is the object key of a table's regular file.
func RegularKey(table uint32, file uint64) string {
	return fmt.Sprintf("t%d/f%d.parquet", table, file)
}

func blockKey(table uint32, file uint64, first uint32) string {
	return fmt.Sprintf("%sb%08d.parquet", BlockPrefix(table, file), first)
}

// BlockPrefix is the object-key prefix of a virtual file's block objects.
func BlockPrefix(table uint32, file uint64) string { return fmt.Sprintf("t%d/v%d/", table, file) }

// BlockFirst reads the offset of a block's first row from its object key.
func BlockFirst(key string) (uint32, bool) {
	i := strings.LastIndexByte(key, '/')
	var first uint32
	if n, err := fmt.Sscanf(key[i+1:], "b%08d.parquet", &first); err != nil || n != 1 || !strings.HasSuffix(key, ".parquet") {
		return 0, false
	}
	return first, true
}

// block is a sealed run of rows of one virtual file.
type block struct {
	file    *VirtualFile
	first   uint32
	rows    int
	segs    []arrow.RecordBatch // in memory until flushed; nil after
	bytes   int64
	key     string // object key once durable
	flying  bool   // a worker is uploading it
	retryAt time.Time
	fails   int
}

// VirtualFile is a file still receiving rows or awaiting combination.
type VirtualFile struct {
	id       uint64
	capacity int
	vis      *visibility.RowGroup

	// Guarded by the buffer's mutex.
	blocks    []*block
	rows      int
	sealed    bool
	combining bool
	combined  bool
	readers   int
	cleaned   bool
}

// ID is the file id.
func (f *VirtualFile) ID() uint64 { return f.id }

// Capacity is the most rows the file holds.
func (f *VirtualFile) Capacity() int { return f.capacity }

// Visibility is the file's row-group visibility.
func (f *VirtualFile) Visibility() *visibility.RowGroup { return f.vis }

// Run is a contiguous range of appended rows in one virtual file.
type Run struct {
	File  *VirtualFile
	First uint32
	N     int
}

// Stats describe the buffer now.
type Stats struct {
	MemoryBytes    int64 // Arrow memory of blocks held in memory, active included
	UnflushedBytes int64
	Blocks         int // blocks in memory
	Flushed        uint64
	Combined       uint64
	FlushErrors    uint64
	LastFlushError string
	VirtualFiles   int
}

// Buffer is one table's write buffer. Append may be called concurrently.
type Buffer struct {
	cfg    Config
	schema *arrow.Schema // FileSchema: columns + create_ts
	apps   []appender
	log    *slog.Logger

	mu          sync.Mutex
	work        *sync.Cond // flush workers and waiting appenders
	cur         *VirtualFile
	builder     *array.RecordBuilder
	activeFirst uint32
	activeRows  int
	activeSegs  []arrow.RecordBatch // cuts of the active block taken by views
	files       map[uint64]*VirtualFile
	queue       []*block // sealed blocks not yet durable, in order
	unflushed   int64
	stats       Stats
	flushed     chan struct{} // closed (and replaced) whenever a block becomes durable
	closed      bool
	bg          sync.WaitGroup
	stop        chan struct{}
}

// New starts a buffer and its flush workers.
func New(cfg Config) (*Buffer, error) {
	if cfg.BlockRows <= 0 {
		cfg.BlockRows = 8192
	}
	if cfg.FileBlocks <= 0 {
		cfg.FileBlocks = 128
	}
	if cfg.FlushWorkers <= 0 {
		cfg.FlushWorkers = 4
	}
	if cfg.MaxUnflushedBytes <= 0 {
		cfg.MaxUnflushedBytes = 256 << 20
	}
	if cfg.TileSize == 0 {
		cfg.TileSize = visibility.DefaultTileSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Catalog == nil || cfg.Lake == nil || len(cfg.Columns) == 0 {
		return nil, fmt.Errorf("writebuffer: table %d: catalog, lake and columns are required", cfg.TableID)
	}
	if cap := int64(cfg.BlockRows) * int64(cfg.FileBlocks); cap >= 1<<32 {
		return nil, fmt.Errorf("writebuffer: file capacity %d rows exceeds 2^32", cap)
	}
	b := &Buffer{
		cfg:     cfg,
		schema:  lake.FileSchema(Schema(cfg.Columns)),
		log:     cfg.Logger.With("table", cfg.TableID),
		files:   map[uint64]*VirtualFile{},
		stop:    make(chan struct{}),
		flushed: make(chan struct{}),
	}
	for _, c := range cfg.Columns {
		b.apps = append(b.apps, appenderFor(c.Type))
	}
	b.work = sync.NewCond(&b.mu)
	b.builder = array.NewRecordBuilder(memory.DefaultAllocator, b.schema)
	for range cfg.FlushWorkers {
		b.bg.Go(b.flushWorker)
	}
	b.bg.Go(b.ticker)
	return b, nil
}

// ticker wakes workers so failed uploads are retried after their backoff.
func (b *Buffer) ticker() {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.mu.Lock()
			b.work.Broadcast()
			b.mu.Unlock()
		}
	}
}

// Append adds rows written by the mirror transaction ts and returns where
// they went: consecutive runs, split only where a file fills up. Rows are
// checked first; a bad row fails the call with nothing appended.
func (b *Buffer) Append(ctx context.Context, ts uint64, rows [][]any) ([]Run, error) {
	for i, r := range rows {
		if err := CheckRow(b.cfg.Columns, r); err != nil {
			return nil, fmt.Errorf("writebuffer: table %d row %d: %w", b.cfg.TableID, i, err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.unflushed > b.cfg.MaxUnflushedBytes && !b.closed {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b.work.Wait() // back-pressure: the lake is behind
	}
	if b.closed {
		return nil, ErrClosed
	}
	var runs []Run
	for done := 0; done < len(rows); {
		if b.cur == nil || b.cur.rows == b.cur.capacity {
			if err := b.newFile(ctx); err != nil {
				return runs, err
			}
		}
		f := b.cur
		n := min(len(rows)-done, f.capacity-f.rows, b.cfg.BlockRows-b.activeRows)
		for _, row := range rows[done : done+n] {
			for c, v := range row {
				if v == nil {
					b.builder.Field(c).AppendNull()
				} else {
					b.apps[c](b.builder.Field(c), v)
				}
			}
			b.builder.Field(len(row)).(*array.Int64Builder).Append(int64(ts))
		}
		if k := len(runs); k > 0 && runs[k-1].File == f {
			runs[k-1].N += n
		} else {
			runs = append(runs, Run{File: f, First: uint32(f.rows), N: n})
		}
		f.rows += n
		b.activeRows += n
		done += n
		if b.activeRows == b.cfg.BlockRows || f.rows == f.capacity {
			b.sealActive()
		}
		if f.rows == f.capacity {
			f.sealed = true
		}
	}
	return runs, nil
}

// newFile registers the next virtual file. Called with mu held: appends
// wait for one catalog write every capacity rows.
func (b *Buffer) newFile(ctx context.Context) error {
	id, err := b.cfg.Catalog.AllocateFileIDs(ctx, 1)
	if err != nil {
		return fmt.Errorf("writebuffer: allocate file id: %w", err)
	}
	_, err = b.cfg.Catalog.RegisterFile(ctx, catalog.File{
		ID: id, TableID: b.cfg.TableID, Key: RegularKey(b.cfg.TableID, id),
		State: catalog.Virtual, Replayer: b.cfg.Replayer,
	})
	if err != nil {
		return fmt.Errorf("writebuffer: register virtual file %d: %w", id, err)
	}
	capacity := b.cfg.BlockRows * b.cfg.FileBlocks
	vis, err := visibility.NewRowGroup(capacity, visibility.WithTileSize(b.cfg.TileSize))
	if err != nil {
		return err
	}
	f := &VirtualFile{id: id, capacity: capacity, vis: vis}
	if b.cfg.OnNewFile != nil {
		if err := b.cfg.OnNewFile(f); err != nil {
			return fmt.Errorf("writebuffer: new file %d: %w", id, err)
		}
	}
	if b.cur != nil {
		b.cur.sealed = true
		b.maybeCombine(b.cur)
	}
	b.cur = f
	b.files[id] = f
	b.activeFirst = 0
	return nil
}

// cutActive moves the rows appended since the last cut into a record, so a
// reader can hold them while appends continue. Called with mu held.
func (b *Buffer) cutActive() {
	if b.builder.Field(0).Len() == 0 {
		return
	}
	b.activeSegs = append(b.activeSegs, b.builder.NewRecordBatch())
}

// sealActive turns the active block immutable and queues it for flushing.
func (b *Buffer) sealActive() {
	b.cutActive()
	if b.activeRows == 0 {
		return
	}
	blk := &block{file: b.cur, first: b.activeFirst, rows: b.activeRows, segs: b.activeSegs}
	for _, s := range blk.segs {
		blk.bytes += recordBytes(s)
	}
	b.cur.blocks = append(b.cur.blocks, blk)
	b.queue = append(b.queue, blk)
	b.unflushed += blk.bytes
	b.activeFirst += uint32(b.activeRows)
	b.activeRows = 0
	b.activeSegs = nil
	b.work.Broadcast()
}

func recordBytes(r arrow.RecordBatch) int64 {
	var n int64
	for _, c := range r.Columns() {
		for _, buf := range c.Data().Buffers() {
			if buf != nil {
				n += int64(buf.Len())
			}
		}
	}
	return n
}

// flushWorker uploads queued blocks; a failed upload is retried with
// backoff without holding up the blocks behind it.
func (b *Buffer) flushWorker() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if b.closed {
			return // Close flushed what it could; anything left stays in memory
		}
		blk := b.nextToFlush()
		if blk == nil {
			b.work.Wait()
			continue
		}
		blk.flying = true
		b.mu.Unlock()
		key := blockKey(b.cfg.TableID, blk.file.id, blk.first)
		b.cfg.Failpoints.Hit(failpoint.FlushBeforeUpload)
		err := b.upload(key, blk.segs, int64(blk.rows))
		if err == nil {
			b.cfg.Failpoints.Hit(failpoint.FlushAfterUpload)
		}
		b.mu.Lock()
		blk.flying = false
		if err != nil {
			blk.fails++
			blk.retryAt = time.Now().Add(min(time.Duration(1<<min(blk.fails, 10))*50*time.Millisecond, 30*time.Second))
			b.stats.FlushErrors++
			b.stats.LastFlushError = err.Error()
			b.log.Warn("block flush failed; will retry", "file", blk.file.id, "first", blk.first, "attempt", blk.fails, "err", err)
			continue
		}
		blk.key = key
		for _, s := range blk.segs {
			s.Release() // views hold their own references
		}
		blk.segs = nil
		b.unflushed -= blk.bytes
		b.stats.Flushed++
		close(b.flushed)
		b.flushed = make(chan struct{})
		b.dequeue(blk)
		b.maybeCombine(blk.file)
		b.work.Broadcast()
	}
}

// nextToFlush picks the oldest queued block that is due. Called with mu.
func (b *Buffer) nextToFlush() *block {
	now := time.Now()
	for _, blk := range b.queue {
		if !blk.flying && !now.Before(blk.retryAt) {
			return blk
		}
	}
	return nil
}

func (b *Buffer) dequeue(blk *block) {
	for i, x := range b.queue {
		if x == blk {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return
		}
	}
}

// upload writes records as one Retina Parquet object of one row group.
// Block objects live only until combination, so they are written for speed
// (snappy, no dictionaries); the combined file gets zstd and dictionaries.
func (b *Buffer) upload(key string, recs []arrow.RecordBatch, rows int64) error {
	var buf bytes.Buffer
	for _, r := range recs {
		buf.Grow(int(recordBytes(r)))
	}
	w, err := lake.NewFileWriter(&buf, b.schema, lake.WriterOptions{RowGroupRows: max(rows, 1), Codec: "snappy", PlainStrings: true})
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			return err
		}
	}
	if _, err := w.Close(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return b.cfg.Lake.Put(ctx, key, buf.Bytes())
}

// maybeCombine starts combination of a sealed file whose blocks are all
// durable. Called with mu held.
func (b *Buffer) maybeCombine(f *VirtualFile) {
	if !f.sealed || f.combining || f.combined || f == b.cur && b.activeRows > 0 {
		return
	}
	for _, blk := range f.blocks {
		if blk.key == "" {
			return
		}
	}
	f.combining = true
	keys := make([]string, len(f.blocks))
	for i, blk := range f.blocks {
		keys[i] = blk.key
	}
	b.bg.Go(func() { b.combine(f, keys) })
}

// combine writes a sealed file's blocks as one regular file with one row
// group under the same id, marks it regular in the catalog, and deletes the
// small objects once no reader holds the file.
func (b *Buffer) combine(f *VirtualFile, keys []string) {
	ctx := context.Background()
	for attempt := 1; ; attempt++ {
		groups, err := CombineBlocks(ctx, b.cfg.Lake, b.schema, b.cfg.TableID, f.id, keys, int64(f.capacity))
		if err == nil {
			b.cfg.Failpoints.Hit(failpoint.CombineBeforeCatalog)
			_, err = b.cfg.Catalog.SetFileState(ctx, f.id, catalog.Regular, groups)
		}
		if err == nil {
			b.cfg.Failpoints.Hit(failpoint.CombineAfterCatalog)
			break
		}
		b.mu.Lock()
		b.stats.FlushErrors++
		b.stats.LastFlushError = err.Error()
		closed := b.closed
		b.mu.Unlock()
		b.log.Warn("combination failed; will retry", "file", f.id, "attempt", attempt, "err", err)
		if closed && attempt >= 3 {
			b.mu.Lock()
			f.combining = false
			b.mu.Unlock()
			return
		}
		time.Sleep(min(time.Duration(attempt)*100*time.Millisecond, 5*time.Second))
	}
	b.mu.Lock()
	f.combining = false
	f.combined = true
	b.stats.Combined++
	b.maybeClean(f)
	b.mu.Unlock()
}

// CombineBlocks writes block objects, in order, as one regular file with
// row groups of up to groupRows rows under the file's regular key, and
// returns its row groups. The blocks stay; the caller deletes them once the
// catalog names the regular file.
func CombineBlocks(ctx context.Context, l Lake, schema *arrow.Schema, table uint32, file uint64, keys []string, groupRows int64) ([]lake.RowGroupMeta, error) {
	blocks := make([][]byte, len(keys))
	size := 0
	for i, key := range keys {
		data, err := l.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		blocks[i] = data
		size += len(data)
	}
	var buf bytes.Buffer
	buf.Grow(size) // zstd output is smaller than the snappy blocks
	w, err := lake.NewFileWriter(&buf, schema, lake.WriterOptions{RowGroupRows: groupRows})
	if err != nil {
		return nil, err
	}
	for i, key := range keys {
		if err := copyBlock(ctx, w, key, blocks[i]); err != nil {
			return nil, err
		}
	}
	groups, err := w.Close()
	if err != nil {
		return nil, err
	}
	if err := l.Put(ctx, RegularKey(table, file), buf.Bytes()); err != nil {
		return nil, err
	}
	return groups, nil
}

// copyBlock appends every row of one block object to w.
func copyBlock(ctx context.Context, w *lake.FileWriter, key string, data []byte) error {
	pf, err := lake.OpenFile(bytes.NewReader(data), nil)
	if err != nil {
		return fmt.Errorf("block %s: %w", key, err)
	}
	defer pf.Close()
	all := make([]int, pf.Schema().NumFields())
	for i := range all {
		all[i] = i
	}
	for g := range pf.RowGroups() {
		rec, err := pf.ReadRowGroup(ctx, g, all, true)
		if err != nil {
			return fmt.Errorf("block %s: %w", key, err)
		}
		err = w.Write(rec)
		rec.Release()
		if err != nil {
			return err
		}
	}
	return nil
}

// maybeClean deletes a combined file's small objects once no view holds
// them. Called with mu held.
func (b *Buffer) maybeClean(f *VirtualFile) {
	if !f.combined || f.readers > 0 || f.cleaned {
		return
	}
	f.cleaned = true
	delete(b.files, f.id)
	keys := make([]string, 0, len(f.blocks))
	for _, blk := range f.blocks {
		keys = append(keys, blk.key)
	}
	f.blocks = nil
	b.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, k := range keys {
			if err := b.cfg.Lake.Delete(ctx, k); err != nil {
				b.log.Warn("deleting a combined block failed; the object is orphaned", "key", k, "err", err)
			}
		}
	})
}

// sealCurrent ends the file receiving rows where it is: it is combined once
// its blocks are durable, and the next append starts a new file. Called
// with mu held and cur set.
func (b *Buffer) sealCurrent() {
	f := b.cur
	b.sealActive()
	f.sealed = true
	b.cur = nil
	b.maybeCombine(f)
}

// Filling names the virtual file receiving rows and how many it has.
func (b *Buffer) Filling() (id uint64, rows int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur == nil {
		return 0, 0, false
	}
	return b.cur.id, b.cur.rows, true
}

// SealFile ends the virtual file id before it is full, if it still receives
// rows: storage GC does this to a file whose rows went stale while it
// filled, so it becomes a regular file GC can rewrite. Its rows keep their
// locations; the next append starts a new file. It reports whether it
// sealed the file.
func (b *Buffer) SealFile(id uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur == nil || b.cur.id != id || b.cur.rows == 0 {
		return false
	}
	b.sealCurrent()
	return true
}

// Flush seals the active block and waits until every block is durable and
// every full file combined.
func (b *Buffer) Flush(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur != nil {
		b.sealActive()
		b.maybeCombine(b.cur)
	}
	for {
		busy := len(b.queue) > 0
		for _, f := range b.files {
			busy = busy || f.combining
		}
		if !busy {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		b.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		b.mu.Lock()
	}
}

// Finish seals the file receiving rows even if it is not full, and waits
// until every block is durable and every file combined into a regular file:
// nothing of the table is left virtual (a clean shutdown calls it, so a
// restart finds only regular files). Later appends start a new file.
func (b *Buffer) Finish(ctx context.Context) error {
	b.mu.Lock()
	if b.cur != nil {
		b.sealCurrent()
	}
	b.mu.Unlock()
	if err := b.Flush(ctx); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range b.files {
		if !f.combined {
			return fmt.Errorf("writebuffer: table %d file %d could not be combined (last error: %s)", b.cfg.TableID, f.id, b.stats.LastFlushError)
		}
	}
	return nil
}

// Close flushes what it can within ctx and stops the workers. Files not
// full stay virtual: their blocks are durable in the lake.
func (b *Buffer) Close(ctx context.Context) error {
	err := b.Flush(ctx)
	b.mu.Lock()
	b.closed = true
	b.work.Broadcast()
	close(b.flushed)
	b.flushed = make(chan struct{})
	b.mu.Unlock()
	close(b.stop)
	b.bg.Wait()
	b.mu.Lock()
	b.builder.Release()
	b.mu.Unlock()
	return err
}

// Stats reports memory and flush counters.
func (b *Buffer) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.stats
	st.UnflushedBytes = b.unflushed
	st.VirtualFiles = len(b.files)
	for _, f := range b.files {
		for _, blk := range f.blocks {
			if blk.segs != nil {
				st.Blocks++
				st.MemoryBytes += blk.bytes
			}
		}
	}
	for _, s := range b.activeSegs {
		st.MemoryBytes += recordBytes(s)
	}
	if !b.closed {
		// The builders' capacity is roughly one block's worth of values.
		st.MemoryBytes += int64(b.builder.Field(0).Cap()) * int64(len(b.cfg.Columns)+1) * 8
	}
	return st
}
