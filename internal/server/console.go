package server

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/retinadb/retina/internal/buildinfo"
	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/console"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/oltp/htap"
	"github.com/retinadb/retina/internal/oltp/skeena"
)

// consoleProvider hands the console what the server knows.
type consoleProvider struct{ s *Server }

// maxQueryText bounds the statement text the console shows.
const maxQueryText = 200

func (p consoleProvider) Collect(ctx context.Context) (console.Status, console.Counters) {
	s := p.s
	now := time.Now()
	st := console.Status{Version: buildinfo.Version, Health: "ok", Sources: []console.Source{}, Queries: []console.Query{}}
	if err := s.Failure(); err != nil {
		st.Health = "ingestion stopped: " + err.Error()
	}
	ing := s.IngestStats()
	cnt := console.Counters{Rows: ing.Committed, Transactions: ing.Transactions, Messages: ing.Messages}

	if w, err := s.Node.Txn.Watermarks(ctx); err == nil {
		st.Watermarks = console.Watermarks{HWM: w.HWM, LWM: w.LWM, HWMLag: w.Next - w.HWM}
	}
	var activity []console.Query
	if s.pg != nil {
		for _, a := range s.pg.Activity() {
			q := console.Query{PID: a.PID, User: a.User, Client: a.Client, Query: clip(a.Query, maxQueryText), State: a.State, Snapshot: a.Snapshot}
			if a.State == "active" {
				q.Duration = now.Sub(a.Started).Seconds()
			}
			if a.Snapshot != 0 {
				q.SnapshotAge = now.Sub(a.SnapshotTaken).Seconds()
			}
			activity = append(activity, q)
		}
	}
	// The reader holding LWM, when it is a client's.
	for i, q := range activity {
		if q.Snapshot != 0 && q.Snapshot <= st.Watermarks.LWM {
			if st.Watermarks.OldestReader == nil || q.Snapshot < st.Watermarks.OldestReader.Snapshot {
				st.Watermarks.OldestReader = &activity[i]
			}
		}
	}
	if r := st.Watermarks.OldestReader; r != nil {
		st.Watermarks.LWMAge = r.SnapshotAge
	}
	for _, q := range activity {
		if q.State != "idle" {
			st.Queries = append(st.Queries, q)
		}
	}

	st.Checkpoint = console.Checkpoint{TS: ing.CheckpointTS, Duration: ing.CheckpointDuration.Seconds(), Count: ing.Checkpoints, Errors: ing.CheckpointErrors}
	if !ing.LastCheckpoint.IsZero() {
		st.Checkpoint.Age = now.Sub(ing.LastCheckpoint).Seconds()
	}
	r := s.Node.Recovery
	st.Recovery = console.Recovery{CheckpointTS: r.Checkpoint, Clean: r.Clean, Seconds: r.Duration.Seconds(), FilesDropped: r.Dropped,
		Redoing: ing.Redoing, Redone: ing.Redone, RedoSeconds: ing.RedoTook.Seconds()}

	var positions []map[string]int64
	var perSource []uint64
	if s.sink != nil {
		positions, perSource = s.sink.Positions(), s.sink.SourceMessages()
	}
	cnt.SourceEvents = perSource
	for i, src := range s.sources {
		cs := console.Source{Name: sourceName(src.uri), State: console.Following}
		if i < len(positions) {
			cs.Position = renderPosition(positions[i])
		}
		if ing.LastSourceMS > 0 && len(s.sources) == 1 {
			cs.LagSeconds = max(0, float64(now.UnixMilli()-ing.LastSourceMS)/1000)
		}
		if i < len(perSource) {
			cs.LagEvents = int64(perSource[i]) - int64(committedMessages(positions, i))
		}
		switch {
		case src.pg != nil:
			ps := src.pg.Stats()
			if !ps.SnapshotDone {
				cs.State = console.Copying
			}
			applied := ps.Confirmed
			if off, ok := s.sink.Applied(i, src.pg.Stream()); ok {
				applied = uint64(off)
			}
			cs.LagBytes = int64(ps.ServerWALEnd - min(ps.ServerWALEnd, applied))
			if applied >= ps.Received {
				cs.LagSeconds = 0
			} else if !ps.LastCommit.IsZero() {
				cs.LagSeconds = max(0, now.Sub(ps.LastCommit).Seconds())
			}
		case src.my != nil:
			ms := src.my.Stats()
			if !ms.SnapshotDone {
				cs.State = console.Copying
			}
			if ms.Position != "" {
				cs.Position = ms.Position // the binlog position received: a GTID set or file:offset
			}
			if ms.LastCommit.UnixMilli() > ing.LastSourceMS && ing.LastSourceMS > 0 {
				cs.LagSeconds = max(0, float64(now.UnixMilli()-ing.LastSourceMS)/1000)
			} else {
				cs.LagSeconds = 0
			}
		case src.uri == htap.Name:
			if hs, ok := src.src.(*htap.Source); ok && !hs.Stats().CopyDone {
				cs.State = console.Copying
			}
		}
		if ing.Redoing {
			cs.State = console.Redoing
		}
		if err := s.Failure(); err != nil {
			cs.State, cs.Reason = console.Stopped, err.Error()
		} else if s.finished.Load() {
			cs.State = console.Finished
		}
		cs.LagEvents = max(cs.LagEvents, 0)
		st.Sources = append(st.Sources, cs)
	}

	st.DeadLetters = console.DeadLetters{Count: ing.DeadLettered, File: s.cfg.DeadLetter}
	if s.cfg.DeadLetter != "" && ing.DeadLettered > 0 {
		st.DeadLetters.Last = lastLine(s.cfg.DeadLetter)
	}
	gc := s.Node.GCStats()
	st.StorageGC = console.StorageGC{Rewrites: gc.Rewrites.Load(), FilesRewritten: gc.FilesRewritten.Load(), FilesDropped: gc.FilesDropped.Load(), Errors: gc.Errors.Load()}
	if pub := s.Node.Iceberg; pub != nil {
		ps := pub.Stats()
		_, ts := pub.Current()
		st.Iceberg = &console.Iceberg{Publications: ps.Publications, Failures: ps.Failures, SnapshotTS: ts}
		if !ps.Last.Committed.IsZero() {
			st.Iceberg.Lag = ps.Last.Committed.Sub(ps.Last.Sealed).Seconds()
		}
	}
	if s.oltp != nil {
		store := s.oltp.Store()
		commits, aborts := store.Outcomes()
		o := &console.OLTP{Commits: commits, Aborts: aborts}
		for _, t := range s.oltp.Catalog().Tables() {
			if t.Placement() == skeena.Memory {
				o.MemoryTables++
			} else {
				o.StorageTables++
			}
		}
		o.StreamLagCommits = int64(store.StreamBacklog())
		mem, disk := store.Engines()
		if m, ok := mem.(interface{ Records() int64 }); ok {
			o.MemoryRecords = m.Records()
		}
		if d, ok := disk.(interface{ DiskBytes() int64 }); ok {
			o.StorageBytes = d.DiskBytes()
		}
		cnt.OLTPCommits = commits
		st.OLTP = o
	}
	return st, cnt
}

