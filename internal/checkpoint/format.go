// Package checkpoint is the replay checkpoint: what a restart needs to
// restore the replay state as of one timestamp c, written so that a crash at
// any moment leaves the previous checkpoint or the new one, never a mix.
//
// # Layout in the data directory
//
//	checkpoint                 the manifest (below), replaced atomically
//	visibility/<file>-<seq>.vis each file's deleted set at c, in the
//	                           visibility package's checkpoint encoding,
//	                           written by checkpoint <seq> (a later one that
//	                           finds the same set names the same file)
//
// # Manifest encoding
//
//	offset  size  field
//	0       4     magic "RTCP"
//	4       4     format version, big-endian (1)
//	8       8     payload length n, big-endian
//	16      n     payload: the Manifest as JSON
//	16+n    4     CRC-32C (Castagnoli) of bytes [0, 16+n), big-endian
//
// A manifest that is short, has another magic, an unknown version, a
// length that does not match the file, a bad checksum, a payload that does
// not parse or whose values are inconsistent is refused, naming the file and
// the check: a start never restores half a state.
//
// # Writing
//
// The new visibility files are created and synced, their directory synced,
// then the manifest is replaced (temporary file, sync, rename, directory
// sync). Visibility files no manifest names any more are removed afterwards.
// Until the rename the old manifest and every file it names are intact.
package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"time"

	"github.com/retinadb/retina/internal/change"
)

// FormatVersion is the manifest format this package writes and reads.
const FormatVersion = 1

const (
	magic      = "RTCP"
	headerSize = 16
	crcSize    = 4
	// maxPayload bounds what a manifest may claim (a million files is far
	// beyond what it would hold).
	maxPayload = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt is wrapped by every refusal of a checkpoint's files.
var ErrCorrupt = errors.New("checkpoint: corrupt")

// Manifest is the replay state at TS: every mirror transaction ≤ TS is in
// it and none above.
type Manifest struct {
	// Seq numbers checkpoints: each one written is one higher.
	Seq uint64 `json:"seq"`
	TS  uint64 `json:"ts"`
	// Clean says a clean stop wrote it and nothing changed after it: the
	// index as it is on disk is the index at TS.
	Clean bool `json:"clean"`
	// The sharding settings the state was written with.
	Buckets   int `json:"buckets"`
	Replayers int `json:"replayers"`
	// Sources, in configuration order, with where each resumes.
	Sources []Source `json:"sources"`
	// Files are every live file at TS.
	Files []File `json:"files"`
	// Written is when it was written (UTC).
	Written time.Time `json:"written"`
}

// Source is one change source and its resume point.
type Source struct {
	URI    string            `json:"uri"`
	Resume change.Checkpoint `json:"resume"`
}

// File is one live file at TS.
type File struct {
	ID       uint64 `json:"id"`
	Table    uint32 `json:"table"`
	Replayer uint32 `json:"replayer"`
	// Virtual says the file was a write buffer's: its first Rows rows are
	// in flushed block objects (rows after them came later and are not part
	// of the checkpoint). A regular file holds Rows rows in its object.
	Virtual bool  `json:"virtual"`
	Rows    int64 `json:"rows"`
	// Capacity is how many rows the file's visibility covers (≥ Rows).
	Capacity int `json:"capacity"`
	// Vis names the file's visibility file and VisSum is the SHA-256 of
	// its bytes (hex); "" when no row of it was deleted at TS. The sum both
	// checks the file and tells a later checkpoint it can keep it.
	Vis    string `json:"vis,omitempty"`
	VisSum string `json:"vis_sha256,omitempty"`
}

// Encode renders a manifest in the format above.
func Encode(m *Manifest) ([]byte, error) {
	payload, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: encode: %w", err)
	}
	out := make([]byte, headerSize, headerSize+len(payload)+crcSize)
	copy(out, magic)
	binary.BigEndian.PutUint32(out[4:], FormatVersion)
	binary.BigEndian.PutUint64(out[8:], uint64(len(payload)))
	out = append(out, payload...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli)), nil
}

// Decode parses and checks a manifest. Every error wraps ErrCorrupt and
// says which check failed.
func Decode(data []byte) (*Manifest, error) {
	if len(data) < headerSize+crcSize {
		return nil, fmt.Errorf("%w: %d bytes, shorter than any manifest (truncated?)", ErrCorrupt, len(data))
	}
	if string(data[:4]) != magic {
		return nil, fmt.Errorf("%w: magic %q, want %q (not a checkpoint manifest)", ErrCorrupt, data[:4], magic)
	}
	if v := binary.BigEndian.Uint32(data[4:]); v != FormatVersion {
		return nil, fmt.Errorf("%w: format version %d, this Retina reads %d", ErrCorrupt, v, FormatVersion)
	}
	n := binary.BigEndian.Uint64(data[8:])
	if n > maxPayload || uint64(len(data)) != headerSize+n+crcSize {
		return nil, fmt.Errorf("%w: payload length %d does not match the file's %d bytes (truncated or extended)", ErrCorrupt, n, len(data))
	}
	body := data[:headerSize+n]
	if want, got := binary.BigEndian.Uint32(data[headerSize+n:]), crc32.Checksum(body, castagnoli); want != got {
		return nil, fmt.Errorf("%w: checksum mismatch (stored %08x, computed %08x)", ErrCorrupt, want, got)
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data[headerSize : headerSize+n]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: payload: %v", ErrCorrupt, err)
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return &m, nil
}

// validate checks what the checksum cannot: values that make sense together.
func (m *Manifest) validate() error {
	if m.Buckets <= 0 || m.Replayers <= 0 {
		return fmt.Errorf("sharding %d buckets, %d replayers", m.Buckets, m.Replayers)
	}
	if m.TS >= 1<<52 {
		return fmt.Errorf("timestamp %d out of range", m.TS)
	}
	for i, f := range m.Files {
		switch {
		case f.ID == 0 || i > 0 && f.ID <= m.Files[i-1].ID:
			return fmt.Errorf("file id %d is zero, listed twice or out of order", f.ID)
		case f.Rows < 0 || f.Capacity < 0 || f.Rows > int64(f.Capacity) || f.Capacity > 1<<32:
			return fmt.Errorf("file %d: %d rows, capacity %d", f.ID, f.Rows, f.Capacity)
		case int(f.Replayer) >= m.Replayers:
			return fmt.Errorf("file %d belongs to replayer %d of %d", f.ID, f.Replayer, m.Replayers)
		case f.Vis != "" && !validVisName(f.Vis):
			return fmt.Errorf("file %d: visibility file name %q", f.ID, f.Vis)
		case (f.Vis == "") != (f.VisSum == "") || f.VisSum != "" && len(f.VisSum) != 64:
			return fmt.Errorf("file %d: visibility file %q with sum %q", f.ID, f.Vis, f.VisSum)
		}
	}
	for i, s := range m.Sources {
		if s.URI == "" {
			return fmt.Errorf("source %d has no URI", i)
		}
	}
	return nil
}

// VisName is the visibility file checkpoint seq writes for a file.
func VisName(file, seq uint64) string { return fmt.Sprintf("%d-%d.vis", file, seq) }

func validVisName(s string) bool {
	var file, seq uint64
	n, err := fmt.Sscanf(s, "%d-%d.vis", &file, &seq)
	return err == nil && n == 2 && VisName(file, seq) == s && !strings.ContainsAny(s, `/\`)
}
