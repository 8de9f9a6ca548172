package replay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// Undo spill
//
// A bucket keeps its undo records in memory until their transactions
// commit. A transaction proposed in parts (a large source transaction)
// commits only after its last part, so its records would grow with it: once
// a bucket holds more than Config.UndoInMemory records, the oldest are
// written to a file of the bucket's own and read back only by a rollback.
// The file goes when every record in it is forgotten. It lives as long as
// the process: after a crash recovery drops what the records would undo,
// so a start removes old files.
//
// Format: chunks appended one after another, each a run of records:
//
//	kind  byte
//	ts    uint64, big-endian
//	row   uint64, big-endian
//	key   uvarint length, then Key.AppendBinary's bytes (0 length: no key)

// undoSpill is one bucket's records on disk, oldest first.
type undoSpill struct {
	f      *os.File
	chunks []int64 // offset of each chunk; the last ends at size
	size   int64
	count  int
	maxTS  uint64
}

// spillIfLarge moves the older half of the records to the spill file when
// there are more than limit in memory.
func (u *undoLog) spillIfLarge(dir string, limit int) error {
	if limit <= 0 || len(u.recs) <= limit {
		return nil
	}
	n := len(u.recs) / 2
	if u.spill == nil {
		f, err := os.CreateTemp(dir, "undo-*")
		if err != nil {
			return fmt.Errorf("replay: undo spill: %w", err)
		}
		u.spill = &undoSpill{f: f}
	}
	if err := u.spill.write(u.recs[:n]); err != nil {
		return err
	}
	clear(u.recs[:n])
	u.recs = append(u.recs[:0], u.recs[n:]...)
	return nil
}

func (s *undoSpill) write(recs []undoRecord) error {
	var buf []byte
	for _, r := range recs {
		buf = append(buf, byte(r.kind))
		buf = binary.BigEndian.AppendUint64(buf, r.ts)
		buf = binary.BigEndian.AppendUint64(buf, r.row)
		if r.kind == undoIndex {
			k, err := r.key.AppendBinary(nil)
			if err != nil {
				return fmt.Errorf("replay: undo spill: %w", err)
			}
			buf = binary.AppendUvarint(buf, uint64(len(k)))
			buf = append(buf, k...)
		} else {
			buf = binary.AppendUvarint(buf, 0)
		}
		s.maxTS = max(s.maxTS, r.ts)
	}
	if _, err := s.f.WriteAt(buf, s.size); err != nil {
		return fmt.Errorf("replay: undo spill %s: %w", s.f.Name(), err)
	}
	s.chunks = append(s.chunks, s.size)
	s.size += int64(len(buf))
	s.count += len(recs)
	return nil
}

// chunk reads chunk i back.
func (s *undoSpill) chunk(i int) ([]undoRecord, error) {
	end := s.size
	if i+1 < len(s.chunks) {
		end = s.chunks[i+1]
	}
	buf := make([]byte, end-s.chunks[i])
	if _, err := s.f.ReadAt(buf, s.chunks[i]); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("replay: undo spill %s: %w", s.f.Name(), err)
	}
	var out []undoRecord
	for len(buf) > 0 {
		if len(buf) < 17 {
			return nil, fmt.Errorf("replay: undo spill %s: chunk %d is cut short", s.f.Name(), i)
		}
		r := undoRecord{kind: undoKind(buf[0]), ts: binary.BigEndian.Uint64(buf[1:]), row: binary.BigEndian.Uint64(buf[9:])}
		buf = buf[17:]
		n, w := binary.Uvarint(buf)
		if w <= 0 || uint64(len(buf)-w) < n {
			return nil, fmt.Errorf("replay: undo spill %s: chunk %d: bad key length", s.f.Name(), i)
		}
		buf = buf[w:]
		if n > 0 {
			if err := r.key.UnmarshalBinary(buf[:n]); err != nil {
				return nil, fmt.Errorf("replay: undo spill %s: %w", s.f.Name(), err)
			}
			buf = buf[n:]
		}
		out = append(out, r)
	}
	return out, nil
}

// close removes the file.
func (s *undoSpill) close() error {
	name := s.f.Name()
	return errors.Join(s.f.Close(), os.Remove(name))
}

// forgetSpill drops the spill file once every record in it is committed.
func (u *undoLog) forgetSpill(stable uint64) error {
	if u.spill == nil || u.spill.maxTS >= stable {
		return nil
	}
	err := u.spill.close()
	u.spill = nil
	return err
}

// RemoveUndoFiles deletes what spill files a process before left in dir.
func RemoveUndoFiles(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if len(e.Name()) > 5 && e.Name()[:5] == "undo-" {
			errs = append(errs, os.Remove(dir+string(os.PathSeparator)+e.Name()))
		}
	}
	return errors.Join(errs...)
}
