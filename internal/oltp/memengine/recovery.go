package memengine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/tsorder"
)

// Recovery is the normal start path: Open reads the newest checkpoint and
// the redo records after it; Start applies those the caller keeps, writes a
// checkpoint if it dropped any (so the decision is durable) and opens a new
// segment.

type recovery struct {
	ckpt    *checkpointData
	records []logRecord
	lastTS  uint64
	nextSeq uint64
	segs    []segment // on disk, oldest first
}

func recoverState(e *Engine) (*recovery, error) {
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, fmt.Errorf("memory engine: create data directory %s: %w", e.dir, err)
	}
	ents, err := os.ReadDir(e.dir)
	if err != nil {
		return nil, fmt.Errorf("memory engine: list %s: %w", e.dir, err)
	}
	var ckpts, segs []uint64
	for _, ent := range ents {
		var n uint64
		name := ent.Name()
		if strings.HasSuffix(name, ".tmp") {
			os.Remove(filepath.Join(e.dir, name)) // an unfinished checkpoint
			continue
		}
		if _, err := fmt.Sscanf(name, "checkpoint-%016x.ckpt", &n); err == nil && strings.HasSuffix(name, ".ckpt") {
			ckpts = append(ckpts, n)
		} else if _, err := fmt.Sscanf(name, "redo-%016x.log", &n); err == nil && strings.HasSuffix(name, ".log") {
			segs = append(segs, n)
		}
	}
	sort.Slice(ckpts, func(i, j int) bool { return ckpts[i] < ckpts[j] })
	sort.Slice(segs, func(i, j int) bool { return segs[i] < segs[j] })
	r := &recovery{}
	if len(ckpts) > 0 {
		// Only the newest counts: older segments are gone once it exists.
		c, err := readCheckpoint(filepath.Join(e.dir, checkpointName(ckpts[len(ckpts)-1])))
		if err != nil {
			return nil, err
		}
		r.ckpt = c
		r.lastTS = c.lastTS
	}
	for i, seq := range segs {
		if r.ckpt != nil && seq < r.ckpt.replayFrom {
			r.segs = append(r.segs, segment{seq: seq}) // covered; goes at the next checkpoint
			continue
		}
		path := filepath.Join(e.dir, segmentName(seq))
		recs, valid, torn, err := readSegment(path)
		if err != nil {
			return nil, err
		}
		if torn && i != len(segs)-1 {
			return nil, fmt.Errorf("memory engine: redo segment %s is corrupt before its end; restore the data directory from a backup", path)
		}
		if torn {
			// Never acknowledged: the flusher syncs a block before the
			// durable mark covers it.
			if err := truncateTail(path, valid); err != nil {
				return nil, err
			}
		}
		sg := segment{seq: seq}
		for _, rec := range recs {
			sg.max = max(sg.max, rec.cts)
		}
		r.segs = append(r.segs, sg)
		for _, rec := range recs {
			if r.ckpt != nil && rec.cts <= r.ckpt.ts {
				continue
			}
			r.records = append(r.records, rec)
			r.lastTS = max(r.lastTS, rec.cts)
		}
	}
	if len(segs) > 0 {
		r.nextSeq = segs[len(segs)-1] + 1
	} else if r.ckpt != nil {
		r.nextSeq = r.ckpt.replayFrom
	}
	for _, w := range r.allWrites() {
		if _, ok := e.tables[w.table]; !ok {
			return nil, fmt.Errorf("memory engine: the log or checkpoint in %s holds rows of table %q, which is not declared; declare it", e.dir, w.table)
		}
	}
	return r, nil
}

func (r *recovery) allWrites() []logWrite {
	var out []logWrite
	if r.ckpt != nil {
		out = append(out, r.ckpt.rows...)
	}
	for _, rec := range r.records {
		out = append(out, rec.writes...)
	}
	return out
}

// Recovered lists the logged transactions after the checkpoint that carry
// a tag, for the cross-engine layer to decide on.
func (e *Engine) Recovered() []engine.Recovered {
	if e.recovery == nil {
		return nil
	}
	var out []engine.Recovered
	for _, rec := range e.recovery.records {
		if len(rec.tag) > 0 {
			out = append(out, engine.Recovered{CommitTS: rec.cts, Snapshot: rec.snapshot, Tag: rec.tag})
		}
	}
	return out
}

// CheckpointTS is the timestamp of the checkpoint Open recovered from (0:
// none): every transaction at or below it is in the checkpoint, not in the
// list Recovered returns. Valid before Start.
func (e *Engine) CheckpointTS() uint64 {
	if e.recovery == nil || e.recovery.ckpt == nil {
		return 0
	}
	return e.recovery.ckpt.ts
}

// Start applies the recovered state minus what d drops and starts serving.
func (e *Engine) Start(ctx context.Context, d engine.Discard) error {
	r := e.recovery
	if r == nil {
		return fmt.Errorf("memory engine: started twice")
	}
	base := uint64(0)
	if r.ckpt != nil {
		base = r.ckpt.ts
		for _, w := range r.ckpt.rows {
			e.tables[w.table].findOrCreate(w.key).head.Store(newVersion(base, w.row, false, nil))
		}
	}
	recs := r.records
	sort.Slice(recs, func(i, j int) bool { return recs[i].cts < recs[j].cts })
	dropped := 0
	for _, rec := range recs {
		if d.Drops(engine.Recovered{CommitTS: rec.cts, Snapshot: rec.snapshot, Tag: rec.tag}) {
			dropped++
			continue
		}
		for _, w := range rec.writes {
			t := e.tables[w.table]
			rc := t.findOrCreate(w.key)
			rc.head.Store(newVersion(rec.cts, w.row, w.deleted, rc.head.Load()))
			if !w.deleted {
				for _, ix := range t.indexes {
					if sec := ix.spec.Key(w.row); sec != nil {
						ix.add(sec, rc)
					}
				}
			}
		}
	}
	if r.ckpt != nil {
		for _, w := range r.ckpt.rows {
			t := e.tables[w.table]
			rc := t.find(w.key)
			for _, ix := range t.indexes {
				if sec := ix.spec.Key(w.row); sec != nil {
					ix.add(sec, rc)
				}
			}
		}
	}
	e.clock = tsorder.New(r.lastTS)
	log, err := openRedoLog(e.dir, max(r.nextSeq, 1), e.clock, e.logger)
	if err != nil {
		return err
	}
	e.log = log
	e.closedSegs = r.segs
	e.recovery = nil
	e.gcStop, e.gcDone = make(chan struct{}), make(chan struct{})
	go e.gcLoop()
	if dropped > 0 {
		e.logger.Info("memory engine dropped recovered transactions", "count", dropped, "dir", e.dir)
		// Make the decision durable: a checkpoint of the state as applied.
		if err := e.writeCheckpoint(r.lastTS, e.log.seq); err != nil {
			return err
		}
		if err := e.removeBefore(r.lastTS, e.log.seq); err != nil {
			return err
		}
		e.closedSegs = nil
	}
	return nil
}