// committedMessages estimates how many of a source's messages committed
// transactions carried: the sum over its streams of the highest committed
// offset (streams count from 0 or 1, so this is within one a stream).
func committedMessages(positions []map[string]int64, i int) uint64 {
	if i >= len(positions) {
		return 0
	}
	var n int64
	for _, off := range positions[i] {
		n += off
	}
	return uint64(max(n, 0))
}

// renderPosition shows a source's committed offsets: stream@offset, a few.
func renderPosition(m map[string]int64) string {
	if len(m) == 0 {
		return "—"
	}
	keys := slices.Sorted(mapKeys(m))
	var parts []string
	for i, k := range keys {
		if i == 4 {
			parts = append(parts, fmt.Sprintf("and %d more", len(keys)-4))
			break
		}
		parts = append(parts, fmt.Sprintf("%s@%d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func mapKeys(m map[string]int64) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// lastLine reads the last line of a file (a dead-letter record).
func lastLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return ""
	}
	const tail = 64 << 10
	off := max(0, info.Size()-tail)
	buf := make([]byte, info.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(buf), "\n"), "\n")
	return clip(lines[len(lines)-1], 2000)
}

func (p consoleProvider) Tables(ctx context.Context) ([]console.Table, error) {
	n := p.s.Node
	w, err := n.Txn.Watermarks(ctx)
	if err != nil {
		return nil, err
	}
	objs, err := n.Lake.List(ctx, "t")
	if err != nil {
		return nil, err
	}
	snap := n.Catalog.Snapshot()
	out := []console.Table{}
	stale := (&staleCounter{at: w.HWM - 1}).count
	n.gc.mu.Lock()
	rewrites := make(map[uint32]time.Time, len(n.gc.lastRewrite))
	for id, at := range n.gc.lastRewrite {
		rewrites[id] = at
	}
	n.gc.mu.Unlock()
	for _, t := range snap.Tables() {
		ct := console.Table{Name: t.Name}
		prefix := fmt.Sprintf("t%d/", t.ID)
		i, _ := slices.BinarySearchFunc(objs, prefix, func(o lake.ObjectInfo, p string) int { return strings.Compare(o.Key, p) })
		for ; i < len(objs) && strings.HasPrefix(objs[i].Key, prefix); i++ {
			ct.LakeBytes += objs[i].Size
		}
		for _, f := range snap.LiveFiles(t.ID) {
			if int(f.Replayer) >= len(n.Replayers) {
				continue
			}
			vis, ok := n.Replayers[f.Replayer].FileVisibility(f.ID)
			if !ok {
				continue
			}
			ct.VisibilityBytes += int64(vis.MemoryBytes())
			rows := int(f.Rows())
			if f.State == catalog.Virtual {
				ct.VirtualFiles++
				if wb, err := n.Replayers[f.Replayer].Buffer(t.ID); err == nil {
					if id, r, ok := wb.Filling(); ok && id == f.ID {
						rows = r
					} else {
						rows = 0
						view := wb.View(f.ID)
						for _, b := range view.Files[0].Blocks {
							rows += b.Rows
						}
						view.Release()
					}
				}
			} else {
				ct.RegularFiles++
			}
			dead, err := stale(vis, 0, rows)
			if err != nil {
				continue // folded past the snapshot meanwhile: measured next time
			}
			ct.Versions += int64(rows)
			ct.LiveRows += int64(rows) - dead
		}
		if ct.Versions > 0 {
			ct.StaleShare = float64(ct.Versions-ct.LiveRows) / float64(ct.Versions)
		}
		if at, ok := rewrites[t.ID]; ok {
			ct.LastGCRewrite = &at
		}
		out = append(out, ct)
	}
	return out, nil
}

func (p consoleProvider) Cancel(pid uint32) bool {
	return p.s.pg != nil && p.s.pg.Cancel(pid)
}
