package sqlstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/skeena"
	"github.com/retinadb/retina/internal/types"
)

// PhysicalTables are the two engine tables every SQL table lives in; pass
// them to skeena.Open.
func PhysicalTables() []skeena.Table {
	return []skeena.Table{
		{TableSpec: engine.TableSpec{Name: EngineMemory}, Engine: skeena.Memory},
		{TableSpec: engine.TableSpec{Name: EngineStorage}, Engine: skeena.Storage},
	}
}

// The catalog lives in the storage engine under table id 0.
const (
	catalogDefs     = 0 // 0 | 0 | name → definition (JSON)
	catalogCounters = 1 // 0 | 1 → next table id (4), epoch (8)
	// 0 | 2 | name → definition (JSON) of a table dropped and not created
	// again under that name. A consumer that copies the store (HTAP)
	// empties its copy of such a table even if it missed the drop.
	catalogDropped = 2
	firstTableID   = 1
	// Hidden row ids are epoch<<rowidBits | n: every open starts a new
	// epoch, so ids never repeat without a scan for the largest one.
	rowidBits = 36
)

var stringType = []types.Type{types.Of(types.String)}

func defKey(name string) []byte {
	k, _ := index.AppendKey(tablePrefix(nil, 0), catalogDefs, stringType, []any{name})
	return k
}

func droppedKey(name string) []byte {
	k, _ := index.AppendKey(tablePrefix(nil, 0), catalogDropped, stringType, []any{name})
	return k
}

func countersKey() []byte {
	return binary.BigEndian.AppendUint32(tablePrefix(nil, 0), catalogCounters)
}

// Typed catalog errors.
var (
	ErrTableExists     = errors.New("table already exists")
	ErrNoSuchTable     = errors.New("table does not exist")
	ErrRowidsExhausted = errors.New("hidden row ids of this run are used up; restart the server to start a new range")
)

// Catalog holds the table definitions. Reads take a read lock on a map;
// DDL is serialized and commits its change through the store before the
// map changes.
type Catalog struct {
	store *skeena.Store

	mu     sync.RWMutex
	tables map[string]*Table // by lower-case name; never mutated once stored

	ddl    sync.Mutex
	nextID uint32
	epoch  uint64
	rowid  atomic.Uint64
}

