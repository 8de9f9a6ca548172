package writebuffer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/apache/arrow-go/v18/arrow"

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

// Lake is what the buffer needs from object storage. Put, Get and Delete
// retry transient failures by the lake's policy; the buffer paces its own
// retries of a whole job by the same policy.
type Lake interface {
	Put(ctx context.Context, key string, data []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
	Delete(ctx context.Context, key string) error
	Retry() lake.RetryPolicy
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
	// OnNewFile runs when a virtual file is created, before its first row
	// (without the buffer's lock; appends wait for it): register its row-id
	// range and visibility.
	OnNewFile func(*VirtualFile) error
	// Cache, when set, keeps flushed blocks decoded in memory for scans
	// (shared by a node's buffers).
	Cache *BlockCache
	// Combines, when set, bounds the combinations running at once across
	// the buffers sharing it (nil: each buffer combines when it can).
	Combines *CombineLimit
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
	return fmt.Sprintf("%sb%08d%s", BlockPrefix(table, file), first, lake.BlockSuffix)
}

// BlockPrefix is the object-key prefix of a virtual file's block objects.
func BlockPrefix(table uint32, file uint64) string { return fmt.Sprintf("t%d/v%d/", table, file) }

// BlockFirst reads the offset of a block's first row from its object key:
// b<first, 8 digits> then ".arrow", or ".parquet" for blocks flushed by
// earlier versions.
func BlockFirst(key string) (uint32, bool) {
	name := key[strings.LastIndexByte(key, '/')+1:]
	for _, suffix := range []string{lake.BlockSuffix, ".parquet"} {
		digits, ok := strings.CutSuffix(name, suffix)
		if !ok || len(digits) < 9 || digits[0] != 'b' {
			continue
		}
		first, err := strconv.ParseUint(digits[1:], 10, 32)
		if err != nil {
			return 0, false
		}
		return uint32(first), true
	}
	return 0, false
}

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
	retry  lake.RetryPolicy
	log    *slog.Logger

	alloc sync.Mutex // held by the appender registering the next file; taken before mu, never under it

	mu        sync.Mutex // the state below; never held across I/O
	build     *blockBuilder
	narrowest int // columns the table had at the buffer's start: shorter rows are bad
	cur       *VirtualFile
	files     map[uint64]*VirtualFile
	queue     []*block // sealed blocks not yet durable, in order
	unflushed int64
	stats     Stats
	changed   chan struct{} // closed (and replaced) on every change a waiter may wait for
	closed    bool
	bg        sync.WaitGroup
	// combinedSize is the size of the last file combined, the estimate
	// for the next one's encoding buffer.
	combinedSize atomic.Int64
}

// Defaults of Config: rows per block, blocks per file.
const (
	DefaultBlockRows  = 8192
	DefaultFileBlocks = 128
)

