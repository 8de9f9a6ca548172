package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/retinadb/retina/internal/durable"
	"github.com/retinadb/retina/internal/failpoint"
)

// ManifestName and VisDir are the checkpoint's names in the data directory.
const (
	ManifestName = "checkpoint"
	VisDir       = "visibility"
)

// Store reads and writes the checkpoints of one data directory. It is not
// safe for concurrent use: one writer at a time.
type Store struct {
	fs   vfs.FS
	dir  string
	last *Manifest // the newest manifest read or written
	// Failpoints can stop the process before and after the manifest is
	// replaced (crash tests).
	Failpoints *failpoint.Set
}

// Open makes a store for the data directory dir on fsys.
func Open(fsys vfs.FS, dir string) *Store { return &Store{fs: fsys, dir: dir} }

func (s *Store) manifestPath() string { return s.fs.PathJoin(s.dir, ManifestName) }

// VisPath is where a visibility file of the checkpoint lives.
func (s *Store) VisPath(name string) string { return s.fs.PathJoin(s.dir, VisDir, name) }

// Load reads the newest checkpoint: nil when there is none. A manifest that
// fails a check is an error naming the file and the check.
func (s *Store) Load() (*Manifest, error) {
	data, err := durable.ReadFileFS(s.fs, s.manifestPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read %s: %w", s.manifestPath(), err)
	}
	m, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.manifestPath(), err)
	}
	s.last = m
	return m, nil
}

// Visibility reads the visibility file a manifest names for f, checking it
// against the manifest's sum. A file with no deletes has none (nil).
func (s *Store) Visibility(f File) ([]byte, error) {
	if f.Vis == "" {
		return nil, nil
	}
	path := s.VisPath(f.Vis)
	data, err := durable.ReadFileFS(s.fs, path)
	if err != nil {
		return nil, fmt.Errorf("%w: visibility of file %d: %w", ErrCorrupt, f.ID, err)
	}
	if got := visSum(data); got != f.VisSum {
		return nil, fmt.Errorf("%w: %s: SHA-256 %s, the manifest says %s", ErrCorrupt, path, got, f.VisSum)
	}
	return data, nil
}

// visSum identifies a visibility file's bytes. (Not a CRC-32C: the files
// end with their own CRC-32C, and the CRC-32C of anything followed by its
// CRC-32C is one constant.)
func visSum(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// Write makes m the current checkpoint. vis holds the encoded visibility of
// the files that have deletes, by file id; a file whose bytes equal what
// the previous checkpoint holds keeps its file. m.Seq and the files' Vis
// and VisSum are filled in. On error the previous checkpoint stays current.
func (s *Store) Write(m *Manifest, vis map[uint64][]byte) error {
	if s.last != nil {
		m.Seq = s.last.Seq + 1
	} else {
		m.Seq = max(m.Seq, 1)
	}
	prev := map[uint64]File{}
	if s.last != nil {
		for _, f := range s.last.Files {
			prev[f.ID] = f
		}
	}
	visDir := s.fs.PathJoin(s.dir, VisDir)
	if err := s.fs.MkdirAll(visDir, 0o755); err != nil {
		return fmt.Errorf("checkpoint: %s: %w", visDir, err)
	}
	wrote := false
	for i := range m.Files {
		f := &m.Files[i]
		data, ok := vis[f.ID]
		if !ok {
			f.Vis, f.VisSum = "", ""
			continue
		}
		sum := visSum(data)
		if p, ok := prev[f.ID]; ok && p.Vis != "" && p.VisSum == sum {
			f.Vis, f.VisSum = p.Vis, sum
			continue
		}
		f.Vis, f.VisSum = VisName(f.ID, m.Seq), sum
		if err := durable.CreateFS(s.fs, s.VisPath(f.Vis), data); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		wrote = true
	}
	if wrote {
		if err := durable.SyncDirFS(s.fs, visDir); err != nil {
			return fmt.Errorf("checkpoint: sync %s: %w", visDir, err)
		}
	}
	slices.SortFunc(m.Files, func(a, b File) int { return cmpID(a.ID, b.ID) })
	if m.Written.IsZero() {
		m.Written = time.Now().UTC()
	}
	data, err := Encode(m)
	if err != nil {
		return err
	}
	s.Failpoints.Hit(failpoint.CheckpointBeforeRename)
	if err := durable.WriteFileFS(s.fs, s.manifestPath(), data); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	s.Failpoints.Hit(failpoint.CheckpointAfterManifest)
	s.last = m
	s.removeUnused(visDir, m)
	return nil
}

// removeUnused deletes visibility files the current manifest does not name
// (of earlier checkpoints, or of a write that failed). Best effort: a file
// left over is removed by a later checkpoint.
func (s *Store) removeUnused(visDir string, m *Manifest) {
	names, err := s.fs.List(visDir)
	if err != nil {
		return
	}
	keep := map[string]bool{}
	for _, f := range m.Files {
		if f.Vis != "" {
			keep[f.Vis] = true
		}
	}
	for _, n := range names {
		if strings.HasSuffix(n, ".vis") && !keep[n] {
			s.fs.Remove(s.fs.PathJoin(visDir, n))
		}
	}
}

func cmpID(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// FileByID finds a file of the manifest (its files are sorted by id).
func (m *Manifest) FileByID(id uint64) (File, bool) {
	i, ok := slices.BinarySearchFunc(m.Files, id, func(f File, id uint64) int { return cmpID(f.ID, id) })
	if !ok {
		return File{}, false
	}
	return m.Files[i], true
}
