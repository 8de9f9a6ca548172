package index

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/retinadb/retina/internal/types"
)

const (
	pkIndex  = 1 // unique (int64, string)
	secIndex = 2 // non-unique (int32)
)

var (
	pkCols  = []types.Type{types.Of(types.Int64), types.Of(types.String)}
	secCols = []types.Type{types.Of(types.Int32)}
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func openStore(t testing.TB, backend, dir string) *Store {
	t.Helper()
	s, err := Open(Config{Backend: backend, Dir: dir, CacheBytes: 32 << 20, MemTableBytes: 4 << 20, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []Def{
		{ID: pkIndex, Name: "pk", Columns: pkCols, Unique: true},
		{ID: secIndex, Name: "by_group", Columns: secCols},
	} {
		if err := s.Define(d); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func backends(t *testing.T, f func(t *testing.T, open func() *Store)) {
	t.Run("memory", func(t *testing.T) {
		f(t, func() *Store {
			s := openStore(t, "memory", "")
			t.Cleanup(func() { s.Close() })
			return s
		})
	})
	t.Run("pebble", func(t *testing.T) {
		f(t, func() *Store {
			s := openStore(t, "pebble", t.TempDir())
			t.Cleanup(func() { s.Close() })
			return s
		})
	})
}

// model is the oracle: entry → versions (ts → row id or tombstone).
type model map[string]map[uint64]int64 // value -1 = tombstone

func (m model) at(entry string, ts uint64) (uint64, bool) {
	best, val := uint64(0), int64(-1)
	for vts, v := range m[entry] {
		if vts <= ts && vts >= best {
			best, val = vts, v
		}
	}
	if best == 0 || val < 0 {
		return 0, false
	}
	return uint64(val), true
}

func (m model) set(entry string, ts uint64, v int64) {
	if m[entry] == nil {
		m[entry] = map[uint64]int64{}
	}
	m[entry][ts] = v
}

func (m model) purge(gcTS uint64) {
	for e, vs := range m {
		best := uint64(0)
		for ts := range vs {
			if ts <= gcTS && ts > best {
				best = ts
			}
		}
		if best == 0 {
			continue
		}
		for ts := range vs {
			if ts < best {
				delete(vs, ts)
			}
		}
		if vs[best] < 0 {
			delete(vs, best)
		}
		if len(vs) == 0 {
			delete(m, e)
		}
	}
}

// TestBackendsAgainstOracle applies random puts, tombstones, checked
// mutations, reverts of the newest timestamp and purges to both backends and
// compares lookups, scans and Each at random snapshots.
func TestBackendsAgainstOracle(t *testing.T) {
	backends(t, func(t *testing.T, open func() *Store) {
		ctx := context.Background()
		s := open()
		rng := rand.New(rand.NewPCG(4, 4))
		m := model{}
		pk := func(i int) Key {
			k, err := s.Key(pkIndex, int64(i%7), fmt.Sprintf("k%d", i))
			if err != nil {
				t.Fatal(err)
			}
			return k
		}
		sec := func(g int) Key {
			k, err := s.Key(secIndex, int64(g))
			if err != nil {
				t.Fatal(err)
			}
			return k
		}
		secEntry := func(g int, row uint64) string { return string(sec(g).entryKey(nil, row)) }
		ts, gc := uint64(1), uint64(0)
		var written []Written // versions written at ts, for a revert
		wrote := func(k Key, row uint64, entry string, v int64) {
			m.set(entry, ts, v)
			written = append(written, Written{Key: k, RowID: row, TS: ts})
		}
		next := func() { ts, written = ts+1, nil }
		for round := range 300 {
			var b Batch
			for range 1 + rng.IntN(20) {
				switch i, g, row := rng.IntN(60), rng.IntN(5), uint64(rng.IntN(40)); rng.IntN(4) {
				case 0, 1:
					b.Put(pk(i), ts, row)
					wrote(pk(i), row, string(pk(i).enc), int64(row))
				case 2:
					b.Tombstone(pk(i), ts, 0)
					wrote(pk(i), 0, string(pk(i).enc), -1)
				case 3:
					if rng.IntN(2) == 0 {
						b.Put(sec(g), ts, row)
						wrote(sec(g), row, secEntry(g, row), int64(row))
					} else {
						b.Tombstone(sec(g), ts, row)
						wrote(sec(g), row, secEntry(g, row), -1)
					}
				}
				if rng.IntN(3) == 0 {
					next()
				}
			}
			if err := s.Apply(ctx, &b); err != nil {
				t.Fatal(err)
			}
			// Checked mutations: each sees the ones before it in the call.
			var muts []Mutation
			for range rng.IntN(8) {
				i := rng.IntN(60)
				muts = append(muts, Mutation{Key: pk(i), TS: ts, Kind: MutKind(1 + rng.IntN(4)), RowID: uint64(rng.IntN(40))})
			}
			if _, err := s.Mutate(ctx, muts); err != nil {
				t.Fatal(err)
			}
			for _, mu := range muts {
				entry := string(mu.Key.enc)
				old, live := m.at(entry, mu.TS)
				wantErr := mu.Kind != Upsert && (mu.Kind == Insert) == live
				if (mu.Err != nil) != wantErr || (mu.Err != nil && !errors.Is(mu.Err, ErrConflict)) {
					t.Fatalf("round %d: %s at %d (live %v): err %v", round, mu.Kind, mu.TS, live, mu.Err)
				}
				if mu.Live != live || live && mu.Old != old {
					t.Fatalf("round %d: %s reported live %v old row %d, want %v %d", round, mu.Kind, mu.Live, mu.Old, live, old)
				}
				if mu.Err != nil {
					continue
				}
				if mu.Kind == Delete {
					wrote(mu.Key, 0, entry, -1)
				} else {
					wrote(mu.Key, mu.RowID, entry, int64(mu.RowID))
				}
			}
			if rng.IntN(6) == 0 { // roll back everything written at ts
				if err := s.Revert(ctx, written); err != nil {
					t.Fatal(err)
				}
				for _, w := range written {
					entry := string(w.Key.entryKey(nil, w.RowID))
					delete(m[entry], ts)
					if len(m[entry]) == 0 {
						delete(m, entry)
					}
				}
			}
			next()
			if rng.IntN(25) == 0 {
				gc = gc + uint64(rng.IntN(int(ts-gc)))
				if _, err := s.Purge(ctx, gc); err != nil {
					t.Fatal(err)
				}
				m.purge(gc)
			} else if rng.IntN(4) == 0 {
				// No snapshot below gc reads again: the memory backend drops
				// what a write supersedes below it, the model keeps it.
				gc = gc + uint64(rng.IntN(int(ts-gc)))
				s.SetHorizon(gc)
			}
			for range 10 {
				q := gc + uint64(rng.IntN(int(ts-gc)+1))
				i := rng.IntN(60)
				got, ok, err := s.Lookup(ctx, pk(i), q)
				want, wantOK := m.at(string(pk(i).enc), q)
				if err != nil || ok != wantOK || got != want {
					t.Fatalf("round %d: lookup k%d at %d: got %d,%v,%v want %d,%v", round, i, q, got, ok, err, want, wantOK)
				}
				g := rng.IntN(5)
				ids, err := s.Scan(ctx, sec(g), q)
				if err != nil {
					t.Fatal(err)
				}
				var wantIDs []uint64
				for row := range uint64(40) {
					if _, live := m.at(secEntry(g, row), q); live {
						wantIDs = append(wantIDs, row)
					}
				}
				if !slices.Equal(ids, wantIDs) {
					t.Fatalf("round %d: scan group %d at %d: got %v want %v", round, g, q, ids, wantIDs)
				}
			}
			q := gc + uint64(rng.IntN(int(ts-gc)+1))
			for _, id := range []uint32{pkIndex, secIndex} {
				got := map[string]uint64{}
				err := s.Each(ctx, id, q, func(k Key, row uint64) error {
					got[string(k.entryKey(nil, row))] = row
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				want := map[string]uint64{}
				for entry := range m {
					if binary.BigEndian.Uint32([]byte(entry)) != id {
						continue
					}
					if row, live := m.at(entry, q); live {
						want[entry] = row
					}
				}
				if !maps.Equal(got, want) {
					t.Fatalf("round %d: Each(%d) at %d: %d entries, want %d", round, id, q, len(got), len(want))
				}
			}
		}
	})
}

func TestErrors(t *testing.T) {
	backends(t, func(t *testing.T, open func() *Store) {
		ctx := context.Background()
		s := open()
		if _, err := s.Key(99, int64(1)); !errors.Is(err, ErrUnknownIndex) {
			t.Errorf("unknown index: %v", err)
		}
		if _, err := s.Key(pkIndex, "x", "y"); !errors.Is(err, ErrKeyMismatch) {
			t.Errorf("type mismatch: %v", err)
		}
		if err := s.Define(Def{ID: pkIndex, Name: "other", Columns: secCols}); !errors.Is(err, ErrBadDef) {
			t.Errorf("redefinition: %v", err)
		}
		if err := s.Define(Def{ID: 5, Name: "empty"}); !errors.Is(err, ErrBadDef) {
			t.Errorf("no columns: %v", err)
		}
		k, _ := s.Key(pkIndex, int64(1), "a")
		if err := s.Put(ctx, k, 0, 1); !errors.Is(err, ErrInvalidTS) {
			t.Errorf("ts 0: %v", err)
		}
		g, _ := s.Key(secIndex, int64(1))
		if _, _, err := s.Lookup(ctx, g, 5); !errors.Is(err, ErrBadDef) {
			t.Errorf("lookup on non-unique: %v", err)
		}
		if _, err := s.Scan(ctx, k, 5); !errors.Is(err, ErrBadDef) {
			t.Errorf("scan on unique: %v", err)
		}
		s.Close()
		if _, _, err := s.Lookup(ctx, k, 5); !errors.Is(err, ErrClosed) {
			t.Errorf("after close: %v", err)
		}
	})
	if _, err := Open(Config{Backend: "rocks"}); err == nil {
		t.Error("unknown backend accepted")
	}
}

func TestMainIndex(t *testing.T) {
	backends(t, func(t *testing.T, open func() *Store) {
		ctx := context.Background()
		s := open()
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(s.Register(ctx, RowRange{First: 100, N: 50}, Location{FileID: 1, RowGroup: 0, Offset: 0}))
		must(s.Register(ctx, RowRange{First: 150, N: 10}, Location{FileID: 2, RowGroup: 0, Offset: 500}))
		if err := s.Register(ctx, RowRange{First: 140, N: 20}, Location{FileID: 3}); !errors.Is(err, ErrOverlap) {
			t.Fatalf("overlapping register: %v", err)
		}
		loc, err := s.Locate(ctx, 123)
		if err != nil || loc != (Location{FileID: 1, Offset: 23}) {
			t.Fatalf("locate 123: %+v %v", loc, err)
		}
		if loc, err = s.Locate(ctx, 159); err != nil || loc != (Location{FileID: 2, Offset: 509}) {
			t.Fatalf("locate 159: %+v %v", loc, err)
		}
		for _, id := range []uint64{99, 160, 0} {
			if _, err := s.Locate(ctx, id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("locate %d: %v", id, err)
			}
		}
		// Storage GC moved rows 120..154 (crossing both ranges) to file 9.
		must(s.Remap(ctx, RowRange{First: 120, N: 35}, Location{FileID: 9, RowGroup: 1, Offset: 7}))
		checks := map[uint64]Location{
			119: {FileID: 1, Offset: 19},
			120: {FileID: 9, RowGroup: 1, Offset: 7},
			154: {FileID: 9, RowGroup: 1, Offset: 41},
			155: {FileID: 2, Offset: 505},
		}
		for id, want := range checks {
			if got, err := s.Locate(ctx, id); err != nil || got != want {
				t.Fatalf("after remap, locate %d: %+v %v, want %+v", id, got, err, want)
			}
		}
		if err := s.Remap(ctx, RowRange{First: 155, N: 10}, Location{FileID: 10}); !errors.Is(err, ErrOverlap) {
			t.Fatalf("remap of unmapped rows: %v", err)
		}
		n, err := s.DropRanges(ctx, 1, 2)
		if err != nil || n != 2 {
			t.Fatalf("drop files 1,2: %d %v", n, err)
		}
		if _, err := s.Locate(ctx, 110); !errors.Is(err, ErrNotFound) {
			t.Fatalf("row in a dropped file: %v", err)
		}
		if _, err := s.Locate(ctx, 130); err != nil {
			t.Fatalf("row in file 9: %v", err)
		}
	})
}

// TestPebbleReopenKeepsEverything: a clean reopen keeps SPI versions and the
// main index.
func TestPebbleReopenKeepsEverything(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, "pebble", dir)
	k, _ := s.Key(pkIndex, int64(1), "a")
	if err := s.Put(ctx, k, 5, 42); err != nil {
		t.Fatal(err)
	}
	if err := s.Register(ctx, RowRange{First: 1, N: 3}, Location{FileID: 4, Offset: 10}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openStore(t, "pebble", dir)
	defer s.Close()
	if id, ok, err := s.Lookup(ctx, k, 9); err != nil || !ok || id != 42 {
		t.Fatalf("after reopen: %d %v %v", id, ok, err)
	}
	if loc, err := s.Locate(ctx, 3); err != nil || loc.Offset != 12 {
		t.Fatalf("main index after reopen: %+v %v", loc, err)
	}
}

// TestPebbleWithoutWALKeepsWhatSyncFlushed: without a log, Sync is the
// durability point; a version written after it and never synced is not
// there after reopening, and one synced is, with the main index.
func TestPebbleWithoutWALKeepsWhatSyncFlushed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	open := func() *Store {
		s, err := Open(Config{Backend: "pebble", Dir: dir, NoWAL: true, CacheBytes: 32 << 20, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Define(Def{ID: pkIndex, Name: "pk", Columns: pkCols, Unique: true}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	synced, _ := s.Key(pkIndex, int64(1), "synced")
	unsynced, _ := s.Key(pkIndex, int64(2), "unsynced")
	if err := s.Put(ctx, synced, 5, 42); err != nil {
		t.Fatal(err)
	}
	if err := s.Register(ctx, RowRange{First: 1, N: 3}, Location{FileID: 4, Offset: 10}); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, unsynced, 6, 43); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open()
	defer s.Close()
	if id, ok, err := s.Lookup(ctx, synced, 9); err != nil || !ok || id != 42 {
		t.Fatalf("synced version after reopen: %d %v %v", id, ok, err)
	}
	if loc, err := s.Locate(ctx, 3); err != nil || loc.Offset != 12 {
		t.Fatalf("main index after reopen: %+v %v", loc, err)
	}
	if _, ok, err := s.Lookup(ctx, unsynced, 9); err != nil || ok {
		t.Fatalf("a version never synced survived a reopen without a log: %v %v", ok, err)
	}
}

// TestHelperIndexWriter is run as a child process by TestPebbleKillKeepsAcknowledged.
func TestHelperIndexWriter(t *testing.T) {
	dir := os.Getenv("RETINA_INDEX_HELPER_DIR")
	if dir == "" {
		t.Skip("helper process for TestPebbleKillKeepsAcknowledged")
	}
	s := openStore(t, "pebble", dir)
	out := bufio.NewWriter(os.Stdout)
	for i := 1; ; i++ {
		var b Batch
		for j := range 10 {
			k, _ := s.Key(pkIndex, int64(i), strconv.Itoa(j))
			b.Put(k, uint64(i), uint64(i*10+j))
		}
		if err := s.Apply(context.Background(), &b); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		if err := s.Register(context.Background(), RowRange{First: uint64(i * 10), N: 10}, Location{FileID: uint64(i)}); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		fmt.Fprintln(out, i) // acknowledged
		out.Flush()
	}
}

// TestPebbleKillKeepsAcknowledged kills a writer process with SIGKILL and
// checks that every batch it acknowledged is there after reopening.
func TestPebbleKillKeepsAcknowledged(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperIndexWriter$")
	cmd.Env = append(os.Environ(), "RETINA_INDEX_HELPER_DIR="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	acked := 0
	deadline := time.Now().Add(30 * time.Second)
	for acked < 3000 && time.Now().Before(deadline) && sc.Scan() {
		if strings.HasPrefix(sc.Text(), "error") {
			t.Fatal(sc.Text())
		}
		acked, _ = strconv.Atoi(sc.Text())
	}
	cmd.Process.Kill()
	cmd.Wait()
	if acked == 0 {
		t.Fatal("writer acknowledged nothing")
	}
	s := openStore(t, "pebble", dir)
	defer s.Close()
	ctx := context.Background()
	for i := 1; i <= acked; i++ {
		for j := range 10 {
			k, _ := s.Key(pkIndex, int64(i), strconv.Itoa(j))
			id, ok, err := s.Lookup(ctx, k, uint64(i))
			if err != nil || !ok || id != uint64(i*10+j) {
				t.Fatalf("acknowledged batch %d (of %d) lost: %d %v %v", i, acked, id, ok, err)
			}
		}
		if loc, err := s.Locate(ctx, uint64(i*10+5)); err != nil || loc.FileID != uint64(i) {
			t.Fatalf("acknowledged main-index range %d lost: %v", i, err)
		}
	}
	t.Logf("%d acknowledged batches all present after SIGKILL", acked)
}

// TestConcurrentBucketsAndLookups: writers apply batches on disjoint key
// ranges (buckets) while readers look up keys of every bucket; each reader
// checks that what it sees at a committed timestamp is exact.
func TestConcurrentBucketsAndLookups(t *testing.T) {
	backends(t, func(t *testing.T, open func() *Store) {
		s := open()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		const buckets, keysPer = 4, 200
		var done [buckets]struct {
			sync.Mutex
			ts uint64 // every version ≤ ts of this bucket is applied
		}
		// Readers register their snapshot so purge stays below every one.
		var regMu sync.Mutex
		readers := map[uint64]int{}
		var wg sync.WaitGroup
		for bkt := range buckets {
			wg.Go(func() {
				for ts := uint64(1); ctx.Err() == nil; ts++ {
					var b Batch
					for i := range keysPer {
						k, _ := s.Key(pkIndex, int64(bkt), strconv.Itoa(i))
						if (int(ts)+i)%5 == 0 {
							b.Tombstone(k, ts, 0)
						} else {
							b.Put(k, ts, ts*1000+uint64(i))
						}
					}
					if err := s.Apply(ctx, &b); err != nil {
						t.Error(err)
						return
					}
					done[bkt].Lock()
					done[bkt].ts = ts
					done[bkt].Unlock()
				}
			})
		}
		for r := range 4 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(r), 8))
				for ctx.Err() == nil {
					bkt, i := rng.IntN(buckets), rng.IntN(keysPer)
					regMu.Lock()
					done[bkt].Lock()
					ts := done[bkt].ts
					done[bkt].Unlock()
					readers[ts]++
					regMu.Unlock()
					k, _ := s.Key(pkIndex, int64(bkt), strconv.Itoa(i))
					id, ok, err := s.Lookup(ctx, k, ts)
					regMu.Lock()
					if readers[ts]--; readers[ts] == 0 {
						delete(readers, ts)
					}
					regMu.Unlock()
					if ts == 0 {
						continue
					}
					wantOK := (int(ts)+i)%5 != 0
					if err != nil || ok != wantOK || (ok && id != ts*1000+uint64(i)) {
						t.Errorf("bucket %d key %d at %d: %d %v %v", bkt, i, ts, id, ok, err)
						return
					}
				}
			})
		}
		var purged int
		wg.Go(func() {
			for ctx.Err() == nil {
				regMu.Lock()
				gc := uint64(1 << 62)
				for b := range done {
					done[b].Lock()
					gc = min(gc, done[b].ts)
					done[b].Unlock()
				}
				for ts := range readers {
					gc = min(gc, ts)
				}
				regMu.Unlock()
				n, err := s.Purge(ctx, gc)
				if err != nil {
					t.Error(err)
				}
				purged += n
				time.Sleep(50 * time.Millisecond)
			}
		})
		wg.Wait()
		if purged == 0 {
			t.Error("purge never removed a version")
		}
	})
}

// TestPebbleIndexOfAnotherComparerDoesNotOpen: an index directory written
// with Pebble's default comparer (no version split, no bloom filters) is
// refused at open, so the server rebuilds it instead of misreading it.
func TestPebbleIndexOfAnotherComparerDoesNotOpen(t *testing.T) {
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(Config{Backend: "pebble", Dir: dir, Logger: quiet()}); err == nil {
		s.Close()
		t.Fatal("an index made with another comparer opened")
	}
}