// New starts a buffer and its flush workers.
func New(cfg Config) (*Buffer, error) {
	if cfg.BlockRows <= 0 {
		cfg.BlockRows = DefaultBlockRows
	}
	if cfg.FileBlocks <= 0 {
		cfg.FileBlocks = DefaultFileBlocks
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
	schema := lake.FileSchema(Schema(cfg.Columns))
	b := &Buffer{
		cfg:       cfg,
		schema:    schema,
		retry:     cfg.Lake.Retry(),
		log:       cfg.Logger.With("table", cfg.TableID),
		build:     newBlockBuilder(schema, cfg.Columns, cfg.BlockRows),
		narrowest: len(cfg.Columns),
		files:     map[uint64]*VirtualFile{},
		changed:   make(chan struct{}),
	}
	for range cfg.FlushWorkers {
		b.bg.Go(b.flushWorker)
	}
	return b, nil
}

// notify wakes everyone waiting for a change. Called with mu held.
func (b *Buffer) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// wake is notify for timers (a retry came due).
func (b *Buffer) wake() {
	b.mu.Lock()
	b.notify()
	b.mu.Unlock()
}

// waitChange releases mu until the next notify or until ctx (nil: no
// limit) ends, and takes it again.
func (b *Buffer) waitChange(ctx context.Context) error {
	ch := b.changed
	b.mu.Unlock()
	defer b.mu.Lock()
	if ctx == nil {
		<-ch
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Append adds rows written by the mirror transaction ts and returns where
// they went: consecutive runs, split only where a file fills up. Rows are
// checked first; a bad row fails the call with nothing appended.
func (b *Buffer) Append(ctx context.Context, ts uint64, rows [][]any) ([]Run, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.unflushed > b.cfg.MaxUnflushedBytes && !b.closed {
		if err := b.waitChange(ctx); err != nil { // back-pressure: the lake is behind
			return nil, err
		}
	}
	width := len(b.cfg.Columns)
	for i := range rows {
		b.pad(rows[i:i+1], width)
		if err := CheckRow(b.cfg.Columns, rows[i]); err != nil {
			return nil, fmt.Errorf("writebuffer: table %d row %d: %w", b.cfg.TableID, i, err)
		}
	}
	var runs []Run
	for done := 0; done < len(rows); {
		if b.closed {
			return runs, ErrClosed
		}
		if b.cur == nil || b.cur.rows == b.cur.capacity {
			if err := b.nextFile(ctx); err != nil { // unlocks: Widen may run
				return runs, err
			}
			continue
		}
		if width != len(b.cfg.Columns) {
			width = len(b.cfg.Columns)
			b.pad(rows[done:], width)
		}
		f := b.cur
		n := min(len(rows)-done, f.capacity-f.rows, b.cfg.BlockRows-b.build.rows)
		b.build.add(ts, rows[done:done+n])
		if k := len(runs); k > 0 && runs[k-1].File == f {
			runs[k-1].N += n
		} else {
			runs = append(runs, Run{File: f, First: uint32(f.rows), N: n})
		}
		f.rows += n
		done += n
		if b.build.rows == b.cfg.BlockRows || f.rows == f.capacity {
			b.sealActive()
		}
		if f.rows == f.capacity {
			f.sealed = true
		}
	}
	return runs, nil
}

// pad gives rows written before the table gained columns (no narrower than
// the table at the buffer's start) NULL in them, up to width columns.
func (b *Buffer) pad(rows [][]any, width int) {
	for i, r := range rows {
		if len(r) < width && len(r) >= b.narrowest {
			rows[i] = append(slices.Clip(r), make([]any, width-len(r))...)
		}
	}
}

// Widen gives the buffer the table's columns after the table gained some
// at its end (catalog.Catalog.AddColumn): the active block ends, and blocks
// from then on carry the new columns. Rows appended with the old columns
// get NULL in the new ones; blocks and files written before read NULL in
// them (lake.File.Widen).
func (b *Buffer) Widen(cols []Column) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(cols) <= len(b.cfg.Columns) {
		return nil
	}
	for i, c := range b.cfg.Columns {
		if !strings.EqualFold(c.Name, cols[i].Name) || c.Type != cols[i].Type {
			return fmt.Errorf("writebuffer: table %d: column %d is %s %s, the widened table has %s %s", b.cfg.TableID, i, c.Name, c.Type, cols[i].Name, cols[i].Type)
		}
	}
	for _, c := range cols[len(b.cfg.Columns):] {
		if !c.Nullable {
			return fmt.Errorf("writebuffer: table %d: added column %s must be nullable (rows written before have no value)", b.cfg.TableID, c.Name)
		}
	}
	if b.cur != nil && b.build.rows > 0 {
		b.sealActive()
	}
	b.build.release()
	b.cfg.Columns = slices.Clone(cols)
	b.schema = lake.FileSchema(Schema(b.cfg.Columns))
	first := b.build.first
	b.build = newBlockBuilder(b.schema, b.cfg.Columns, b.cfg.BlockRows)
	b.build.first = first
	b.notify()
	return nil
}

// schemaOf is the file schema of records of one block.
func (b *Buffer) schemaOf(recs []arrow.RecordBatch) *arrow.Schema {
	if len(recs) > 0 {
		return recs[0].Schema()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.schema
}

// Close flushes what it can within ctx and stops the workers. Files not
// full stay virtual: their blocks are durable in the lake.
func (b *Buffer) Close(ctx context.Context) error {
	err := b.Flush(ctx)
	b.mu.Lock()
	b.closed = true
	b.notify()
	b.mu.Unlock()
	b.bg.Wait()
	b.mu.Lock()
	b.build.release()
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
	if !b.closed {
		st.MemoryBytes += b.build.memoryBytes()
	}
	return st
}
