// Package replay applies the operations of mirror transactions to version
// storage: new versions go to the table's write buffer with create_ts = the
// transaction's timestamp, the primary index moves the key to the new row
// id, and the replaced version gets a delete timestamp in its file's
// visibility.
//
// Row ids are fileID<<32 | offset: a virtual file's rows get consecutive ids
// at consecutive offsets, so one main-index range per file maps them, and
// ids are never reused because file ids are not.
package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/types"
	"github.com/retinadb/retina/internal/visibility"
	"github.com/retinadb/retina/internal/writebuffer"
)

// ErrOp is wrapped by every error about a single operation.
var ErrOp = errors.New("replay: operation failed")

// OpError names the operation that failed and why.
type OpError struct {
	Table string
	Kind  change.OpKind
	TS    uint64
	Key   []any
	Err   error
}

// Error names the operation by what the source knows of it (not by its
// timestamp, which a restart changes).
func (e *OpError) Error() string {
	if e.Kind == change.Truncate {
		return fmt.Sprintf("replay: truncate of table %s: %v", e.Table, e.Err)
	}
	return fmt.Sprintf("replay: %s on table %s key %v: %v", e.Kind, e.Table, e.Key, e.Err)
}

func (e *OpError) Unwrap() []error { return []error{ErrOp, e.Err} }

// Catalog is what the replayer needs from the catalog.
type Catalog interface {
	writebuffer.Catalog
	Snapshot() *catalog.Snapshot
	// DeleteFile is storage GC's (its swaps are the caller's).
	DeleteFile(ctx context.Context, id uint64) error
}

// Config configures a replayer.
type Config struct {
	ID      uint32
	Catalog Catalog
	Index   *index.Store
	Lake    writebuffer.Lake
	// Write-buffer shape for every table (see writebuffer.Config).
	BlockRows, FileBlocks, FlushWorkers int
	// BlockCache keeps flushed blocks decoded for scans (nil: none).
	BlockCache *writebuffer.BlockCache
	// Combines bounds the write buffers' combinations across the node
	// (nil: none).
	Combines *writebuffer.CombineLimit
	// Failpoints reach into flushes and combinations (crash tests).
	Failpoints *failpoint.Set
	// Rows reads stored rows, for updates that keep unchanged columns and
	// operations that find their row by content (nil: those fail).
	Rows RowReader
	// UndoInMemory bounds the undo records a bucket keeps in memory
	// (default 32768; negative: no bound); older ones go to a file in
	// UndoDir (default the system's temporary directory).
	UndoInMemory int
	UndoDir      string
	// Keeps says another reader of the lake still names an object (an
	// Iceberg snapshot): storage GC then forgets a retired file without
	// deleting its object, which that reader's owner deletes later (nil:
	// none).
	Keeps  func(key string) bool
	Logger *slog.Logger
}

// RowReader reads stored rows, every column: one version by its location,
// or the rows of a table visible at a snapshot.
type RowReader interface {
	ReadRow(ctx context.Context, t *catalog.Table, f *catalog.File, offset uint32) ([]any, error)
	EachRow(ctx context.Context, t *catalog.Table, files []*catalog.File, snapshot uint64, fn func(row []any) error) error
}

// Stats count what the replayer did.
type Stats struct {
	Inserts, Deletes, Updates uint64
}

// Replayer owns a set of buckets: Apply and Rollback calls for different
// buckets may run concurrently; calls for one bucket come one at a time, in
// timestamp order.
type Replayer struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	tables map[uint32]*tableState
	// shapes is read-held while a batch applies and write-held while widen
	// gives a table more columns, so one batch sees one width of each
	// table from conform to its last operation, whatever other buckets do.
	shapes sync.RWMutex

	filesMu sync.RWMutex
	files   map[uint64]*visibility.RowGroup // visibility of files this replayer owns

	undoMu sync.Mutex
	undo   map[int]*undoLog // per bucket

	runs sync.Pool // *runScratch

	inserts, deletes, updates atomic.Uint64
}

