package catalog

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestCorruptCatalogIsRefused: a catalog file truncated or with damaged
// bytes is refused with its path named, never a panic, and never loaded
// with other contents.
func TestCorruptCatalogIsRefused(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	c, err := Open(src)
	if err != nil {
		t.Fatal(err)
	}
	tb, _ := c.CreateTable(ctx, "t", accountSchema())
	first, _ := c.AllocateFileIDs(ctx, 200)
	for i := range uint64(200) {
		if _, err := c.RegisterFile(ctx, File{ID: first + i, TableID: tb.ID, Key: strings.Repeat("k", 200), State: Virtual}); err != nil {
			t.Fatal(err)
		}
	}
	want := describe(c.Snapshot())
	c.Close()
	good, err := os.ReadFile(filepath.Join(src, "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	refused := 0
	for trial := range 300 {
		bad := append([]byte(nil), good...)
		switch trial % 3 {
		case 0:
			bad = bad[:rng.IntN(len(bad))]
		case 1:
			at := rng.IntN(len(bad))
			bad[at] ^= byte(1 + rng.IntN(255))
		case 2:
			at := rng.IntN(len(bad) - 64)
			for i := range 64 {
				bad[at+i] = byte(rng.IntN(256))
			}
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "catalog.db")
		if err := os.WriteFile(path, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("trial %d: opening a damaged catalog panicked: %v", trial, p)
				}
			}()
			c, err := Open(dir)
			if err != nil {
				if !strings.Contains(err.Error(), path) {
					t.Fatalf("trial %d: the error does not name %s: %v", trial, path, err)
				}
				refused++
				return
			}
			defer c.Close()
			if got := describe(c.Snapshot()); got != want {
				t.Fatalf("trial %d: a damaged catalog opened with other contents:\n%s\nwant\n%s", trial, got, want)
			}
		}()
	}
	t.Logf("%d of 300 damaged catalogs refused (damage in free or unused pages is harmless)", refused)
}

// describe lists a snapshot's tables and files.
func describe(s *Snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version %d\n", s.Version())
	for _, t := range s.Tables() {
		fmt.Fprintf(&b, "table %d %s %d columns\n", t.ID, t.Name, len(t.Schema.Columns))
		for _, f := range s.Files(t.ID) {
			fmt.Fprintf(&b, "file %d %s %v %d rows\n", f.ID, f.Key, f.State, f.Rows())
		}
	}
	return b.String()
}

// TestLegacyCatalogGainsChecksums: a catalog written before value
// checksums (format 1) opens with the same contents and is checksummed
// from then on.
func TestLegacyCatalogGainsChecksums(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := openCat(t, dir)
	tb, _ := c.CreateTable(ctx, "t", accountSchema())
	id, _ := c.AllocateFileIDs(ctx, 1)
	if _, err := c.RegisterFile(ctx, File{ID: id, TableID: tb.ID, Key: "t/1", State: Virtual}); err != nil {
		t.Fatal(err)
	}
	want := describe(c.Snapshot())
	c.Close()
	db, err := bolt.Open(filepath.Join(dir, "catalog.db"), 0o644, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { // back to format 1
		if err := tx.Bucket(bucketMeta).Delete(keyFormat); err != nil {
			return err
		}
		for _, name := range [][]byte{bucketMeta, bucketTables, bucketFiles} {
			b := tx.Bucket(name)
			var keys, vals [][]byte
			b.ForEach(func(k, v []byte) error {
				keys, vals = append(keys, slices.Clone(k)), append(vals, slices.Clone(v[:len(v)-4]))
				return nil
			})
			for i := range keys {
				if err := b.Put(keys[i], vals[i]); err != nil {
					return err
				}
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		c := openCat(t, dir)
		if got := describe(c.Snapshot()); got != want {
			t.Fatalf("after conversion:\n%s\nwant\n%s", got, want)
		}
		c.Close()
	}
}
