package demo

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/iceberg"
	"github.com/retinadb/retina/internal/server"
)

// TestIcebergSnapshotsKeepTheBankInvariants: while the HyBench-like stream
// runs, the snapshots of every table published at one Retina timestamp
// hold the bank's cross-table invariants (the total over both account
// tables, an accepted application for every loan), read with iceberg-go
// through the REST catalog; after the stream, the last snapshots equal
// Retina's SQL table by table. Both format versions.
func TestIcebergSnapshotsKeepTheBankInvariants(t *testing.T) {
	for _, version := range []int{2, 3} {
		t.Run(map[int]string{2: "v2", 3: "v3"}[version], func(t *testing.T) {
			ctx := context.Background()
			p, err := startPipeline(ctx, pipelineConfig{SF: 0.002, Seed: uint64(version),
				Node: func(nc *server.NodeConfig) {
					nc.BlockRows, nc.FileBlocks = 256, 8 // files fill and combine during the run
					nc.Iceberg = server.IcebergConfig{Interval: time.Second, FormatVersion: version, Retention: time.Minute}
				},
				Server: func(c *server.Config) { c.IcebergAddr = "127.0.0.1:0" }})
			if err != nil {
				t.Fatal(err)
			}
			defer p.close()
			if err := p.load(ctx); err != nil {
				t.Fatal(err)
			}
			reader, err := newIcebergReader(ctx, p.srv.IcebergURI())
			if err != nil {
				t.Fatal(err)
			}
			published := make(chan iceberg.Published, 64)
			var once sync.Once
			p.srv.Node.Iceberg.Observe(func(r iceberg.Published) {
				select {
				case published <- r:
				default: // the checker is behind: it checks a later one
				}
			})
			checked := 0
			// The stream runs until three publications were checked (a loaded
			// machine publishes later, not fewer times), within a bound.
			const want = 3
			err = p.withStream(ctx, 20_000, newProbes(), false, func(ctx context.Context) error {
				bound := time.After(2 * time.Minute)
				for checked < want {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-bound:
						return fmt.Errorf("only %d of %d publications came in 2 minutes at a 1 s interval", checked, want)
					case r := <-published:
						failures, err := reader.bankInvariants(ctx, r.TS, p.gen.TotalBalance())
						if err != nil {
							return err
						}
						for _, f := range failures {
							once.Do(func() { t.Errorf("publication %d: %s", r.ID, f) })
						}
						checked++
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.waitCommitted(ctx); err != nil {
				t.Fatal(err)
			}
			w, err := p.srv.Node.Txn.Watermarks(ctx)
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				if _, ts := p.srv.Node.Iceberg.Current(); ts >= w.HWM-1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the last commit (%d) was not published in 30s", w.HWM-1)
				}
				time.Sleep(20 * time.Millisecond)
			}
			diffs, err := reader.tablesEqual(ctx, p.db, w.HWM-1)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range diffs {
				t.Error(d)
			}
		})
	}
}
