package iceberg

import (
	"maps"
	"slices"
	"time"

	ice "github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/table"

	"github.com/retinadb/retina/internal/catalog"
)

// State is Retina's replay state at one replay checkpoint: what one
// publication covers. The node builds it when the checkpoint is durable.
type State struct {
	// TS is the checkpoint's timestamp: the snapshot every table is
	// published at. Sealed is when it was taken (publication lag counts
	// from it).
	TS     uint64
	Sealed time.Time
	// Sources are the change sources with their positions at TS.
	Sources []Source
	Tables  []TableState
	// Final marks a clean stop's last state: every version hint is
	// brought up to date.
	Final bool
}

// Source is a change source and where it stood at the state's timestamp.
type Source struct {
	URI      string `json:"uri"`
	Position string `json:"position"`
}

// TableState is one table at the state's timestamp.
type TableState struct {
	Table *catalog.Table // its schema at the timestamp
	Files []FileState
}

// FileState is one live file of a table at the state's timestamp.
type FileState struct {
	ID       uint64
	Key      string // the regular object's key (a virtual file's, once combined)
	Replayer uint32 // owner of its write buffer
	Virtual  bool
	// Rows is how many rows the file had at the timestamp (a regular file:
	// its object's rows).
	Rows int64
	// Deleted marks the rows deleted at the timestamp (nil: none). Rows a
	// restart hid in a regular object (added after the checkpoint it
	// restored) are marked too.
	Deleted []uint64
}

// keys are the lake objects a publication of the state reads or names.
func (s *State) keys() []string {
	var out []string
	for _, t := range s.Tables {
		for _, f := range t.Files {
			out = append(out, f.Key)
		}
	}
	return out
}

// tableState is what the publisher keeps of one Iceberg table: its current
// metadata and the files of its current snapshot, enough to publish the
// next one. A publication works on a copy and the copy replaces it only
// once the publication is committed.
type tableState struct {
	TableID   uint32
	Namespace string
	Name      string
	Dir       string // lake key prefix of the table's location
	Location  string // the location's URI
	Format    int

	Meta    table.Metadata // nil before the first publication
	MetaKey string         // the current metadata file
	// metaJSON is the current metadata file's bytes, served as they are.
	metaJSON []byte
	Version  int // its number: v<Version>.metadata.json
	hinted   int // the version its version hint names (0: not written by this process)

	// Data are the data files of the current snapshot by path: Retina's
	// regular files and pieces.
	Data map[string]*entry
	// Regular maps a Retina file id to its data file's path.
	Regular map[uint64]string
	Pieces  []*piece
	// Upto is, per virtual file, how many of its rows pieces cover.
	Upto map[uint64]int64

	// Deletes are the positional delete files (format version 2), oldest
	// first; DVs the deletion vectors by data file (version 3).
	Deletes []*deleteFile
	DVs     map[string]*entry
	// Masked is what the current snapshot masks of each data file; nil
	// after a start, when it is unknown and the next publication writes
	// every table's delete information anew.
	Masked map[string][]uint64

	// DataManifest and DeleteManifest are the current snapshot's
	// manifests, reused while their files stay the same (nil: none).
	DataManifest, DeleteManifest ice.ManifestFile
	dataSet, deleteSet           string // fingerprints of their files

	// Refs are the lake objects each retained snapshot names (manifest
	// list, manifests, data and delete files).
	Refs map[int64][]string
}

// clone copies what a publication changes; the entries themselves are not
// changed once made, and are shared.
func (t *tableState) clone() *tableState {
	c := *t
	c.Data = maps.Clone(t.Data)
	c.Regular = maps.Clone(t.Regular)
	c.Pieces = slices.Clone(t.Pieces)
	c.Upto = maps.Clone(t.Upto)
	c.Deletes = slices.Clone(t.Deletes)
	c.DVs = maps.Clone(t.DVs)
	c.Masked = maps.Clone(t.Masked)
	c.Refs = maps.Clone(t.Refs)
	return &c
}

// newTableState starts an Iceberg table for a Retina table.
func newTableState(t *catalog.Table, format int, dir, location string) *tableState {
	ns, name := splitName(t.Name)
	return &tableState{TableID: t.ID, Namespace: ns, Name: name, Dir: dir, Location: location, Format: format,
		Data: map[string]*entry{}, Regular: map[uint64]string{}, Upto: map[uint64]int64{}, DVs: map[string]*entry{},
		Masked: map[string][]uint64{}, Refs: map[int64][]string{}}
}
