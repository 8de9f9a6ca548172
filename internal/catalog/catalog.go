// Package catalog is what makes a set of files a table: schemas, primary
// keys and indexes, tables, files with their states and row groups, and
// file-id allocation, changed atomically and read as consistent snapshots.
//
// Every change is one durable transaction in an embedded bbolt database in
// the data directory (fsynced before the call returns) and produces a new
// immutable Snapshot with the next catalog version. A query plans against
// one Snapshot, so it sees one consistent file list whatever changes after.
// Users depend on small interfaces of their own over these methods, so an
// etcd or SQL backend can take the embedded one's place.
package catalog

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/types"
)

// Errors callers branch on.
var (
	ErrNotFound     = errors.New("catalog: not found")
	ErrExists       = errors.New("catalog: already exists")
	ErrInvalid      = errors.New("catalog: invalid request")
	ErrBadState     = errors.New("catalog: file state does not allow this")
	ErrClosed       = errors.New("catalog: closed")
	ErrUnallocated  = errors.New("catalog: file id was never allocated")
	ErrSchemaChange = errors.New("catalog: unsupported schema change")
	// ErrCorrupt: the catalog file is damaged; Open refuses it.
	ErrCorrupt = errors.New("catalog: damaged")
)

// Column is one table column.
type Column struct {
	Name     string     `json:"name"`
	Type     types.Type `json:"type"`
	Nullable bool       `json:"nullable"`
	// SourceID is the source's own number for the column, which a rename
	// keeps (PostgreSQL's attnum); 0 when the source has none.
	SourceID int32 `json:"source_id,omitempty"`
}

// Index is a secondary index over columns of the table.
type Index struct {
	ID      uint32   `json:"id"`
	Name    string   `json:"name"`
	Columns []string `json:"columns"`
	Unique  bool     `json:"unique"`
}

// Schema is a table's shape.
type Schema struct {
	Columns    []Column `json:"columns"`
	PrimaryKey []string `json:"primary_key"`
	Indexes    []Index  `json:"indexes,omitempty"`
	// GeneratedKey says Retina made up the primary key because the source
	// table has none: the source names a row to update or delete by its
	// other columns, so all rows of the table are replayed in one bucket,
	// where such a row can be found.
	GeneratedKey bool `json:"generated_key,omitempty"`
}

// ColumnIndex returns the position of a column, or -1.
func (s Schema) ColumnIndex(name string) int {
	for i, c := range s.Columns {
		if strings.EqualFold(c.Name, name) {
			return i
		}
	}
	return -1
}

// KeyColumns returns the positions of the primary-key columns.
func (s Schema) KeyColumns() []int {
	out := make([]int, len(s.PrimaryKey))
	for i, k := range s.PrimaryKey {
		out[i] = s.ColumnIndex(k)
	}
	return out
}

func (s Schema) validate() error {
	if len(s.Columns) == 0 {
		return fmt.Errorf("%w: a table needs columns", ErrInvalid)
	}
	seen := map[string]bool{}
	for _, c := range s.Columns {
		name := strings.ToLower(c.Name)
		switch {
		case c.Name == "" || strings.HasPrefix(name, "_retina_"):
			return fmt.Errorf("%w: column name %q is reserved or empty", ErrInvalid, c.Name)
		case seen[name]:
			return fmt.Errorf("%w: column %q appears twice", ErrInvalid, c.Name)
		}
		seen[name] = true
		if err := c.Type.Validate(); err != nil {
			return fmt.Errorf("%w: column %q: %w", ErrInvalid, c.Name, err)
		}
	}
	if len(s.PrimaryKey) == 0 {
		return fmt.Errorf("%w: a table needs a primary key (CDC replay finds rows by it)", ErrInvalid)
	}
	for _, k := range s.PrimaryKey {
		i := s.ColumnIndex(k)
		if i < 0 {
			return fmt.Errorf("%w: primary-key column %q does not exist", ErrInvalid, k)
		}
		if s.Columns[i].Nullable {
			return fmt.Errorf("%w: primary-key column %q must be NOT NULL", ErrInvalid, k)
		}
	}
	names := map[string]bool{}
	for _, ix := range s.Indexes {
		if ix.Name == "" || names[strings.ToLower(ix.Name)] || len(ix.Columns) == 0 {
			return fmt.Errorf("%w: index %q: empty or duplicate name, or no columns", ErrInvalid, ix.Name)
		}
		names[strings.ToLower(ix.Name)] = true
		for _, c := range ix.Columns {
			if s.ColumnIndex(c) < 0 {
				return fmt.Errorf("%w: index %q: column %q does not exist", ErrInvalid, ix.Name, c)
			}
		}
	}
	return nil
}

// Table is a catalog table.
type Table struct {
	ID   uint32 `json:"id"`
	Name string `json:"name"`
	// PrimaryIndexID is the index-service id of the primary key.
	PrimaryIndexID uint32 `json:"primary_index_id"`
	Schema         Schema `json:"schema"`
	// SchemaVersion counts schema changes; files record the version they
	// were written with.
	SchemaVersion uint32    `json:"schema_version"`
	Created       time.Time `json:"created"`
}

// FileState is where a file is in its life.
type FileState uint8

// File states. A virtual file is a replayer's write buffer (blocks in
// memory and small flushed objects) with a fixed file id; combination makes
// it regular under the same id. Storage GC marks files aging while it
// rewrites them and retired once a swap replaced them; retired files are
// deleted when no query references them.
const (
	Virtual FileState = iota + 1
	Regular
	Aging
	Retired
)

