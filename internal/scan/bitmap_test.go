package scan_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/scan"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// TestSmallScanBuildsASmallBitmap: a scan of ten rows in a virtual file of
// a million-row capacity reads the visibility of the tiles it covers, not
// a whole-file bitmap (128 KiB), and still hides the deleted rows.
func TestSmallScanBuildsASmallBitmap(t *testing.T) {
	n := servertest.OpenNodeWith(t, 8192, 128)
	tb := servertest.CreateTable(t, n, "small", []catalog.Column{{Name: "id", Type: types.Of(types.Int64)}}, "id")
	var ops []change.Op
	for i := range 10 {
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(i)}})
	}
	servertest.Apply(t, n, ops...)
	servertest.Apply(t, n, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{int64(3)}}, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{int64(7)}})
	ctx := context.Background()
	w, err := n.Txn.Watermarks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := scan.Request{Table: tb, Files: n.Catalog.Snapshot().LiveFiles(tb.ID), Snapshot: w.HWM - 1, Columns: []int{0}}
	scanOnce := func() int64 {
		rows, _ := scanRows(t, n.Scanner, req)
		return rows
	}
	scanOnce() // warm up what a first scan sets up once
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rows := scanOnce()
	runtime.ReadMemStats(&after)
	if rows != 8 {
		t.Fatalf("scanned %d rows, want 8 (10 inserted, 2 deleted)", rows)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<10 {
		t.Fatalf("a scan of 10 rows allocated %d KiB: it built more than the bitmap of the rows it read", alloc>>10)
	}
}

// TestDeadBlocksAndGroupsAreNotRead: blocks and row groups whose versions
// are all deleted at the snapshot (a table that purges its oldest rows)
// are skipped unread, in write-buffer files and in combined ones.
func TestDeadBlocksAndGroupsAreNotRead(t *testing.T) {
	// Blocks of 16 rows, combined groups of 256; a file holds 2048 rows, so
	// the 1536 written stay in one virtual file until Finish combines it
	// (a full file could be combined before the first scan).
	n := servertest.OpenNodeWith(t, 16, 128)
	tb := servertest.CreateTable(t, n, "history", []catalog.Column{{Name: "id", Type: types.Of(types.Int64)}}, "id")
	var ops []change.Op
	for i := range 1024 {
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(i)}})
	}
	servertest.Apply(t, n, ops...)
	ops = ops[:0]
	for i := range 1024 {
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Delete, Key: []any{int64(i)}})
	}
	servertest.Apply(t, n, ops...)
	ops = ops[:0]
	for i := 1024; i < 1536; i++ {
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(i)}})
	}
	servertest.Apply(t, n, ops...)
	ctx := context.Background()
	scanAll := func() (int64, scan.Stats) {
		w, err := n.Txn.Watermarks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		req := scan.Request{Table: tb, Files: n.Catalog.Snapshot().LiveFiles(tb.ID), Snapshot: w.HWM - 1, Columns: []int{0}}
		return scanRows(t, n.Scanner, req)
	}
	rows, st := scanAll()
	if rows != 512 || st.DeadSkipped < 32 || st.RowsRead > 1024 {
		t.Fatalf("write-buffer files: %d rows out, %d read, %d dead blocks skipped; want 512 out, at most 1024 read, 32 skipped or more", rows, st.RowsRead, st.DeadSkipped)
	}
	for _, rp := range n.Replayers {
		if err := rp.Finish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rows, st = scanAll()
	if rows != 512 || st.DeadSkipped < 2 {
		t.Fatalf("combined files: %d rows out, %d dead row groups skipped; want 512 and 2 or more", rows, st.DeadSkipped)
	}
}

// scanRows runs a scan and counts the rows it emits.
func scanRows(t *testing.T, sc *scan.Scanner, req scan.Request) (int64, scan.Stats) {
	t.Helper()
	var rows int64
	st, err := sc.Scan(context.Background(), req, func(rec arrow.RecordBatch) error {
		rows += rec.NumRows()
		rec.Release()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rows, st
}
