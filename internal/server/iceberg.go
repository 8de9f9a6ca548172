package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/checkpoint"
	"github.com/retinadb/retina/internal/iceberg"
	"github.com/retinadb/retina/internal/writebuffer"
)

// Iceberg publication, the node's part. A publication covers the state of
// a replay checkpoint, offered once the checkpoint is durable: what it
// names is then on disk, and a restart restores a state at or after it,
// so no published file is one a restore drops. While Iceberg snapshots
// name an object of Retina's (a regular file storage GC replaced), storage
// GC and the restore leave the object to the publisher.

// IcebergConfig turns publication on and tunes it.
type IcebergConfig struct {
	// Interval is the cadence of publications (0: off). Replay
	// checkpoints are taken at least this often while it is on.
	Interval      time.Duration
	FormatVersion int
	Retention     time.Duration
}

func (c IcebergConfig) on() bool { return c.Interval > 0 }

// openIceberg loads what was published before, ahead of the restore, so
// that the restore keeps the objects published snapshots name.
func (n *Node) openIceberg(ctx context.Context) error {
	if !n.Config.Iceberg.on() {
		return nil
	}
	if _, ok := n.Lake.ObjectURI(iceberg.RecordKey); !ok {
		n.log.Info("the tables are not published as Iceberg tables: other engines cannot open the objects of this lake", "lake", n.Lake.URL())
		return nil
	}
	p, err := iceberg.Open(ctx, iceberg.Config{Lake: n.Lake, Buffers: n.buffer, FormatVersion: n.Config.Iceberg.FormatVersion,
		Interval: n.Config.Iceberg.Interval, Retention: n.Config.Iceberg.Retention, Live: n.liveObject, Combined: n.combined,
		Failpoints: n.Config.Failpoints, Logger: n.log})
	if err != nil {
		return err
	}
	n.Iceberg = p
	return nil
}

// startIceberg runs after the restore: it deletes what nothing names any
// more (objects of Retina's that only expired snapshots named, files of
// publications that did not commit) and publishes the restored state when
// it is newer than the last publication.
func (n *Node) startIceberg(ctx context.Context) error {
	if n.Iceberg == nil {
		return nil
	}
	if err := n.sweepUnnamedFiles(ctx); err != nil {
		return err
	}
	if err := n.Iceberg.Sweep(ctx); err != nil {
		return err
	}
	m := n.restored
	if m == nil || m.TS == 0 {
		return nil
	}
	st, err := n.restoredState(m)
	if err != nil {
		return err
	}
	if err := n.Iceberg.Publish(ctx, st); err != nil {
		n.log.Warn("could not publish the restored state to Iceberg; the next checkpoint tries again", "snapshot_ts", m.TS, "err", err)
	}
	return nil
}

// sweepUnnamedFiles deletes regular and storage-GC objects that neither the
// catalog nor a retained Iceberg snapshot names: objects storage GC left
// to the publisher, whose snapshots expired while the process was down.
func (n *Node) sweepUnnamedFiles(ctx context.Context) error {
	snap := n.Catalog.Snapshot()
	for _, t := range snap.Tables() {
		named := map[string]bool{}
		for _, f := range snap.Files(t.ID) {
			named[f.Key] = true
		}
		for _, prefix := range []string{fmt.Sprintf("t%d/f", t.ID), fmt.Sprintf("t%d/g", t.ID)} {
			objs, err := n.Lake.List(ctx, prefix)
			if err != nil {
				return fmt.Errorf("server: list the files of %s: %w", t.Name, err)
			}
			for _, o := range objs {
				if named[o.Key] || n.keeps(o.Key) {
					continue
				}
				if err := n.Lake.Delete(ctx, o.Key); err != nil {
					return fmt.Errorf("server: delete %s, which nothing names any more: %w", o.Key, err)
				}
			}
		}
	}
	return nil
}

// keeps says a published snapshot (or a publication under way) names an
// object, which the publisher then deletes itself when it may.
func (n *Node) keeps(key string) bool { return n.Iceberg != nil && n.Iceberg.Keeps(key) }

// liveObject says the catalog still names an object.
func (n *Node) liveObject(key string) bool {
	snap := n.Catalog.Snapshot()
	for _, t := range snap.Tables() {
		if !strings.HasPrefix(key, fmt.Sprintf("t%d/", t.ID)) {
			continue
		}
		for _, f := range snap.Files(t.ID) {
			if f.Key == key {
				return true
			}
		}
	}
	return false
}

// combined says a file is regular in the catalog now, with its rows.
func (n *Node) combined(id uint64) (int64, bool) {
	f, ok := n.Catalog.Snapshot().File(id)
	if !ok || f.State == catalog.Virtual || len(f.RowGroups) == 0 {
		return 0, false
	}
	return f.Rows(), true
}

// buffer is a replayer's write buffer of a table.
func (n *Node) buffer(replayer, table uint32) (*writebuffer.Buffer, error) {
	if int(replayer) >= len(n.Replayers) {
		return nil, fmt.Errorf("server: replayer %d of %d", replayer, len(n.Replayers))
	}
	return n.Replayers[replayer].Buffer(table)
}

// icebergState is the state a checkpoint captured, for publication:
// tables at the seal, each live file with its rows and deleted set at ts.
func icebergState(m *checkpoint.Manifest, snap *catalog.Snapshot, sealed time.Time, deleted map[uint64][]uint64) *iceberg.State {
	st := &iceberg.State{TS: m.TS, Sealed: sealed}
	for _, src := range m.Sources {
		pos, _ := json.Marshal(src.Resume)
		st.Sources = append(st.Sources, iceberg.Source{URI: src.URI, Position: string(pos)})
	}
	byTable := map[uint32]*iceberg.TableState{}
	for _, t := range snap.Tables() {
		byTable[t.ID] = &iceberg.TableState{Table: t}
	}
	for _, f := range m.Files {
		ts, ok := byTable[f.Table]
		if !ok {
			continue
		}
		key := writebuffer.RegularKey(f.Table, f.ID)
		if cf, ok := snap.File(f.ID); ok {
			key = cf.Key
		}
		ts.Files = append(ts.Files, iceberg.FileState{ID: f.ID, Key: key, Replayer: f.Replayer, Virtual: f.Virtual, Rows: f.Rows, Deleted: deleted[f.ID]})
	}
	for _, t := range snap.Tables() {
		st.Tables = append(st.Tables, *byTable[t.ID])
	}
	return st
}

// restoredState is the state the restore brought back: every file regular,
// with its deleted set at the checkpoint.
func (n *Node) restoredState(m *checkpoint.Manifest) (*iceberg.State, error) {
	snap := n.Catalog.Snapshot()
	cur := &checkpoint.Manifest{TS: m.TS, Sources: m.Sources}
	deleted := map[uint64][]uint64{}
	for _, t := range snap.Tables() {
		for _, f := range snap.LiveFiles(t.ID) {
			vis, ok := n.Replayers[f.Replayer].FileVisibility(f.ID)
			if !ok {
				return nil, fmt.Errorf("server: replayer %d does not hold the visibility of file %d", f.Replayer, f.ID)
			}
			cp, err := vis.Checkpoint(m.TS)
			if err != nil {
				return nil, fmt.Errorf("server: deletes of file %d at %d: %w", f.ID, m.TS, err)
			}
			deleted[f.ID] = cp.Bitmap
			cur.Files = append(cur.Files, checkpoint.File{ID: f.ID, Table: t.ID, Replayer: f.Replayer, Virtual: f.State == catalog.Virtual, Rows: f.Rows()})
		}
	}
	return icebergState(cur, snap, time.Now(), deleted), nil
}
