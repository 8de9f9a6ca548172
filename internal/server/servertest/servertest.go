// Package servertest opens embedded nodes for tests and applies mirror
// transactions to them the way the sink does.
package servertest

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/server"
)

// NotYetReplicated reports the error of a query that names a table Retina
// does not have (undefined_table). A table created at the source reaches
// Retina with the commit stream, after the source acknowledged it, so a
// test that waits for Retina to converge waits through this state too.
func NotYetReplicated(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
}

// Quiet is a logger that drops everything.
func Quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// OpenNode opens a node on a temporary directory with an in-memory lake and
// small write-buffer blocks (so flushes and combinations happen often),
// closed when the test ends.
func OpenNode(t testing.TB) *server.Node { return OpenNodeWith(t, 64, 4) }

// OpenNodeWith is OpenNode with a given write-buffer shape.
func OpenNodeWith(t testing.TB, blockRows, fileBlocks int) *server.Node {
	t.Helper()
	return OpenNodeTuned(t, func(c *server.NodeConfig) { c.BlockRows, c.FileBlocks = blockRows, fileBlocks })
}

// OpenNodeTuned is OpenNode with changes to its configuration.
func OpenNodeTuned(t testing.TB, tune func(*server.NodeConfig)) *server.Node {
	t.Helper()
	cfg := server.NodeConfig{DataDir: t.TempDir(), Lake: "mem://", BlockRows: 64, FileBlocks: 4, Replayers: 2, Logger: Quiet()}
	tune(&cfg)
	n, err := server.OpenNode(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(context.Background()) })
	return n
}

// Apply runs one mirror transaction on replayer 0 and commits it; it
// returns the transaction's timestamp. Safe for concurrent use.
func Apply(t testing.TB, n *server.Node, ops ...change.Op) uint64 {
	t.Helper()
	ctx := context.Background()
	r, err := n.Txn.BeginMirror(ctx, 1)
	if err != nil {
		t.Error(err)
		return 0
	}
	for i := range ops {
		ops[i].TS = r.First
	}
	if err := n.Replayers[0].Apply(ctx, replay.Batch{Bucket: 0, Buckets: 1, Ops: ops, Stable: r.First}); err != nil {
		t.Error(err)
		return 0
	}
	if err := n.Txn.CommitMirror(ctx, r.First); err != nil {
		t.Error(err)
	}
	return r.First
}

// CreateTable adds a table with the given primary key.
func CreateTable(t testing.TB, n *server.Node, name string, cols []catalog.Column, pk string) *catalog.Table {
	t.Helper()
	tb, err := n.Catalog.CreateTable(context.Background(), name, catalog.Schema{Columns: cols, PrimaryKey: []string{pk}})
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// Query runs a statement over SQL at the current snapshot and returns its
// rows' values.
func Query(t testing.TB, n *server.Node, sql string) [][]any {
	t.Helper()
	ctx := context.Background()
	sess, err := n.Engine.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	res, err := sess.Run(ctx, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	defer res.Close()
	var out [][]any
	for res.Next() {
		v, err := res.Values()
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		out = append(out, slices.Clone(v))
	}
	if err := res.Err(); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}
