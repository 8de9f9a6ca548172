package catalog

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/types"
)

func openCat(t testing.TB, dir string) *Catalog {
	t.Helper()
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func accountSchema() Schema {
	return Schema{
		Columns: []Column{
			{Name: "id", Type: types.Of(types.Int64)},
			{Name: "owner", Type: types.Of(types.String), Nullable: true},
			{Name: "balance", Type: types.DecimalOf(18, 2)},
		},
		PrimaryKey: []string{"id"},
		Indexes:    []Index{{Name: "by_owner", Columns: []string{"owner"}}},
	}
}

func TestTablesAndSchemas(t *testing.T) {
	ctx := context.Background()
	c := openCat(t, t.TempDir())
	tb, err := c.CreateTable(ctx, "account", accountSchema())
	if err != nil {
		t.Fatal(err)
	}
	if tb.PrimaryIndexID == 0 || tb.Schema.Indexes[0].ID == tb.PrimaryIndexID {
		t.Fatalf("index ids: pk %d, secondary %d", tb.PrimaryIndexID, tb.Schema.Indexes[0].ID)
	}
	if _, err := c.CreateTable(ctx, "ACCOUNT", accountSchema()); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	bad := []Schema{
		{},
		{Columns: []Column{{Name: "a", Type: types.Of(types.Int64)}}},
		{Columns: []Column{{Name: "a", Type: types.Of(types.Int64), Nullable: true}}, PrimaryKey: []string{"a"}},
		{Columns: []Column{{Name: "a", Type: types.Of(types.Int64)}, {Name: "A", Type: types.Of(types.Int64)}}, PrimaryKey: []string{"a"}},
		{Columns: []Column{{Name: "_retina_create_ts", Type: types.Of(types.Int64)}}, PrimaryKey: []string{"_retina_create_ts"}},
		{Columns: []Column{{Name: "a", Type: types.Type{Kind: types.Decimal, Precision: 50}}}, PrimaryKey: []string{"a"}},
		{Columns: []Column{{Name: "a", Type: types.Of(types.Int64)}}, PrimaryKey: []string{"b"}},
	}
	for i, s := range bad {
		if _, err := c.CreateTable(ctx, fmt.Sprintf("bad%d", i), s); !errors.Is(err, ErrInvalid) {
			t.Errorf("bad schema %d accepted: %v", i, err)
		}
	}
	if _, err := c.AddColumn(ctx, tb.ID, Column{Name: "note", Type: types.Of(types.String)}); !errors.Is(err, ErrSchemaChange) {
		t.Fatalf("NOT NULL column added: %v", err)
	}
	t2, err := c.AddColumn(ctx, tb.ID, Column{Name: "note", Type: types.Of(types.String), Nullable: true})
	if err != nil || t2.SchemaVersion != 2 || len(t2.Schema.Columns) != 4 {
		t.Fatalf("add column: %+v %v", t2, err)
	}
	if old, _ := c.Snapshot().Table("account"); len(old.Schema.Columns) != 4 {
		t.Fatal("snapshot does not show the new column")
	}
	if len(tb.Schema.Columns) != 3 {
		t.Fatal("an earlier table record changed")
	}
	if err := c.DropTable(ctx, tb.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Snapshot().Table("account"); ok {
		t.Fatal("dropped table still listed")
	}
}

func TestFilesStatesAndSwaps(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := openCat(t, dir)
	tb, _ := c.CreateTable(ctx, "t", accountSchema())
	first, err := c.AllocateFileIDs(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.RegisterFile(ctx, File{ID: first, TableID: tb.ID, Key: "t/1", State: Virtual})
	if err != nil {
		t.Fatal(err)
	}
	before := c.Snapshot()
	if _, err := c.RegisterFile(ctx, File{ID: first + 10, TableID: tb.ID, Key: "x", State: Regular}); !errors.Is(err, ErrUnallocated) {
		t.Fatalf("unallocated id: %v", err)
	}
	if _, err := c.RegisterFile(ctx, File{ID: first, TableID: tb.ID, Key: "x", State: Regular}); !errors.Is(err, ErrExists) {
		t.Fatalf("id reused: %v", err)
	}
	if _, err := c.SetFileState(ctx, v.ID, Aging, nil); !errors.Is(err, ErrBadState) {
		t.Fatalf("virtual → aging: %v", err)
	}
	groups := []lake.RowGroupMeta{{Rows: 100, MinCreateTS: 3, MaxCreateTS: 9}}
	reg, err := c.SetFileState(ctx, v.ID, Regular, groups)
	if err != nil || reg.Rows() != 100 || reg.State != Regular {
		t.Fatalf("combination: %+v %v", reg, err)
	}
	if f, _ := before.File(v.ID); f.State != Virtual {
		t.Fatal("an older snapshot changed")
	}
	if _, err := c.RegisterFile(ctx, File{ID: first + 1, TableID: tb.ID, Key: "t/2", State: Regular, RowGroups: groups}); err != nil {
		t.Fatal(err)
	}
	// A failing swap (unknown file to remove) changes nothing at all.
	ver := c.Snapshot().Version()
	_, err = c.Swap(ctx, tb.ID, []uint64{v.ID, 999}, []File{{ID: first + 2, Key: "t/3", State: Regular}})
	if !errors.Is(err, ErrNotFound) || c.Snapshot().Version() != ver {
		t.Fatalf("failed swap: %v, version %d → %d", err, ver, c.Snapshot().Version())
	}
	if f, _ := c.Snapshot().File(v.ID); f.State != Regular {
		t.Fatal("failed swap retired a file")
	}
	if _, ok := c.Snapshot().File(first + 2); ok {
		t.Fatal("failed swap added a file")
	}
	s, err := c.Swap(ctx, tb.ID, []uint64{v.ID, first + 1}, []File{{ID: first + 2, Key: "t/3", State: Regular, RowGroups: []lake.RowGroupMeta{{Rows: 150}}}})
	if err != nil {
		t.Fatal(err)
	}
	live := s.LiveFiles(tb.ID)
	if len(live) != 1 || live[0].ID != first+2 || live[0].Rows() != 150 {
		t.Fatalf("after swap: %v", live)
	}
	if err := c.DeleteFile(ctx, first+2); !errors.Is(err, ErrBadState) {
		t.Fatalf("delete of a live file: %v", err)
	}
	if err := c.DeleteFile(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	// Everything survives a reopen, ids keep growing.
	c.Close()
	c = openCat(t, dir)
	s2 := c.Snapshot()
	if s2.Version() != s.Version()+1 || len(s2.LiveFiles(tb.ID)) != 1 {
		t.Fatalf("after reopen: version %d, live %v", s2.Version(), s2.LiveFiles(tb.ID))
	}
	if _, ok := s2.File(v.ID); ok {
		t.Fatal("deleted file came back")
	}
	next, _ := c.AllocateFileIDs(ctx, 1)
	if next != first+3 {
		t.Fatalf("file id after reopen %d, want %d", next, first+3)
	}
}

// TestConcurrentRegistrationsAndSwaps: writers register files and swap pairs
// of them for one file of the same rows while readers check that every
// snapshot shows the same total of live rows per table: a swap is never
// half visible.
// TestSwapAllIsOneChange: swaps of several tables land in one change
// (one catalog version, one durable write), and one bad swap among them
// leaves every table as it was.
func TestSwapAllIsOneChange(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := openCat(t, dir)
	a, _ := c.CreateTable(ctx, "a", accountSchema())
	b, _ := c.CreateTable(ctx, "b", accountSchema())
	first, err := c.AllocateFileIDs(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	groups := []lake.RowGroupMeta{{Rows: 10}}
	for i, tb := range []*Table{a, b} {
		if _, err := c.RegisterFile(ctx, File{ID: first + uint64(i), TableID: tb.ID, Key: fmt.Sprintf("old/%d", i), State: Regular, RowGroups: groups}); err != nil {
			t.Fatal(err)
		}
	}
	good := []FileSwap{
		{Table: a.ID, Remove: []uint64{first}, Add: []File{{ID: first + 2, Key: "new/a", State: Regular, RowGroups: groups}}},
		{Table: b.ID, Remove: []uint64{first + 1}, Add: []File{{ID: first + 3, Key: "new/b", State: Regular, RowGroups: groups}}},
	}
	bad := []FileSwap{good[0], {Table: b.ID, Remove: []uint64{first}}} // file first is a's
	ver := c.Snapshot().Version()
	if _, err := c.SwapAll(ctx, bad); !errors.Is(err, ErrNotFound) {
		t.Fatalf("swap naming another table's file: %v", err)
	}
	if c.Snapshot().Version() != ver {
		t.Fatal("a failed SwapAll changed the catalog")
	}
	if f, _ := c.Snapshot().File(first); f.State != Regular {
		t.Fatal("a failed SwapAll retired a file of its good part")
	}
	s, err := c.SwapAll(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	if s.Version() != ver+1 {
		t.Fatalf("two swaps took %d changes, want 1", s.Version()-ver)
	}
	c.Close()
	c = openCat(t, dir) // and they are durable
	for _, want := range []struct {
		table uint32
		file  uint64
	}{{a.ID, first + 2}, {b.ID, first + 3}} {
		live := c.Snapshot().LiveFiles(want.table)
		if len(live) != 1 || live[0].ID != want.file {
			t.Fatalf("table %d after reopen: %v, want file %d alone", want.table, live, want.file)
		}
	}
}

func TestConcurrentRegistrationsAndSwaps(t *testing.T) {
	ctx := context.Background()
	c := openCat(t, t.TempDir())
	const tables, perTable = 3, 10
	var ids [tables]uint32
	for i := range ids {
		tb, err := c.CreateTable(ctx, fmt.Sprintf("t%d", i), accountSchema())
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = tb.ID
		for range perTable {
			id, _ := c.AllocateFileIDs(ctx, 1)
			if _, err := c.RegisterFile(ctx, File{ID: id, TableID: tb.ID, Key: fmt.Sprint(id), State: Regular, RowGroups: []lake.RowGroupMeta{{Rows: 10}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rows := func(s *Snapshot, tid uint32) int64 {
		var n int64
		for _, f := range s.LiveFiles(tid) {
			n += f.Rows()
		}
		return n
	}
	stop := make(chan struct{})
	var writers, readers sync.WaitGroup
	for i := range tables {
		writers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for range 40 {
				live := c.Snapshot().LiveFiles(ids[i])
				// Merge two files into one, or split one into two (a fresh
				// registration), keeping the table's rows constant.
				var remove []uint64
				var add []File
				var rowsOut []int64
				if a, b := live[rng.IntN(len(live))], live[rng.IntN(len(live))]; len(live) > 3 && a.ID != b.ID {
					remove, rowsOut = []uint64{a.ID, b.ID}, []int64{a.Rows() + b.Rows()}
				} else if a.Rows() >= 2 {
					remove, rowsOut = []uint64{a.ID}, []int64{a.Rows() / 2, a.Rows() - a.Rows()/2}
				} else {
					continue
				}
				first, err := c.AllocateFileIDs(ctx, len(rowsOut))
				if err != nil {
					t.Error(err)
					return
				}
				for j, r := range rowsOut {
					id := first + uint64(j)
					add = append(add, File{ID: id, Key: fmt.Sprint(id), State: Regular, RowGroups: []lake.RowGroupMeta{{Rows: r}}})
				}
				if _, err := c.Swap(ctx, ids[i], remove, add); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	checks := 0
	var mu sync.Mutex
	for range 4 {
		readers.Go(func() {
			for did := 0; ; did++ {
				select {
				case <-stop:
					if did >= 25 { // each reader checks its share, however fast the writers were
						return
					}
				default:
				}
				s := c.Snapshot()
				for _, tid := range ids {
					if n := rows(s, tid); n != 10*perTable {
						t.Errorf("version %d, table %d: %d live rows, want %d", s.Version(), tid, n, 10*perTable)
						return
					}
				}
				mu.Lock()
				checks++
				mu.Unlock()
			}
		})
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	if v := c.Snapshot().Version(); v < 3*40 {
		t.Fatalf("catalog version %d after at least %d swaps", v, 3*40)
	}
	t.Logf("%d reader checks", checks)
}

// TestHelperCatalogWriter runs in a child process for TestKillKeepsAcknowledged.
func TestHelperCatalogWriter(t *testing.T) {
	dir := os.Getenv("RETINA_CATALOG_HELPER_DIR")
	if dir == "" {
		t.Skip("helper process for TestKillKeepsAcknowledged")
	}
	c, err := Open(dir)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	ctx := context.Background()
	tb, err := c.CreateTable(ctx, "t", accountSchema())
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	for {
		id, err := c.AllocateFileIDs(ctx, 1)
		if err == nil {
			_, err = c.RegisterFile(ctx, File{ID: id, TableID: tb.ID, Key: fmt.Sprint(id), State: Virtual})
		}
		if err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		fmt.Fprintln(out, id)
		out.Flush()
	}
}

func TestKillKeepsAcknowledged(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCatalogWriter$")
	cmd.Env = append(os.Environ(), "RETINA_CATALOG_HELPER_DIR="+dir)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	var acked []uint64
	deadline := time.Now().Add(20 * time.Second)
	for len(acked) < 200 && time.Now().Before(deadline) && sc.Scan() {
		if strings.HasPrefix(sc.Text(), "error") {
			t.Fatal(sc.Text())
		}
		id, _ := strconv.ParseUint(sc.Text(), 10, 64)
		acked = append(acked, id)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if len(acked) == 0 {
		t.Fatal("writer acknowledged nothing")
	}
	c := openCat(t, dir)
	s := c.Snapshot()
	for _, id := range acked {
		if f, ok := s.File(id); !ok || f.State != Virtual {
			t.Fatalf("acknowledged file %d lost after SIGKILL", id)
		}
	}
	next, err := c.AllocateFileIDs(context.Background(), 1)
	if err != nil || next <= acked[len(acked)-1] {
		t.Fatalf("file id %d reissued after SIGKILL (last acknowledged %d): %v", next, acked[len(acked)-1], err)
	}
}

// TestTableLookupIgnoresCase: a table is found under any case of its name,
// ASCII or not, and a lookup of an ASCII name allocates nothing (ingestion
// does one per change).
func TestTableLookupIgnoresCase(t *testing.T) {
	ctx := context.Background()
	c := openCat(t, t.TempDir())
	for _, name := range []string{"savingAccount", "Überweisung"} {
		if _, err := c.CreateTable(ctx, name, accountSchema()); err != nil {
			t.Fatal(err)
		}
	}
	snap := c.Snapshot()
	for _, name := range []string{"savingAccount", "SAVINGACCOUNT", "savingaccount", "überweisung", "ÜBERWEISUNG"} {
		if _, ok := snap.Table(name); !ok {
			t.Errorf("table %q not found", name)
		}
	}
	if _, ok := snap.Table("savingAccounts"); ok {
		t.Error("a longer name matched")
	}
	if n := testing.AllocsPerRun(100, func() { snap.Table("savingAccount") }); n != 0 {
		t.Errorf("a lookup allocates %.0f times", n)
	}
}
