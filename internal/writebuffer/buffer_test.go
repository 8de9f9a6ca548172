package writebuffer

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

func newBuffer(t *testing.T, l Lake, blockRows, fileBlocks int) (*Buffer, *catalog.Catalog) {
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
	b, err := New(Config{TableID: tb.ID, Columns: testCols, Catalog: cat, Lake: l,
		BlockRows: blockRows, FileBlocks: fileBlocks, FlushWorkers: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close(context.Background()) })
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
// run, every view of every file covers exactly the rows appended before it,
// each offset once, and its flushed objects stay readable until release.
func TestViewsNeverMissOrDoubleRows(t *testing.T) {
	store := memLake(t)
	b, _ := newBuffer(t, store, 32, 4)
	ctx := context.Background()
	var appended atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(stop)
		for i := range 3000 {
			row := []any{int64(i), nil}
			if _, err := b.Append(ctx, uint64(i+1), [][]any{row}); err != nil {
				t.Error(err)
				return
			}
			appended.Add(1)
		}
	})
	views := 0
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		default:
		}
		before := appended.Load()
		v := b.View(b.VirtualFiles()...)
		seen := int64(0)
		for _, fv := range v.Files {
			if fv.Regular {
				// Combined: all its rows are in the regular object.
				if _, err := store.Size(ctx, fv.Key); err != nil {
					t.Fatalf("combined file %d unreadable: %v", fv.FileID, err)
				}
				if fv.Vis != nil {
					seen += int64(fv.Vis.Rows())
				}
				continue
			}
			next := uint32(0)
			for _, bv := range fv.Blocks {
				if bv.First != next {
					t.Fatalf("file %d: block at %d, expected %d (gap or overlap)", fv.FileID, bv.First, next)
				}
				rows := 0
				for _, r := range bv.Records {
					rows += int(r.NumRows())
				}
				if bv.Records == nil {
					if _, err := store.Size(ctx, bv.Key); err != nil {
						t.Fatalf("flushed block %s unreadable inside a view: %v", bv.Key, err)
					}
					rows = bv.Rows
				}
				if rows != bv.Rows {
					t.Fatalf("block at %d: records hold %d rows, view says %d", bv.First, rows, bv.Rows)
				}
				next += uint32(rows)
			}
			seen += int64(next)
		}
		// Files already cleaned are not listed; count only when none were.
		if st := b.Stats(); st.Combined == 0 && seen < before {
			t.Fatalf("view shows %d rows, %d were appended before it", seen, before)
		}
		v.Release()
		views++
	}
	wg.Wait()
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st := b.Stats()
	if st.Combined < 20 || views < 10 {
		t.Fatalf("too little happened: %+v, %d views", st, views)
	}
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
