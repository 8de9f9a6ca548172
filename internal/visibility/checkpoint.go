package visibility

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

const (
	checkpointMagic   = "RVCP"
	checkpointVersion = 1
	checkpointHeader  = 24
	checkpointTrailer = 4
	// maxCheckpointRows bounds the row count a checkpoint may claim, matching
	// the largest row group NewRowGroup accepts.
	maxCheckpointRows = 1 << 32
)

// ErrBadCheckpoint is wrapped by every checkpoint decoding failure.
var ErrBadCheckpoint = errors.New("visibility: bad checkpoint")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checkpoint is the exact deleted set of a row group at one timestamp.
type Checkpoint struct {
	TS     uint64   // the snapshot the bitmap is exact for
	Rows   int      // tuples in the row group
	Bitmap []uint64 // ceil(Rows/64) words; bit i of word j is offset 64j+i
}

// Checkpoint captures the deleted set at ts. The same rules as Bitmap apply.
func (g *RowGroup) Checkpoint(ts uint64) (Checkpoint, error) {
	bm := make([]uint64, g.BitmapWords())
	if err := g.Bitmap(ts, bm); err != nil {
		return Checkpoint{}, err
	}
	return Checkpoint{TS: ts, Rows: g.rows, Bitmap: bm}, nil
}

// Restore builds a row group whose base is the checkpoint: every tile starts
// collected at cp.TS, so snapshots ≥ cp.TS are answered exactly.
func Restore(cp Checkpoint, opts ...Option) (*RowGroup, error) {
	if err := cp.validate(); err != nil {
		return nil, err
	}
	return newRowGroup(cp.Rows, cp.TS, cp.Bitmap, opts)
}

func (cp Checkpoint) validate() error {
	if cp.Rows < 0 || cp.Rows > maxCheckpointRows {
		return fmt.Errorf("%w: row count %d out of range", ErrBadCheckpoint, cp.Rows)
	}
	if cp.TS > MaxTimestamp {
		return fmt.Errorf("%w: timestamp %d ≥ 2^52", ErrBadCheckpoint, cp.TS)
	}
	words := (cp.Rows + 63) / 64
	if len(cp.Bitmap) != words {
		return fmt.Errorf("%w: %d bitmap words for %d rows, want %d", ErrBadCheckpoint, len(cp.Bitmap), cp.Rows, words)
	}
	if r := cp.Rows % 64; r != 0 && cp.Bitmap[words-1]>>r != 0 {
		return fmt.Errorf("%w: bits set beyond row %d", ErrBadCheckpoint, cp.Rows)
	}
	return nil
}

// MarshalBinary encodes the checkpoint in the format documented in the package.
func (cp Checkpoint) MarshalBinary() ([]byte, error) {
	if err := cp.validate(); err != nil {
		return nil, err
	}
	buf := make([]byte, checkpointHeader, checkpointHeader+8*len(cp.Bitmap)+checkpointTrailer)
	copy(buf, checkpointMagic)
	binary.LittleEndian.PutUint16(buf[4:], checkpointVersion)
	binary.LittleEndian.PutUint64(buf[8:], cp.TS)
	binary.LittleEndian.PutUint64(buf[16:], uint64(cp.Rows))
	for _, w := range cp.Bitmap {
		buf = binary.LittleEndian.AppendUint64(buf, w)
	}
	return binary.LittleEndian.AppendUint32(buf, crc32.Checksum(buf, castagnoli)), nil
}

// UnmarshalBinary decodes a checkpoint, rejecting anything malformed with an
// error wrapping ErrBadCheckpoint. It never panics.
func (cp *Checkpoint) UnmarshalBinary(data []byte) error {
	if len(data) < checkpointHeader+checkpointTrailer {
		return fmt.Errorf("%w: %d bytes is shorter than the %d-byte minimum", ErrBadCheckpoint, len(data), checkpointHeader+checkpointTrailer)
	}
	if string(data[:4]) != checkpointMagic {
		return fmt.Errorf("%w: magic %q, want %q", ErrBadCheckpoint, data[:4], checkpointMagic)
	}
	if v := binary.LittleEndian.Uint16(data[4:]); v != checkpointVersion {
		return fmt.Errorf("%w: unsupported version %d (this build reads %d)", ErrBadCheckpoint, v, checkpointVersion)
	}
	if r := binary.LittleEndian.Uint16(data[6:]); r != 0 {
		return fmt.Errorf("%w: reserved field is %#x, want 0", ErrBadCheckpoint, r)
	}
	ts := binary.LittleEndian.Uint64(data[8:])
	rows := binary.LittleEndian.Uint64(data[16:])
	if rows > maxCheckpointRows {
		return fmt.Errorf("%w: row count %d out of range", ErrBadCheckpoint, rows)
	}
	words := int((rows + 63) / 64)
	want := checkpointHeader + 8*words + checkpointTrailer
	switch {
	case len(data) < want:
		return fmt.Errorf("%w: truncated: %d bytes, %d rows need %d", ErrBadCheckpoint, len(data), rows, want)
	case len(data) > want:
		return fmt.Errorf("%w: %d trailing bytes after %d rows", ErrBadCheckpoint, len(data)-want, rows)
	}
	body := data[:want-checkpointTrailer]
	if got, sum := binary.LittleEndian.Uint32(data[want-checkpointTrailer:]), crc32.Checksum(body, castagnoli); got != sum {
		return fmt.Errorf("%w: checksum %#08x, computed %#08x", ErrBadCheckpoint, got, sum)
	}
	bm := make([]uint64, words)
	for i := range bm {
		bm[i] = binary.LittleEndian.Uint64(body[checkpointHeader+8*i:])
	}
	dec := Checkpoint{TS: ts, Rows: int(rows), Bitmap: bm}
	if err := dec.validate(); err != nil {
		return err
	}
	*cp = dec
	return nil
}