var stateNames = map[FileState]string{Virtual: "virtual", Regular: "regular", Aging: "aging", Retired: "retired"}

func (s FileState) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// allowed lists the state changes SetFileState accepts.
var allowed = map[[2]FileState]bool{
	{Virtual, Regular}: true, {Virtual, Retired}: true,
	{Regular, Aging}: true, {Regular, Retired}: true, {Aging, Retired}: true, {Aging, Regular}: true,
	// A restore revives a file storage GC retired after the checkpoint.
	{Retired, Regular}: true,
}

// File is one file of a table.
type File struct {
	ID            uint64              `json:"id"`
	TableID       uint32              `json:"table_id"`
	Key           string              `json:"key"` // object key in the lake
	State         FileState           `json:"state"`
	Replayer      uint32              `json:"replayer"` // owner of its visibility
	SchemaVersion uint32              `json:"schema_version"`
	RowGroups     []lake.RowGroupMeta `json:"row_groups,omitempty"`
	Updated       time.Time           `json:"updated"`
}

// Rows is the file's total row count.
func (f *File) Rows() int64 {
	var n int64
	for _, g := range f.RowGroups {
		n += g.Rows
	}
	return n
}

// Live reports whether queries should read the file.
func (f *File) Live() bool { return f.State == Virtual || f.State == Regular || f.State == Aging }

// Snapshot is one immutable catalog version. Share it freely.
type Snapshot struct {
	version  uint64
	tables   map[uint32]*Table
	byName   map[string]uint32
	files    map[uint32][]*File // table → files, ascending id
	fileByID map[uint64]*File
	nextFile uint64 // ids below it were allocated
	nextTab  uint32
	nextIdx  uint32
}

// Version is the catalog version: it grows by one with every change.
func (s *Snapshot) Version() uint64 { return s.version }

// Table finds a table by name (case-insensitive).
func (s *Snapshot) Table(name string) (*Table, bool) {
	var id uint32
	var ok bool
	if buf, ascii := lowerASCII(name); ascii {
		id, ok = s.byName[string(buf[:len(name)])] // no allocation for the key
	} else {
		id, ok = s.byName[strings.ToLower(name)]
	}
	if !ok {
		return nil, false
	}
	return s.tables[id], true
}

// lowerASCII lowercases a short ASCII name on the stack: ingestion looks a
// table up for every change, and strings.ToLower allocates for any name
// with a capital. It reports false for other names.
func lowerASCII(name string) (buf [64]byte, ok bool) {
	if len(name) > len(buf) {
		return buf, false
	}
	for i := range len(name) {
		c := name[i]
		switch {
		case c >= 0x80:
			return buf, false
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	return buf, true
}

// TableByID finds a table by id.
func (s *Snapshot) TableByID(id uint32) (*Table, bool) {
	t, ok := s.tables[id]
	return t, ok
}

// Tables lists the tables by id.
func (s *Snapshot) Tables() []*Table {
	out := make([]*Table, 0, len(s.tables))
	for _, t := range s.tables {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *Table) int { return int(a.ID) - int(b.ID) })
	return out
}

// Files lists a table's files in any state, ascending by id. Do not modify.
func (s *Snapshot) Files(tableID uint32) []*File { return s.files[tableID] }

// LiveFiles lists the files a scan of the table reads at this version.
func (s *Snapshot) LiveFiles(tableID uint32) []*File {
	var out []*File
	for _, f := range s.files[tableID] {
		if f.Live() {
			out = append(out, f)
		}
	}
	return out
}

// File finds a file by id.
func (s *Snapshot) File(id uint64) (*File, bool) {
	f, ok := s.fileByID[id]
	return f, ok
}

// clone copies the maps (not the records, which are immutable) for a change.
func (s *Snapshot) clone() *Snapshot {
	n := &Snapshot{
		version:  s.version + 1,
		tables:   make(map[uint32]*Table, len(s.tables)),
		byName:   make(map[string]uint32, len(s.byName)),
		files:    make(map[uint32][]*File, len(s.files)),
		fileByID: make(map[uint64]*File, len(s.fileByID)),
		nextFile: s.nextFile, nextTab: s.nextTab, nextIdx: s.nextIdx,
	}
	for k, v := range s.tables {
		n.tables[k] = v
	}
	for k, v := range s.byName {
		n.byName[k] = v
	}
	for k, v := range s.files {
		n.files[k] = v
	}
	for k, v := range s.fileByID {
		n.fileByID[k] = v
	}
	return n
}

// putFile adds or replaces a file record in the snapshot.
func (s *Snapshot) putFile(f *File) {
	list := slices.Clone(s.files[f.TableID])
	i, found := slices.BinarySearchFunc(list, f.ID, func(x *File, id uint64) int {
		switch {
		case x.ID < id:
			return -1
		case x.ID > id:
			return 1
		}
		return 0
	})
	if found {
		list[i] = f
	} else {
		list = slices.Insert(list, i, f)
	}
	s.files[f.TableID] = list
	s.fileByID[f.ID] = f
}

func (s *Snapshot) dropFile(f *File) {
	s.files[f.TableID] = slices.DeleteFunc(slices.Clone(s.files[f.TableID]), func(x *File) bool { return x.ID == f.ID })
	delete(s.fileByID, f.ID)
}
