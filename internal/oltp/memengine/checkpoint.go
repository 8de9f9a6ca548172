package memengine

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/btree"
)

// Checkpoint format: one file checkpoint-<ts, 16 hex digits>.ckpt holding
// every row visible at ts:
//
//	file  := magic "SKMEMCK1" | ts uint64 LE | lastTS uint64 LE |
//	         replayFrom uint64 LE | entry* | end | crc32c(all before) uint32 LE
//	entry := 1 byte | uvarint len(table) | table | uvarint len(key) | key |
//	         uvarint len(row) | row
//	end   := 0 byte
//
// lastTS is the largest timestamp ever handed out (never reused after
// recovery); replayFrom is the first redo segment recovery reads, skipping
// records at or below ts. A checkpoint is written to a temporary name,
// fsynced and renamed; older checkpoints and segments go after that.

const ckptMagic = "SKMEMCK1"

func checkpointName(ts uint64) string { return fmt.Sprintf("checkpoint-%016x.ckpt", ts) }

// Checkpoint writes a checkpoint at a timestamp no higher than bound (the
// caller's safe point: nothing at or below it may ever be rolled back) and
// drops the redo segments whose records it all covers; replay starts at
// the first segment holding a later record. It reports false, doing
// nothing, when the bound is below the version GC horizon.
func (e *Engine) Checkpoint(ctx context.Context, bound uint64) (bool, error) {
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	if e.recovery != nil {
		return false, fmt.Errorf("memory engine: checkpoint before Start")
	}
	ts := min(e.clock.Visible(), bound)
	if ts < e.readers.Horizon() {
		return false, nil
	}
	if err := e.WaitDurable(ctx, ts); err != nil {
		return false, err
	}
	rot := e.log.rotateSegment()
	if rot.err != nil {
		return false, rot.err
	}
	e.closedSegs = append(e.closedSegs, segment{seq: rot.oldSeq, max: rot.oldMax})
	replayFrom := rot.oldSeq + 1
	keep := 0
	for i, sg := range e.closedSegs {
		if sg.max > ts {
			replayFrom, keep = sg.seq, i
			break
		}
		keep = i + 1
	}
	if err := e.writeCheckpoint(ts, replayFrom); err != nil {
		return false, err
	}
	e.closedSegs = e.closedSegs[keep:]
	return true, e.removeBefore(ts, replayFrom)
}

// segment is a closed redo segment and the largest timestamp in it.
type segment struct{ seq, max uint64 }

func (e *Engine) writeCheckpoint(ts, replayFrom uint64) error {
	// Reads at ts: hold back version GC like a transaction would.
	if e.log != nil {
		rd, ok := e.readers.Register(ts)
		defer e.readers.Release(rd)
		if !ok {
			return fmt.Errorf("memory engine: checkpoint at %d is below the version GC horizon %d; checkpoint again", ts, e.readers.Horizon())
		}
	}
	// Clones are copy-on-write: writers go on while the checkpoint reads.
	names := make([]string, 0, len(e.tables))
	clones := make(map[string]*btree.BTreeG[*record], len(e.tables))
	for name, t := range e.tables {
		names = append(names, name)
		t.mu.Lock()
		clones[name] = t.rows.Clone()
		t.mu.Unlock()
	}
	sort.Strings(names)
	final := filepath.Join(e.dir, checkpointName(ts))
	tmp := final + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("memory engine: create checkpoint %s: %w", tmp, err)
	}
	defer os.Remove(tmp)
	crc := crc32.New(castagnoli)
	w := bufio.NewWriterSize(f, 1<<20)
	out := func(b []byte) {
		w.Write(b)
		crc.Write(b)
	}
	var hdr [32]byte
	copy(hdr[:], ckptMagic)
	binary.LittleEndian.PutUint64(hdr[8:], ts)
	binary.LittleEndian.PutUint64(hdr[16:], e.clock.Last())
	binary.LittleEndian.PutUint64(hdr[24:], replayFrom)
	out(hdr[:])
	var b []byte
	for _, name := range names {
		clones[name].Ascend(func(r *record) bool {
			v := r.visible(ts)
			if v == nil || v.deleted {
				return true
			}
			b = append(b[:0], 1)
			b = binary.AppendUvarint(b, uint64(len(name)))
			b = append(b, name...)
			b = binary.AppendUvarint(b, uint64(len(r.key)))
			b = append(b, r.key...)
			b = binary.AppendUvarint(b, uint64(len(v.row)))
			b = append(b, v.row...)
			out(b)
			return true
		})
	}
	out([]byte{0})
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], crc.Sum32())
	w.Write(sum[:])
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("memory engine: write checkpoint %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("memory engine: sync checkpoint %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("memory engine: close checkpoint %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("memory engine: install checkpoint %s: %w", final, err)
	}
	return syncDir(e.dir)
}

// removeBefore deletes checkpoints older than ts and segments before seq.
func (e *Engine) removeBefore(ts, seq uint64) error {
	ents, err := os.ReadDir(e.dir)
	if err != nil {
		return fmt.Errorf("memory engine: list %s: %w", e.dir, err)
	}
	for _, ent := range ents {
		name := ent.Name()
		var n uint64
		switch {
		case strings.HasPrefix(name, "checkpoint-") && strings.HasSuffix(name, ".ckpt"):
			if _, err := fmt.Sscanf(name, "checkpoint-%016x.ckpt", &n); err == nil && n < ts {
				os.Remove(filepath.Join(e.dir, name))
			}
		case strings.HasPrefix(name, "redo-") && strings.HasSuffix(name, ".log"):
			if _, err := fmt.Sscanf(name, "redo-%016x.log", &n); err == nil && n < seq {
				os.Remove(filepath.Join(e.dir, name))
			}
		}
	}
	return syncDir(e.dir)
}

type checkpointData struct {
	ts, lastTS, replayFrom uint64
	rows                   []logWrite
}

func readCheckpoint(path string) (*checkpointData, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("memory engine: read checkpoint %s: %w", path, err)
	}
	bad := func(why string) error {
		return fmt.Errorf("memory engine: checkpoint %s is corrupt (%s); restore the data directory from a backup", path, why)
	}
	if len(data) < 37 || string(data[:8]) != ckptMagic {
		return nil, bad("bad header")
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(data[len(data)-4:]) {
		return nil, bad("checksum mismatch")
	}
	c := &checkpointData{
		ts:         binary.LittleEndian.Uint64(body[8:]),
		lastTS:     binary.LittleEndian.Uint64(body[16:]),
		replayFrom: binary.LittleEndian.Uint64(body[24:]),
	}
	d := &decoder{b: body[32:]}
	for {
		if len(d.b) == 0 {
			return nil, bad("no end marker")
		}
		kind := d.b[0]
		d.b = d.b[1:]
		if kind == 0 {
			break
		}
		tb, err := d.bytes()
		if err != nil {
			return nil, bad(err.Error())
		}
		key, err := d.bytes()
		if err != nil {
			return nil, bad(err.Error())
		}
		row, err := d.bytes()
		if err != nil {
			return nil, bad(err.Error())
		}
		c.rows = append(c.rows, logWrite{table: string(tb), key: key, row: row})
	}
	return c, nil
}