// OpenCatalog loads the catalog from store and starts a new hidden-row-id
// epoch.
func OpenCatalog(ctx context.Context, store *skeena.Store) (*Catalog, error) {
	c := &Catalog{store: store, tables: make(map[string]*Table)}
	err := retry(ctx, func() error {
		clear(c.tables)
		tx := store.Begin()
		defer tx.Rollback()
		tables, err := TablesAt(ctx, tx)
		if err != nil {
			return err
		}
		for _, t := range tables {
			c.tables[strings.ToLower(t.Name)] = t
		}
		v, ok, err := tx.Get(ctx, EngineStorage, countersKey())
		if err != nil {
			return err
		}
		c.nextID, c.epoch = firstTableID, 0
		if ok {
			if len(v) != 12 {
				return fmt.Errorf("sql catalog: corrupt counters record of %d bytes", len(v))
			}
			c.nextID, c.epoch = binary.BigEndian.Uint32(v), binary.BigEndian.Uint64(v[4:])
		}
		c.epoch++
		if err := tx.Put(ctx, EngineStorage, countersKey(), c.counters()); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	if err != nil {
		return nil, fmt.Errorf("sql catalog: load: %w", err)
	}
	c.rowid.Store(c.epoch << rowidBits)
	return c, nil
}

// TablesAt lists the tables, by name, as tx's snapshot has them: what a
// consumer reading rows in tx must cover, though DDL may have moved on.
func TablesAt(ctx context.Context, tx *skeena.Tx) ([]*Table, error) {
	return definitions(ctx, tx, catalogDefs, "definition")
}

// DroppedAt lists the last definitions of the tables dropped and not
// created again, by name, as tx's snapshot has them.
func DroppedAt(ctx context.Context, tx *skeena.Tx) ([]*Table, error) {
	return definitions(ctx, tx, catalogDropped, "dropped-table record")
}

// definitions reads the table definitions stored under one catalog
// record kind, sorted by name.
func definitions(ctx context.Context, tx *skeena.Tx, kind uint32, what string) ([]*Table, error) {
	lo := binary.BigEndian.AppendUint32(tablePrefix(nil, 0), kind)
	var out []*Table
	var scanErr error
	err := tx.Scan(ctx, EngineStorage, "", lo, KeyEnd(lo), func(key, row []byte) bool {
		t := new(Table)
		if err := json.Unmarshal(row, t); err != nil {
			scanErr = fmt.Errorf("sql catalog: corrupt %s under key %x: %w", what, key, err)
			return false
		}
		out = append(out, t)
		return true
	})
	if err := errors.Join(err, scanErr); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Epoch numbers this opening of the catalog: it grows with every open.
func (c *Catalog) Epoch() uint64 { return c.epoch }

func (c *Catalog) counters() []byte {
	v := binary.BigEndian.AppendUint32(nil, c.nextID)
	return binary.BigEndian.AppendUint64(v, c.epoch)
}

// retry runs fn again while it fails with a retryable conflict.
func retry(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if err == nil || !engine.Retryable(err) {
			return err
		}
		if ctx.Err() != nil {
			return err
		}
	}
}

// Table finds a table by name (case-insensitive).
func (c *Catalog) Table(name string) (*Table, error) {
	c.mu.RLock()
	t, ok := c.tables[strings.ToLower(name)]
	c.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("table %s: %w", name, ErrNoSuchTable)
	}
	return t, nil
}

// Tables lists the tables by name.
func (c *Catalog) Tables() []*Table {
	c.mu.RLock()
	out := make([]*Table, 0, len(c.tables))
	for _, t := range c.tables {
		out = append(out, t)
	}
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// NextRowID hands out a hidden row id.
func (c *Catalog) NextRowID() (int64, error) {
	id := c.rowid.Add(1)
	if id>>rowidBits != c.epoch {
		return 0, ErrRowidsExhausted
	}
	return int64(id), nil
}

// Create adds a table. With ifNotExists an existing table of that name is
// not an error (and is left as it is).
func (c *Catalog) Create(ctx context.Context, def Table, ifNotExists bool) error {
	c.ddl.Lock()
	defer c.ddl.Unlock()
	if _, err := c.Table(def.Name); err == nil {
		if ifNotExists {
			return nil
		}
		return fmt.Errorf("table %s: %w", def.Name, ErrTableExists)
	}
	def.ID = c.nextID
	for i := range def.Indexes {
		def.Indexes[i].ID = uint32(i + 1)
	}
	if err := def.validate(); err != nil {
		return err
	}
	js, err := json.Marshal(&def)
	if err != nil {
		return err
	}
	next := c.nextID + 1
	err = retry(ctx, func() error {
		tx := c.store.Begin()
		defer tx.Rollback()
		if err := tx.Put(ctx, EngineStorage, defKey(strings.ToLower(def.Name)), js); err != nil {
			return err
		}
		if _, was, err := tx.Get(ctx, EngineStorage, droppedKey(strings.ToLower(def.Name))); err != nil {
			return err
		} else if was {
			if err := tx.Delete(ctx, EngineStorage, droppedKey(strings.ToLower(def.Name))); err != nil {
				return err
			}
		}
		v := binary.BigEndian.AppendUint32(nil, next)
		if err := tx.Put(ctx, EngineStorage, countersKey(), binary.BigEndian.AppendUint64(v, c.epoch)); err != nil {
			return err
		}
		if tx.Streaming() {
			tx.Attach(&ChangeSet{Created: []*Table{&def}})
		}
		return tx.Commit(ctx)
	})
	if err != nil {
		return fmt.Errorf("create table %s: %w", def.Name, err)
	}
	c.nextID = next
	c.mu.Lock()
	c.tables[strings.ToLower(def.Name)] = &def
	c.mu.Unlock()
	return nil
}

// Drop removes a table and its rows in one transaction. With ifExists a
// missing table is not an error.
func (c *Catalog) Drop(ctx context.Context, name string, ifExists bool) error {
	c.ddl.Lock()
	defer c.ddl.Unlock()
	t, err := c.Table(name)
	if err != nil {
		if ifExists {
			return nil
		}
		return err
	}
	def, err := json.Marshal(t)
	if err != nil {
		return err
	}
	err = retry(ctx, func() error {
		tx := c.store.Begin()
		defer tx.Rollback()
		name := strings.ToLower(t.Name)
		if err := tx.Delete(ctx, EngineStorage, defKey(name)); err != nil {
			return err
		}
		if err := tx.Put(ctx, EngineStorage, droppedKey(name), def); err != nil {
			return err
		}
		prefix := tablePrefix(nil, t.ID)
		var keys [][]byte
		if err := tx.Scan(ctx, t.physical(), "", prefix, KeyEnd(prefix), func(key, _ []byte) bool {
			keys = append(keys, append([]byte(nil), key...))
			return true
		}); err != nil {
			return err
		}
		for _, k := range keys {
			if err := tx.Delete(ctx, t.physical(), k); err != nil {
				return err
			}
		}
		if tx.Streaming() {
			tx.Attach(&ChangeSet{Dropped: []*Table{t}})
		}
		return tx.Commit(ctx)
	})
	if err != nil {
		return fmt.Errorf("drop table %s: %w", t.Name, err)
	}
	c.mu.Lock()
	delete(c.tables, strings.ToLower(t.Name))
	c.mu.Unlock()
	return nil
}
