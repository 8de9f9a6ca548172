package memengine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/retinadb/retina/internal/oltp/tsorder"
)

// Redo log format. The log is a sequence of segment files
// redo-<seq, 16 hex digits>.log. A segment is a sequence of blocks, one per
// group-commit flush:
//
//	block   := payloadLen uint32 LE | crc32c(payload) uint32 LE | payload
//	payload := record*
//	record  := uvarint cts | uvarint snapshot | uvarint len(tag) | tag |
//	           uvarint nwrites | write*
//	write   := uvarint len(table) | table | uvarint len(key) | key |
//	           kind byte (0 put, 1 delete) | uvarint len(row) | row
//
// Records appear in post-commit order, not timestamp order. A block is
// fsynced before the durable mark moves past the timestamps it carries. A
// short or corrupt block ends the last segment (a torn tail); anywhere else
// it is corruption and recovery fails closed. A new segment starts at every
// open and every checkpoint; the previous one is synced first.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type logRecord struct {
	cts, snapshot uint64
	tag           []byte
	writes        []logWrite
}

type logWrite struct {
	table   string
	key     []byte
	row     []byte
	deleted bool
}

func (r *logRecord) encode(b []byte) []byte {
	b = binary.AppendUvarint(b, r.cts)
	b = binary.AppendUvarint(b, r.snapshot)
	b = binary.AppendUvarint(b, uint64(len(r.tag)))
	b = append(b, r.tag...)
	b = binary.AppendUvarint(b, uint64(len(r.writes)))
	for _, w := range r.writes {
		b = binary.AppendUvarint(b, uint64(len(w.table)))
		b = append(b, w.table...)
		b = binary.AppendUvarint(b, uint64(len(w.key)))
		b = append(b, w.key...)
		if w.deleted {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = binary.AppendUvarint(b, uint64(len(w.row)))
		b = append(b, w.row...)
	}
	return b
}

var errShort = errors.New("record truncated")

type decoder struct{ b []byte }

func (d *decoder) uvarint() (uint64, error) {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		return 0, errShort
	}
	d.b = d.b[n:]
	return v, nil
}

