package skeena

import (
	"context"
	"encoding/binary"
	"math/rand"
	"testing"

	"github.com/retinadb/retina/internal/oltp/engine"
)

// BenchmarkMemoryOnly compares memory-only transactions on the engine
// alone and through the store (go test -bench MemoryOnly; with TMPDIR on a
// tmpfs the log sync stops dominating and the layer's cost shows).
func BenchmarkMemoryOnly(b *testing.B) {
	s := openStore(b, b.TempDir(), nil)
	defer s.Close()
	ctx := context.Background()
	const rows = 100_000
	key := func(i int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(i)) }
	row := make([]byte, 100)
	for lo := 0; lo < rows; lo += 1000 {
		tx := s.Begin()
		for i := lo; i < lo+1000; i++ {
			mustPut(b, tx, "m", string(key(i)), string(row))
		}
		mustCommit(b, tx)
	}
	mem, _ := s.Engines()
	b.Run("alone", func(b *testing.B) {
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			rng := rand.New(rand.NewSource(rand.Int63()))
			for pb.Next() {
				tx := mem.Begin(mem.LatestSnapshot(), engine.SnapshotIsolation)
				for a := 0; a < 10; a++ {
					k := key(rng.Intn(rows))
					tx.Get("m", k)
					if rng.Intn(5) == 0 {
						tx.Put("m", k, row)
					}
				}
				cts, err := tx.PreCommit()
				if err != nil {
					continue
				}
				tx.PostCommit(nil)
				mem.WaitDurable(ctx, max(cts, tx.Snapshot()))
			}
		})
	})
	b.Run("store", func(b *testing.B) {
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			rng := rand.New(rand.NewSource(rand.Int63()))
			for pb.Next() {
				tx := s.Begin()
				for a := 0; a < 10; a++ {
					k := key(rng.Intn(rows))
					tx.Get(ctx, "m", k)
					if rng.Intn(5) == 0 {
						tx.Put(ctx, "m", k, row)
					}
				}
				tx.Commit(ctx)
			}
		})
	})
}

// BenchmarkMemoryReadOnly is the layer's CPU cost without any log wait:
// read-only memory transactions on one goroutine.
func BenchmarkMemoryReadOnly(b *testing.B) {
	s := openStore(b, b.TempDir(), nil)
	defer s.Close()
	ctx := context.Background()
	key := func(i int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(i)) }
	tx := s.Begin()
	for i := 0; i < 1000; i++ {
		mustPut(b, tx, "m", string(key(i)), "row")
	}
	mustCommit(b, tx)
	mem, _ := s.Engines()
	b.Run("alone", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			tx := mem.Begin(mem.LatestSnapshot(), engine.SnapshotIsolation)
			for a := 0; a < 10; a++ {
				tx.Get("m", key((i*10+a)%1000))
			}
			cts, _ := tx.PreCommit()
			tx.PostCommit(nil)
			mem.WaitDurable(ctx, max(cts, tx.Snapshot()))
		}
	})
	b.Run("store", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			tx := s.Begin()
			for a := 0; a < 10; a++ {
				tx.Get(ctx, "m", key((i*10+a)%1000))
			}
			tx.Commit(ctx)
		}
	})
}
