// Package sqlstore maps SQL tables onto the Skeena store: a catalog of table
// definitions kept in the store itself, the encoding of rows and index
// entries as keys and values, and the row operations (insert, update,
// delete, lookups and range scans) a statement performs inside one Skeena
// transaction, with secondary indexes maintained alongside.
//
// Each engine holds one physical table ("memory" or "storage"); a SQL
// table's rows and index entries live in the engine its placement names,
// under keys that start with the table's id. Keeping index entries as
// ordinary keys makes index maintenance part of the same transaction, so a
// cross-engine commit covers rows and indexes alike.
//
// Key layout (all integers big-endian; columns in the order-preserving
// encoding of package index, so byte order is value order):
//
//	table id (4) | 0 (4)        | primary-key columns          → row
//	table id (4) | index id (4) | index columns [| pk columns] → pk columns
//
// A unique index's key ends after its columns, so two transactions that
// insert the same value write the same key and the second to commit fails
// its write check; a non-unique index (or a unique one with a NULL in it)
// appends the primary key to keep entries apart. The value of an index
// entry is the encoded primary key in both cases.
//
// A row is its column values in the same encoding, prefixed by 4 zero
// bytes. Table id 0 is the catalog: key 0 | 0 | name → the table's
// definition as JSON, and key 0 | 1 → the id and epoch counters.
package sqlstore

import (
	"fmt"
	"strings"

	"github.com/retinadb/retina/internal/oltp/skeena"
	"github.com/retinadb/retina/internal/types"
)

// Column is one column of a table.
type Column struct {
	Name string     `json:"name"`
	Type types.Type `json:"type"`
	// SQLType is the type as declared (e.g. "varchar(16)"), for clients
	// that ask for the table's definition.
	SQLType  string `json:"sql_type"`
	Nullable bool   `json:"nullable"`
	// Default is the default value as SQL text; empty with HasDefault
	// false means none (NULL if nullable).
	Default    string `json:"default,omitempty"`
	HasDefault bool   `json:"has_default,omitempty"`
	// MaxLen bounds string and bytes values (0: no bound).
	MaxLen int `json:"max_len,omitempty"`
}

// Index is a secondary index.
type Index struct {
	ID      uint32 `json:"id"`
	Name    string `json:"name"`
	Columns []int  `json:"columns"`
	Unique  bool   `json:"unique,omitempty"`
}

// Table is a table's definition.
type Table struct {
	ID      uint32   `json:"id"`
	Name    string   `json:"name"`
	Columns []Column `json:"columns"`
	// PK lists the primary-key columns; empty means the table has none
	// and rows are keyed by a hidden row id.
	PK      []int   `json:"pk,omitempty"`
	Indexes []Index `json:"indexes,omitempty"`
	Engine  string  `json:"engine"` // "memory" or "storage"
}

// Placement is the Skeena engine holding the table.
func (t *Table) Placement() skeena.Placement {
	if t.Engine == EngineStorage {
		return skeena.Storage
	}
	return skeena.Memory
}

// physical is the engine table holding this table's keys.
func (t *Table) physical() string { return t.Engine }

// Engine names as CREATE TABLE's ENGINE option and the catalog spell them.
const (
	EngineMemory  = "memory"
	EngineStorage = "storage"
)

// EngineName maps an ENGINE= option to a placement: MEMORY and HEAP choose
// the memory engine; InnoDB, storage and disk the storage engine.
func EngineName(option string) (string, error) {
	switch strings.ToLower(option) {
	case "memory", "heap", "mem":
		return EngineMemory, nil
	case "innodb", "storage", "disk", "rocksdb", "myisam":
		return EngineStorage, nil
	}
	return "", fmt.Errorf("ENGINE=%s: unknown engine; use MEMORY (the in-memory engine) or InnoDB (the storage engine)", option)
}

// ColumnIndex finds a column by name (case-insensitive), or -1.
func (t *Table) ColumnIndex(name string) int {
	for i, c := range t.Columns {
		if strings.EqualFold(c.Name, name) {
			return i
		}
	}
	return -1
}

// HiddenPK reports whether rows are keyed by a hidden row id.
func (t *Table) HiddenPK() bool { return len(t.PK) == 0 }

// pkTypes are the types of the key columns (the hidden row id is int64).
func (t *Table) pkTypes() []types.Type {
	if t.HiddenPK() {
		return []types.Type{types.Of(types.Int64)}
	}
	return t.colTypes(t.PK)
}

func (t *Table) colTypes(cols []int) []types.Type {
	out := make([]types.Type, len(cols))
	for i, c := range cols {
		out[i] = t.Columns[c].Type
	}
	return out
}

func (t *Table) allTypes() []types.Type {
	out := make([]types.Type, len(t.Columns))
	for i, c := range t.Columns {
		out[i] = c.Type
	}
	return out
}

// IndexByName finds a secondary index by name (case-insensitive).
func (t *Table) IndexByName(name string) (*Index, bool) {
	for i := range t.Indexes {
		if strings.EqualFold(t.Indexes[i].Name, name) {
			return &t.Indexes[i], true
		}
	}
	return nil, false
}

// validate checks a definition before it enters the catalog.
func (t *Table) validate() error {
	if t.Name == "" {
		return fmt.Errorf("a table needs a name")
	}
	if len(t.Columns) == 0 {
		return fmt.Errorf("table %s: a table needs at least one column", t.Name)
	}
	seen := map[string]bool{}
	for _, c := range t.Columns {
		n := strings.ToLower(c.Name)
		if seen[n] {
			return fmt.Errorf("table %s: column %s is declared twice", t.Name, c.Name)
		}
		seen[n] = true
		if err := c.Type.Validate(); err != nil {
			return fmt.Errorf("table %s, column %s: %w", t.Name, c.Name, err)
		}
	}
	check := func(what string, cols []int) error {
		used := map[int]bool{}
		for _, c := range cols {
			if c < 0 || c >= len(t.Columns) {
				return fmt.Errorf("table %s: %s names a column that does not exist", t.Name, what)
			}
			if used[c] {
				return fmt.Errorf("table %s: %s names column %s twice", t.Name, what, t.Columns[c].Name)
			}
			used[c] = true
		}
		return nil
	}
	if err := check("the primary key", t.PK); err != nil {
		return err
	}
	names := map[string]bool{}
	for _, ix := range t.Indexes {
		if len(ix.Columns) == 0 {
			return fmt.Errorf("table %s: index %s has no columns", t.Name, ix.Name)
		}
		if names[strings.ToLower(ix.Name)] {
			return fmt.Errorf("table %s: index name %s is used twice", t.Name, ix.Name)
		}
		names[strings.ToLower(ix.Name)] = true
		if err := check("index "+ix.Name, ix.Columns); err != nil {
			return err
		}
	}
	if t.Engine != EngineMemory && t.Engine != EngineStorage {
		return fmt.Errorf("table %s: engine %q is neither %s nor %s", t.Name, t.Engine, EngineMemory, EngineStorage)
	}
	return nil
}