func (d *decoder) bytes() ([]byte, error) {
	n, err := d.uvarint()
	if err != nil {
		return nil, err
	}
	if uint64(len(d.b)) < n {
		return nil, errShort
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v, nil
}

func decodeRecord(d *decoder) (logRecord, error) {
	var r logRecord
	var err error
	if r.cts, err = d.uvarint(); err != nil {
		return r, err
	}
	if r.snapshot, err = d.uvarint(); err != nil {
		return r, err
	}
	if r.tag, err = d.bytes(); err != nil {
		return r, err
	}
	n, err := d.uvarint()
	if err != nil {
		return r, err
	}
	for i := uint64(0); i < n; i++ {
		var w logWrite
		tb, err := d.bytes()
		if err != nil {
			return r, err
		}
		w.table = string(tb)
		if w.key, err = d.bytes(); err != nil {
			return r, err
		}
		if len(d.b) == 0 {
			return r, errShort
		}
		w.deleted = d.b[0] == 1
		d.b = d.b[1:]
		if w.row, err = d.bytes(); err != nil {
			return r, err
		}
		r.writes = append(r.writes, w)
	}
	return r, nil
}

func segmentName(seq uint64) string { return fmt.Sprintf("redo-%016x.log", seq) }

// redoLog buffers records and flushes them in groups: one write and one
// fsync per flush, then the durable mark moves to the watermark read
// before the buffer was taken (everything at or below it was appended
// before).
type redoLog struct {
	dir    string
	clock  *tsorder.Clock
	logger *slog.Logger

	mu     sync.Mutex
	buf    []byte
	bufMax uint64 // largest cts in buf
	spare  []byte

	wake   chan struct{}
	rotate chan chan rotation
	stop   chan struct{}
	done   chan struct{}
	failed chan struct{} // closed on a write or sync error
	err    error

	// owned by the flusher
	f      *os.File
	seq    uint64
	segMax uint64
}

type rotation struct {
	oldSeq uint64
	oldMax uint64
	err    error
}

func openRedoLog(dir string, seq uint64, clock *tsorder.Clock, logger *slog.Logger) (*redoLog, error) {
	f, err := createSegment(dir, seq)
	if err != nil {
		return nil, err
	}
	l := &redoLog{dir: dir, clock: clock, logger: logger, f: f, seq: seq,
		wake: make(chan struct{}, 1), rotate: make(chan chan rotation), stop: make(chan struct{}),
		done: make(chan struct{}), failed: make(chan struct{})}
	go l.run()
	return l, nil
}

func createSegment(dir string, seq uint64) (*os.File, error) {
	path := filepath.Join(dir, segmentName(seq))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("memory engine: create redo segment %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (l *redoLog) append(r *logRecord) {
	l.mu.Lock()
	l.buf = r.encode(l.buf)
	if r.cts > l.bufMax {
		l.bufMax = r.cts
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *redoLog) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// failure is the error waiters get once the log failed.
func (l *redoLog) failure() error {
	return fmt.Errorf("memory engine: redo log in %s failed; commits are not acknowledged", l.dir)
}

func (l *redoLog) run() {
	defer close(l.done)
	for {
		select {
		case <-l.wake:
			l.flush()
		case reply := <-l.rotate:
			reply <- l.doRotate()
		case <-l.stop:
			l.flush()
			if l.f != nil {
				l.f.Close()
			}
			return
		}
	}
}

// flush writes what is buffered and moves the durable mark.
func (l *redoLog) flush() {
	if l.err != nil {
		return
	}
	w := l.clock.Visible()
	l.mu.Lock()
	data, max := l.buf, l.bufMax
	l.buf, l.bufMax = l.spare[:0], 0
	l.mu.Unlock()
	if len(data) > 0 {
		var hdr [8]byte
		binary.LittleEndian.PutUint32(hdr[0:], uint32(len(data)))
		binary.LittleEndian.PutUint32(hdr[4:], crc32.Checksum(data, castagnoli))
		if _, err := l.f.Write(hdr[:]); err == nil {
			_, err = l.f.Write(data)
			if err == nil {
				err = l.f.Sync()
			}
			if err != nil {
				l.fail(err)
				return
			}
		} else {
			l.fail(err)
			return
		}
		if max > l.segMax {
			l.segMax = max
		}
	}
	l.spare = data
	l.clock.SetDurable(w)
}

func (l *redoLog) fail(err error) {
	l.err = fmt.Errorf("memory engine: redo segment %s: %w (commits after this are not acknowledged; restart to recover)",
		filepath.Join(l.dir, segmentName(l.seq)), err)
	l.logger.Error("redo log write failed", "err", l.err)
	close(l.failed)
}

func (l *redoLog) doRotate() rotation {
	l.flush()
	if l.err != nil {
		return rotation{err: l.err}
	}
	f, err := createSegment(l.dir, l.seq+1)
	if err != nil {
		return rotation{err: err}
	}
	old := rotation{oldSeq: l.seq, oldMax: l.segMax}
	l.f.Close()
	l.f, l.seq, l.segMax = f, l.seq+1, 0
	return old
}

// rotateSegment starts a new segment and reports the old one's number and
// largest timestamp.
func (l *redoLog) rotateSegment() rotation {
	reply := make(chan rotation, 1)
	select {
	case l.rotate <- reply:
		return <-reply
	case <-l.done:
		return rotation{err: fmt.Errorf("memory engine: redo log closed")}
	}
}

func (l *redoLog) close() error {
	close(l.stop)
	<-l.done
	return l.err
}

// readSegment returns the records of one segment; torn reports a short or
// corrupt block, valid the length of the blocks before it (whose records
// are returned).
func readSegment(path string) (recs []logRecord, valid int64, torn bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, false, fmt.Errorf("memory engine: open redo segment %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, 0, false, fmt.Errorf("memory engine: read redo segment %s: %w", path, err)
	}
	for len(data) > 0 {
		if len(data) < 8 {
			return recs, valid, true, nil
		}
		n := binary.LittleEndian.Uint32(data[0:])
		sum := binary.LittleEndian.Uint32(data[4:])
		if uint64(len(data)-8) < uint64(n) {
			return recs, valid, true, nil
		}
		payload := data[8 : 8+n]
		if crc32.Checksum(payload, castagnoli) != sum {
			return recs, valid, true, nil
		}
		d := &decoder{b: payload}
		for len(d.b) > 0 {
			r, err := decodeRecord(d)
			if err != nil {
				return nil, 0, false, fmt.Errorf("memory engine: redo segment %s: block with a valid checksum does not decode: %w", path, err)
			}
			recs = append(recs, r)
		}
		data = data[8+n:]
		valid += 8 + int64(n)
	}
	return recs, valid, false, nil
}

// truncateTail cuts a torn tail off the last segment, so that segment
// reads cleanly once newer segments follow it.
func truncateTail(path string, valid int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("memory engine: open redo segment %s to cut its torn tail: %w", path, err)
	}
	defer f.Close()
	if err := f.Truncate(valid); err != nil {
		return fmt.Errorf("memory engine: cut the torn tail of redo segment %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("memory engine: sync redo segment %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("memory engine: open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("memory engine: sync directory %s: %w", dir, err)
	}
	return nil
}