type secondary struct {
	def  catalog.Index
	cols []int
}

type tableState struct {
	table *catalog.Table
	buf   *writebuffer.Buffer
	cols  []writebuffer.Column
	keys  []int // primary-key column positions
	sec   []secondary
}

// New makes a replayer; tables are opened on first use.
func New(cfg Config) (*Replayer, error) {
	if cfg.Catalog == nil || cfg.Index == nil || cfg.Lake == nil {
		return nil, fmt.Errorf("replay: catalog, index and lake are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.UndoInMemory == 0 {
		cfg.UndoInMemory = 1 << 15
	}
	return &Replayer{
		cfg:    cfg,
		log:    cfg.Logger.With("replayer", cfg.ID),
		tables: map[uint32]*tableState{},
		files:  map[uint64]*visibility.RowGroup{},
		undo:   map[int]*undoLog{},
	}, nil
}

// RowID is the row id of the row at offset of a file.
func RowID(file uint64, offset uint32) uint64 { return file<<32 | uint64(offset) }

// table returns the state of a table, opening its buffer and defining its
// indexes on first use.
func (r *Replayer) table(id uint32) (*tableState, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ts, ok := r.tables[id]; ok {
		return ts, nil
	}
	t, ok := r.cfg.Catalog.Snapshot().TableByID(id)
	if !ok {
		return nil, fmt.Errorf("replay: table %d is not in the catalog", id)
	}
	st := &tableState{table: t, keys: t.Schema.KeyColumns()}
	keyTypes := make([]types.Type, len(st.keys))
	for i, k := range st.keys {
		keyTypes[i] = t.Schema.Columns[k].Type
	}
	if err := r.cfg.Index.Define(index.Def{ID: t.PrimaryIndexID, Name: t.Name + ".pk", Columns: keyTypes, Unique: true}); err != nil {
		return nil, err
	}
	for _, ix := range t.Schema.Indexes {
		s := secondary{def: ix}
		var ct []types.Type
		for _, c := range ix.Columns {
			p := t.Schema.ColumnIndex(c)
			s.cols = append(s.cols, p)
			ct = append(ct, t.Schema.Columns[p].Type)
		}
		if err := r.cfg.Index.Define(index.Def{ID: ix.ID, Name: t.Name + "." + ix.Name, Columns: ct, Unique: ix.Unique}); err != nil {
			return nil, err
		}
		st.sec = append(st.sec, s)
	}
	st.cols = writebuffer.TableColumns(t.Schema)
	buf, err := writebuffer.New(writebuffer.Config{
		TableID: id, Columns: st.cols, Replayer: r.cfg.ID,
		Catalog: r.cfg.Catalog, Lake: r.cfg.Lake,
		BlockRows: r.cfg.BlockRows, FileBlocks: r.cfg.FileBlocks, FlushWorkers: r.cfg.FlushWorkers,
		OnNewFile: r.registerFile, Failpoints: r.cfg.Failpoints, Cache: r.cfg.BlockCache,
		Combines: r.cfg.Combines,
		Logger:   r.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	st.buf = buf
	r.tables[id] = st
	return st, nil
}

// widen gives a table the columns the catalog has for it now, once an
// operation brings a row of width values: the source added columns at the
// table's end (catalog.Catalog.AddColumn). It waits for the batches being
// applied (shapes); the buffer pads the narrower rows they appended.
func (r *Replayer) widen(id uint32, width int) error {
	r.shapes.Lock()
	defer r.shapes.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.tables[id]
	if width <= len(st.cols) {
		return nil
	}
	t, ok := r.cfg.Catalog.Snapshot().TableByID(id)
	if !ok {
		return fmt.Errorf("replay: table %d is not in the catalog", id)
	}
	if len(t.Schema.Columns) < width {
		return fmt.Errorf("row has %d values, and the catalog gives the table %d columns", width, len(t.Schema.Columns))
	}
	cols := writebuffer.TableColumns(t.Schema)
	if err := st.buf.Widen(cols); err != nil {
		return err
	}
	wide := *st
	wide.table, wide.cols = t, cols
	r.tables[id] = &wide
	return nil
}

// conform fits every operation's images to its table's columns: a wider one
// widens the table (widen), a narrower one was written before the table
// gained columns and gets NULL in them. The caller holds shapes for
// reading, which conform gives up while it widens. When an operation
// cannot be fitted it returns its index with an *OpError; those before it
// are fitted.
func (r *Replayer) conform(ops []change.Op) (int, error) {
	for {
		var (
			lastID uint32
			last   *tableState
		)
		wider, width := -1, 0
		for i := range ops {
			op := &ops[i]
			if op.Kind == change.Truncate {
				continue
			}
			if last == nil || op.Table != lastID { // most batches hold few tables
				st, err := r.table(op.Table)
				if err != nil {
					continue // prepare says so, in order
				}
				lastID, last = op.Table, st
			}
			if w := max(len(op.Row), len(op.Before)); w > len(last.cols) {
				wider, width = i, w
				break
			}
			op.Row = padded(op.Row, last.cols)
			op.Before = padded(op.Before, last.cols)
		}
		if wider < 0 {
			return len(ops), nil
		}
		// Widening is rare (a column added upstream); the pass starts over,
		// as the rows before the wider one are narrower now.
		r.shapes.RUnlock()
		err := r.widen(ops[wider].Table, width)
		r.shapes.RLock()
		if err != nil {
			return wider, r.opError(&step{op: &ops[wider]}, err)
		}
	}
}

// padded is row with NULL in the nullable columns past its end.
func padded(row []any, cols []writebuffer.Column) []any {
	if row == nil || len(row) >= len(cols) {
		return row
	}
	for _, c := range cols[len(row):] {
		if !c.Nullable {
			return row // prepare rejects it
		}
	}
	return append(slices.Clip(row), make([]any, len(cols)-len(row))...)
}

// registerFile maps a new virtual file's row ids and visibility.
func (r *Replayer) registerFile(f *writebuffer.VirtualFile) error {
	err := r.cfg.Index.Register(context.Background(),
		index.RowRange{First: RowID(f.ID(), 0), N: uint32(f.Capacity())},
		index.Location{FileID: f.ID()})
	if err != nil {
		return err
	}
	r.filesMu.Lock()
	r.files[f.ID()] = f.Visibility()
	r.filesMu.Unlock()
	return nil
}

// AdoptFile makes the replayer own the visibility of a regular file that
// did not come from its write buffer (bulk-loaded data, or files reopened
// after a restart): vis holds its deletes so far (a restored checkpoint),
// or nil for none. Its row ids are mapped like a virtual file's.
func (r *Replayer) AdoptFile(ctx context.Context, f *catalog.File, vis *visibility.RowGroup) error {
	rows := int(f.Rows())
	if vis == nil {
		var err error
		if vis, err = visibility.NewRowGroup(rows); err != nil {
			return err
		}
	}
	if vis.Rows() < rows {
		return fmt.Errorf("replay: visibility of file %d covers %d rows, the file has %d", f.ID, vis.Rows(), rows)
	}
	if err := r.cfg.Index.Register(ctx, index.RowRange{First: RowID(f.ID, 0), N: uint32(vis.Rows())}, index.Location{FileID: f.ID}); err != nil {
		return err
	}
	r.filesMu.Lock()
	r.files[f.ID] = vis
	r.filesMu.Unlock()
	return nil
}

// FileVisibility returns the visibility of a file this replayer owns.
func (r *Replayer) FileVisibility(file uint64) (*visibility.RowGroup, bool) {
	r.filesMu.RLock()
	defer r.filesMu.RUnlock()
	v, ok := r.files[file]
	return v, ok
}

// Buffer returns a table's write buffer (opening it if needed).
func (r *Replayer) Buffer(table uint32) (*writebuffer.Buffer, error) {
	st, err := r.table(table)
	if err != nil {
		return nil, err
	}
	return st.buf, nil
}

// Stats returns the counters.
func (r *Replayer) Stats() Stats {
	return Stats{Inserts: r.inserts.Load(), Deletes: r.deletes.Load(), Updates: r.updates.Load()}
}

// Collect runs memory GC on every file's visibility below lwm.
func (r *Replayer) Collect(lwm uint64) visibility.CollectStats {
	r.filesMu.RLock()
	vis := make([]*visibility.RowGroup, 0, len(r.files))
	for _, v := range r.files {
		vis = append(vis, v)
	}
	r.filesMu.RUnlock()
	var total visibility.CollectStats
	for _, v := range vis {
		st := v.Collect(lwm)
		total.Folded += st.Folded
		total.FreedBlocks += st.FreedBlocks
		total.RetiredFilters += st.RetiredFilters
		total.SwappedTiles += st.SwappedTiles
		total.PendingSurvived += st.PendingSurvived
	}
	return total
}

// VisibilityBytes is the memory of all file visibilities.
func (r *Replayer) VisibilityBytes() int64 {
	r.filesMu.RLock()
	defer r.filesMu.RUnlock()
	var n int64
	for _, v := range r.files {
		n += int64(v.MemoryBytes())
	}
	return n
}

// Buffers lists the tables' write buffers; they are used outside r.mu so
// a slow flush does not hold up Apply.
func (r *Replayer) Buffers() []*writebuffer.Buffer {
	r.mu.Lock()
	defer r.mu.Unlock()
	bufs := make([]*writebuffer.Buffer, 0, len(r.tables))
	for _, t := range r.tables {
		bufs = append(bufs, t.buf)
	}
	return bufs
}

// eachBuffer calls f on every table's buffer and joins the errors.
func (r *Replayer) eachBuffer(f func(*writebuffer.Buffer) error) error {
	var errs []error
	for _, b := range r.Buffers() {
		errs = append(errs, f(b))
	}
	return errors.Join(errs...)
}

// Flush makes every table's buffered rows durable in the lake.
func (r *Replayer) Flush(ctx context.Context) error {
	return r.eachBuffer(func(b *writebuffer.Buffer) error { return b.Flush(ctx) })
}

// Finish makes every table's rows regular files (see writebuffer.Finish).
func (r *Replayer) Finish(ctx context.Context) error {
	return r.eachBuffer(func(b *writebuffer.Buffer) error { return b.Finish(ctx) })
}

// BufferStats sums the write-buffer statistics of every table.
func (r *Replayer) BufferStats() writebuffer.Stats {
	var total writebuffer.Stats
	for _, b := range r.Buffers() {
		st := b.Stats()
		total.MemoryBytes += st.MemoryBytes
		total.UnflushedBytes += st.UnflushedBytes
		total.Blocks += st.Blocks
		total.Flushed += st.Flushed
		total.Combined += st.Combined
		total.FlushErrors += st.FlushErrors
		total.VirtualFiles += st.VirtualFiles
		if st.LastFlushError != "" {
			total.LastFlushError = st.LastFlushError
		}
	}
	return total
}

// Files lists the ids of the files whose visibility this replayer owns.
func (r *Replayer) Files() []uint64 {
	r.filesMu.RLock()
	defer r.filesMu.RUnlock()
	return slices.Collect(maps.Keys(r.files))
}

// Close flushes and stops every table's buffer.
func (r *Replayer) Close(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, t := range r.tables {
		errs = append(errs, t.buf.Close(ctx))
	}
	return errors.Join(errs...)
}
