package writebuffer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/types"
)

// flakyLake fails uploads of block objects while failing is set.
type flakyLake struct {
	*lake.Store
	failing atomic.Bool
	fails   atomic.Int64
}

func (f *flakyLake) Put(ctx context.Context, key string, data []byte) error {
	if f.failing.Load() && strings.Contains(key, "/v") {
		f.fails.Add(1)
		return errors.New("injected: upload refused")
	}
	return f.Store.Put(ctx, key, data)
}

var testCols = []Column{
	{Name: "id", Type: types.Of(types.Int64)},
	{Name: "name", Type: types.Of(types.String), Nullable: true},
}

// testTable opens a catalog with the table of testCols.
func testTable(t *testing.T) (*catalog.Catalog, *catalog.Table) {
	t.Helper()
	cat, err := catalog.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	tb, err := cat.CreateTable(context.Background(), "t", catalog.Schema{
		Columns:    []catalog.Column{{Name: "id", Type: types.Of(types.Int64)}, {Name: "name", Type: types.Of(types.String), Nullable: true}},
		PrimaryKey: []string{"id"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return cat, tb
}

func newBuffer(t *testing.T, l Lake, blockRows, fileBlocks int) (*Buffer, *catalog.Catalog) {
	t.Helper()
	cat, tb := testTable(t)
	b, err := New(Config{TableID: tb.ID, Columns: testCols, Catalog: cat, Lake: l,
		BlockRows: blockRows, FileBlocks: fileBlocks, FlushWorkers: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Bounded: a test that failed may leave its lake refusing uploads,
		// and Close waits for them within its context.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b.Close(ctx)
	})
	return b, cat
}

func memLake(t *testing.T) *lake.Store {
	s, err := lake.Open(context.Background(), "mem://", lake.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestViewsNeverMissOrDoubleRows: while appends, flushes and combinations
// run, every view of the files holding the rows appended so far shows each
// of those rows exactly once, by content: in memory, in flushed block
// objects or in the combined file, before and after combinations, never in
// two places at once, and its objects stay readable until release. The
// appender waits for a view every few rows, so views and combinations
// interleave however fast the machine is.
func TestViewsNeverMissOrDoubleRows(t *testing.T) {
	const rows, viewEvery = 3000, 50
	store := memLake(t)
	b, _ := newBuffer(t, store, 32, 4)
	ctx := context.Background()
	var mu sync.Mutex
	var fileOf []uint64 // row i was appended to file fileOf[i]
	viewed := make(chan struct{}, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(stop)
		for i := range rows {
			if i%viewEvery == 0 && i > 0 {
				<-viewed
			}
			runs, err := b.Append(ctx, uint64(i+1), [][]any{{int64(i), nil}})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			fileOf = append(fileOf, runs[0].File.ID())
			mu.Unlock()
		}
	})
	views := 0
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		default:
		}
		mu.Lock()
		before := len(fileOf)
		ids := slices.Compact(slices.Clone(fileOf))
		mu.Unlock()
		v := b.View(ids...)
		seen := map[int64]int{}
		for _, fv := range v.Files {
			for _, id := range viewRows(t, store, fv) {
				seen[id]++
			}
		}
		v.Release()
		for id, n := range seen {
			if n > 1 {
				t.Fatalf("view %d: row %d shows %d times", views, id, n)
			}
		}
		for i := range int64(before) {
			if seen[i] != 1 {
				t.Fatalf("view %d: row %d, appended before it, is missing (%d rows appended)", views, i, before)
			}
		}
		views++
		select {
		case viewed <- struct{}{}:
		default:
		}
	}
	wg.Wait()
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Every full file was combined: rows / (32 × 4) of them.
	if st := b.Stats(); st.Combined != rows/(32*4) {
		t.Fatalf("%d files combined, want %d: %+v", st.Combined, rows/(32*4), st)
	}
	t.Logf("%d views", views)
}

// viewRows reads the ids of every row a file view shows, wherever they are.
func viewRows(t *testing.T, store *lake.Store, fv FileView) []int64 {
	t.Helper()
	var ids []int64
	read := func(key string) {
		r, err := store.ReaderAt(context.Background(), key)
		if err != nil {
			t.Fatalf("file %d: object %s unreadable inside a view: %v", fv.FileID, key, err)
		}
		f, err := lake.OpenFile(r, nil)
		if err != nil {
			t.Fatalf("object %s: %v", key, err)
		}
		defer f.Close()
		for g := range f.RowGroups() {
			rec, err := f.ReadRowGroup(context.Background(), g, []int{0}, false)
			if err != nil {
				t.Fatalf("object %s: %v", key, err)
			}
			ids = append(ids, rec.Column(0).(*array.Int64).Int64Values()...)
			rec.Release()
		}
	}
	if fv.Regular {
		read(fv.Key)
		return ids
	}
	next := uint32(0)
	for _, bv := range fv.Blocks {
		if bv.First != next {
			t.Fatalf("file %d: block at %d, expected %d (gap or overlap)", fv.FileID, bv.First, next)
		}
		n := len(ids)
		recs := bv.Records
		if recs == nil {
			data, err := store.Get(context.Background(), bv.Key)
			if err != nil {
				t.Fatalf("file %d: block %s unreadable inside a view: %v", fv.FileID, bv.Key, err)
			}
			if recs, err = lake.ReadBlock(context.Background(), data, nil); err != nil {
				t.Fatalf("block %s: %v", bv.Key, err)
			}
		}
		for _, r := range recs {
			ids = append(ids, r.Column(0).(*array.Int64).Int64Values()...)
		}
		if len(ids)-n != bv.Rows {
			t.Fatalf("file %d block at %d: %d rows, the view says %d", fv.FileID, bv.First, len(ids)-n, bv.Rows)
		}
		next += uint32(bv.Rows)
	}
	return ids
}

// TestFailedUploadsRetryWithoutStalling: while uploads fail the blocks stay
// in memory and readable, the failure is counted, and once the lake
// recovers everything flushes and combines.
func TestFailedUploadsRetryWithoutStalling(t *testing.T) {
	fl := &flakyLake{Store: memLake(t)}
	b, cat := newBuffer(t, fl, 16, 2)
	ctx := context.Background()
	fl.failing.Store(true)
	for i := range 64 {
		if _, err := b.Append(ctx, uint64(i+1), [][]any{{int64(i), "x"}}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.Stats().FlushErrors < 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	st := b.Stats()
	if st.FlushErrors < 4 || st.Flushed != 0 || !strings.Contains(st.LastFlushError, "injected") {
		t.Fatalf("while failing: %+v", st)
	}
	v := b.View(b.VirtualFiles()...)
	rows := 0
	for _, fv := range v.Files {
		for _, bv := range fv.Blocks {
			if bv.Records == nil {
				t.Fatal("a block that never flushed has no records")
			}
			rows += bv.Rows
		}
	}
	v.Release()
	if rows != 64 {
		t.Fatalf("view during failures: %d rows", rows)
	}
	fl.failing.Store(false)
	flushCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := b.Flush(flushCtx); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.Combined != 2 || st.Blocks != 0 {
		t.Fatalf("after recovery: %+v", st)
	}
	live := cat.Snapshot().LiveFiles(1)
	for _, f := range live {
		if f.State != catalog.Regular || f.Rows() != 32 {
			t.Fatalf("file %d: %s with %d rows", f.ID, f.State, f.Rows())
		}
	}
	// The small objects go once the files are combined and unread.
	deadline = time.Now().Add(5 * time.Second)
	for {
		objs, _ := fl.List(ctx, "t1/v")
		if len(objs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d block objects left after combination", len(objs))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAppendRejectsBadRows(t *testing.T) {
	b, _ := newBuffer(t, memLake(t), 16, 2)
	ctx := context.Background()
	for _, row := range [][]any{{nil, "x"}, {"1", "x"}, {int64(1)}} {
		if _, err := b.Append(ctx, 1, [][]any{{int64(0), "ok"}, row}); !errors.Is(err, types.ErrTypeMismatch) {
			t.Fatalf("row %v: %v", row, err)
		}
	}
	if st := b.Stats(); st.VirtualFiles != 0 {
		t.Fatalf("a rejected batch created a file: %+v", st)
	}
}

// TestSealWaitsForWhatWasSealed: Seal puts every row appended so far in a
// sealed block and reports each virtual file's rows; Wait returns once
// those blocks are durable, and not before (uploads failing hold it).
func TestSealWaitsForWhatWasSealed(t *testing.T) {
	fl := &flakyLake{Store: memLake(t)}
	b, _ := newBuffer(t, fl, 16, 4)
	ctx := context.Background()
	// Uploads fail from the start: a first file flushed and combined
	// before Seal would leave the buffer, and Seal would not report it.
	fl.failing.Store(true)
	for i := range 100 {
		if _, err := b.Append(ctx, uint64(i+1), [][]any{{int64(i), nil}}); err != nil {
			t.Fatal(err)
		}
	}
	sealed := b.Seal()
	total := 0
	for _, rows := range sealed.Files {
		total += rows
	}
	if total != 100 || len(sealed.Files) != 2 || sealed.Capacity != 64 {
		t.Fatalf("sealed %v (capacity %d), want 100 rows in 2 files of 64", sealed.Files, sealed.Capacity)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := sealed.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait returned %v while the blocks could not be uploaded", err)
	}
	fl.failing.Store(false)
	long, cancel2 := context.WithTimeout(ctx, time.Minute)
	defer cancel2()
	if err := sealed.Wait(long); err != nil {
		t.Fatal(err)
	}
	// Every sealed row is in an object: a file's blocks or its combined file.
	for id, rows := range sealed.Files {
		v := b.View(id)
		fv := v.Files[0]
		got := len(viewRows(t, fl.Store, fv))
		v.Release()
		if got < rows {
			t.Fatalf("file %d: %d rows durable, %d sealed", id, got, rows)
		}
		for _, bv := range fv.Blocks {
			if bv.Records != nil && int(bv.First) < rows {
				t.Fatalf("file %d: the block at %d is still only in memory", id, bv.First)
			}
		}
	}
}

// gatedCatalog holds the registration of the second file until gate closes.
type gatedCatalog struct {
	*catalog.Catalog
	n       atomic.Int32
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedCatalog) RegisterFile(ctx context.Context, f catalog.File) (*catalog.File, error) {
	if g.n.Add(1) == 2 {
		close(g.entered)
		<-g.gate
	}
	return g.Catalog.RegisterFile(ctx, f)
}

// appendWaitingForFile starts an append of 9 rows to a buffer of 8-row
// files and returns once it waits for its second file's registration,
// held until gc.gate closes; appended gets the append's error.
func appendWaitingForFile(t *testing.T) (*Buffer, *gatedCatalog, chan error) {
	t.Helper()
	cat, tb := testTable(t)
	gc := &gatedCatalog{Catalog: cat, entered: make(chan struct{}), gate: make(chan struct{})}
	b, err := New(Config{TableID: tb.ID, Columns: testCols, Catalog: gc, Lake: memLake(t),
		BlockRows: 4, FileBlocks: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close(context.Background()) })
	appended := make(chan error, 1)
	go func() {
		rows := make([][]any, 9) // one full file of 8 and a row for the next
		for i := range rows {
			rows[i] = []any{int64(i), "x"}
		}
		_, err := b.Append(context.Background(), 1, rows)
		appended <- err
	}()
	<-gc.entered
	return b, gc, appended
}

// TestRegistrationRunsOutsideTheLock: while an appender waits for the
// catalog to register its next file, the buffer's other work goes on:
// views, stats, and flushing and combining the full file.
func TestRegistrationRunsOutsideTheLock(t *testing.T) {
	b, gc, appended := appendWaitingForFile(t)
	ctx := context.Background()
	flushCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := b.Flush(flushCtx); err != nil {
		t.Fatalf("flush while a file registration waits: %v", err)
	}
	if st := b.Stats(); st.Combined != 1 {
		t.Fatalf("the full file was not combined while the next registered: %+v", st)
	}
	b.View(b.VirtualFiles()...).Release()
	close(gc.gate)
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.VirtualFiles != 1 {
		t.Fatalf("after the registration: %+v", st)
	}
}

// TestFlushedBlocksStayInTheCache: views of flushed blocks get their
// records from the block cache while it holds them, the blocks flushed
// longest ago go first when it is over its budget, and a combined file's
// blocks leave it.
func TestFlushedBlocksStayInTheCache(t *testing.T) {
	cat, tb := testTable(t)
	l := memLake(t)
	newBuf := func(cache *BlockCache) *Buffer {
		b, err := New(Config{TableID: tb.ID, Columns: testCols, Catalog: cat, Lake: l, Cache: cache,
			BlockRows: 16, FileBlocks: 4, FlushWorkers: 1, Logger: slog.New(slog.DiscardHandler)}) // one worker: blocks flush in order
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close(context.Background()) })
		return b
	}
	ctx := context.Background()
	appendBlocks := func(b *Buffer, n int) {
		for i := range n * 16 {
			if _, err := b.Append(ctx, uint64(i+1), [][]any{{int64(i), "x"}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	inMemory := func(b *Buffer) (cached []uint32) {
		v := b.View(b.VirtualFiles()...)
		defer v.Release()
		for _, fv := range v.Files {
			for _, bv := range fv.Blocks {
				if bv.Key == "" {
					t.Fatalf("block %d is not durable after Flush", bv.First)
				}
				if bv.Records != nil {
					cached = append(cached, bv.First)
				}
			}
		}
		return cached
	}

	all := NewBlockCache(1 << 30)
	b := newBuf(all)
	appendBlocks(b, 3)
	if got := inMemory(b); !slices.Equal(got, []uint32{0, 16, 32}) {
		t.Fatalf("cached blocks %v, want all three", got)
	}
	st := all.Stats()
	if st.Hits != 3 || st.Bytes <= 0 {
		t.Fatalf("cache: %+v", st)
	}
	perBlock := st.Bytes / 3
	appendBlocks(b, 1) // the file fills and Flush waits for its combination
	if st := all.Stats(); st.Bytes != 0 {
		t.Fatalf("a combined file's blocks stay cached: %+v", st)
	}

	two := NewBlockCache(2*perBlock + perBlock/2)
	b2 := newBuf(two)
	appendBlocks(b2, 3)
	if got := inMemory(b2); !slices.Equal(got, []uint32{16, 32}) {
		t.Fatalf("a cache of two blocks kept %v, want the two flushed last", got)
	}
	if st := two.Stats(); st.Misses != 1 || st.Hits != 2 {
		t.Fatalf("cache of two blocks: %+v", st)
	}
}

// TestWidenWhileAnAppendWaits: a table gains a column while an append of
// rows with the old columns waits for its next file's registration (the
// buffer's lock is free then). The rows it appends after get NULL in the
// new column; the file filled before the change, combined, and the one
// after, read with the new column: NULL where rows had none.
func TestWidenWhileAnAppendWaits(t *testing.T) {
	b, gc, appended := appendWaitingForFile(t)
	ctx := context.Background()
	wide := append(slices.Clone(testCols), Column{Name: "score", Type: types.Of(types.Int64), Nullable: true})
	if err := b.Widen(wide); err != nil {
		t.Fatal(err)
	}
	close(gc.gate)
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if _, err := b.Append(ctx, 2, [][]any{{int64(9), "y", int64(5)}, {int64(10), "z"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Append(ctx, 3, [][]any{{int64(11)}}); err == nil {
		t.Fatal("a row narrower than the table ever was was appended")
	}
	if err := b.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	l := b.cfg.Lake.(*lake.Store)
	var got []string
	for _, f := range gc.Snapshot().LiveFiles(b.cfg.TableID) {
		if f.State != catalog.Regular {
			t.Fatalf("file %d is %s after Finish", f.ID, f.State)
		}
		r, err := l.ReaderAt(ctx, f.Key)
		if err != nil {
			t.Fatal(err)
		}
		pf, err := lake.OpenFile(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := pf.Widen(Schema(wide)); err != nil {
			t.Fatal(err)
		}
		for g := range pf.RowGroups() {
			rec, err := pf.ReadRowGroup(ctx, g, []int{0, 2}, false)
			if err != nil {
				t.Fatal(err)
			}
			for i := range int(rec.NumRows()) {
				got = append(got, rec.Column(0).ValueStr(i)+"="+rec.Column(1).ValueStr(i))
			}
			rec.Release()
		}
		pf.Close()
	}
	want := "0=(null) 1=(null) 2=(null) 3=(null) 4=(null) 5=(null) 6=(null) 7=(null) 8=(null) 9=5 10=(null)"
	if strings.Join(got, " ") != want {
		t.Fatalf("rows %s, want %s", strings.Join(got, " "), want)
	}
}

// countingLake counts reads of block objects.
type countingLake struct {
	*lake.Store
	blockGets atomic.Int64
}

func (c *countingLake) Get(ctx context.Context, key string) ([]byte, error) {
	if strings.Contains(key, "/v") {
		c.blockGets.Add(1)
	}
	return c.Store.Get(ctx, key)
}

// TestCombinationTakesCachedBlocks: a file whose blocks are all still in
// the block cache is combined from them without reading a block object;
// one whose blocks left the cache reads them; both files hold the same
// rows with the same versions.
func TestCombinationTakesCachedBlocks(t *testing.T) {
	ctx := context.Background()
	combined := func(budget int64) (gets int64, rows [][2]int64) {
		cat, tb := testTable(t)
		l := &countingLake{Store: memLake(t)}
		b, err := New(Config{TableID: tb.ID, Columns: testCols, Catalog: cat, Lake: l, Cache: NewBlockCache(budget),
			BlockRows: 16, FileBlocks: 4, FlushWorkers: 1, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(ctx)
		for i := range 4 * 16 {
			if _, err := b.Append(ctx, uint64(i/3+1), [][]any{{int64(i), fmt.Sprint("row", i)}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Flush(ctx); err != nil { // waits for the combination
			t.Fatal(err)
		}
		v := b.View(b.VirtualFiles()...)
		defer v.Release()
		data, err := l.Store.Get(ctx, RegularKey(tb.ID, 1))
		if err != nil {
			t.Fatalf("combined file: %v (views %+v)", err, v.Files)
		}
		f, err := lake.OpenFile(bytes.NewReader(data), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for g := range f.RowGroups() {
			rec, err := f.ReadRowGroup(ctx, g, []int{0}, true)
			if err != nil {
				t.Fatal(err)
			}
			ids, ts := rec.Column(0).(*array.Int64).Int64Values(), rec.Column(1).(*array.Int64).Int64Values()
			for i := range ids {
				rows = append(rows, [2]int64{ids[i], ts[i]})
			}
			rec.Release()
		}
		return l.blockGets.Load(), rows
	}
	cachedGets, fromCache := combined(1 << 30)
	readGets, fromObjects := combined(1)
	if cachedGets != 0 || readGets != 4 {
		t.Fatalf("block objects read: %d with every block cached (want 0), %d with none (want 4)", cachedGets, readGets)
	}
	if len(fromCache) != 64 || !slices.Equal(fromCache, fromObjects) {
		t.Fatalf("combined from the cache: %d rows %v…; from the objects: %d rows %v…", len(fromCache), fromCache[:min(3, len(fromCache))], len(fromObjects), fromObjects[:min(3, len(fromObjects))])
	}
}

// TestBlockFirstReadsBothFormats: recovery finds the first row of blocks
// flushed as IPC and of blocks an earlier version flushed as Parquet, and
// nothing in other keys.
func TestBlockFirstReadsBothFormats(t *testing.T) {
	for key, want := range map[string]int64{
		blockKey(3, 9, 4096):        4096,
		"t3/v9/b00004096.parquet":   4096,
		"t3/v9/b4294967295.arrow":   4294967295,
		"t3/v9/b00000000.arrow":     0,
		"t3/v9/b4294967296.arrow":   -1,
		"t3/v9/x00000001.arrow":     -1,
		"t3/v9/b0000001.arrow":      -1,
		"t3/v9/b00000001.arrow.tmp": -1,
		"t3/v9/b-0000001.arrow":     -1,
		"t3/f9.parquet":             -1,
	} {
		first, ok := BlockFirst(key)
		if ok != (want >= 0) || ok && int64(first) != want {
			t.Errorf("BlockFirst(%q) = %d, %v; want %d", key, first, ok, want)
		}
	}
}

// gatedFileLake holds every write of a regular (combined) file until gate
// closes, counting the writes held at once.
type gatedFileLake struct {
	*lake.Store
	gate    chan struct{}
	held    atomic.Int32
	most    atomic.Int32
	arrived chan struct{}
}

func (g *gatedFileLake) Put(ctx context.Context, key string, data []byte) error {
	if strings.HasSuffix(key, ".parquet") {
		n := g.held.Add(1)
		for m := g.most.Load(); n > m && !g.most.CompareAndSwap(m, n); m = g.most.Load() {
		}
		g.arrived <- struct{}{}
		<-g.gate
		g.held.Add(-1)
	}
	return g.Store.Put(ctx, key, data)
}

// TestCombinationsShareTheLimit: buffers sharing a one-slot CombineLimit
// combine one file at a time; the second waits for the first, then runs.
func TestCombinationsShareTheLimit(t *testing.T) {
	cat, _ := testTable(t)
	gl := &gatedFileLake{Store: memLake(t), gate: make(chan struct{}), arrived: make(chan struct{}, 2)}
	limit := NewCombineLimit(1)
	ctx := context.Background()
	var bufs []*Buffer
	for i := range 2 {
		tb, err := cat.CreateTable(ctx, fmt.Sprintf("t%d", i), catalog.Schema{Columns: []catalog.Column{
			{Name: "id", Type: types.Of(types.Int64)}, {Name: "name", Type: types.Of(types.String), Nullable: true}},
			PrimaryKey: []string{"id"}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(Config{TableID: tb.ID, Columns: testCols, Catalog: cat, Lake: gl, Combines: limit,
			BlockRows: 4, FileBlocks: 2, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	var open sync.Once
	t.Cleanup(func() {
		open.Do(func() { close(gl.gate) })
		for _, b := range bufs {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			b.Close(cctx)
			cancel()
		}
	})
	for _, b := range bufs {
		// A full file of 8 and a row of the next: the first is combined.
		rows := make([][]any, 9)
		for i := range rows {
			rows[i] = []any{int64(i), "x"}
		}
		if _, err := b.Append(ctx, 1, rows); err != nil {
			t.Fatal(err)
		}
	}
	<-gl.arrived // one combination writes its file and holds the slot
	deadline := time.Now().Add(10 * time.Second)
	for limit.Waiting() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d combinations wait for the slot, want 1", limit.Waiting())
		}
		time.Sleep(time.Millisecond)
	}
	if n := gl.held.Load(); n != 1 {
		t.Fatalf("%d combinations write at once, want 1", n)
	}
	open.Do(func() { close(gl.gate) })
	<-gl.arrived // the second runs once the first is done
	for _, b := range bufs {
		if err := b.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if st := b.Stats(); st.Combined != 1 {
			t.Fatalf("%d files combined, want 1", st.Combined)
		}
	}
	if m := gl.most.Load(); m != 1 {
		t.Fatalf("%d combinations wrote at once, want 1", m)
	}
}
