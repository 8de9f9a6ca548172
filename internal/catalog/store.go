package catalog

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/retinadb/retina/internal/lake"
)

// On-disk format: catalog.db is a bbolt database with three buckets.
//
//	meta    "format" → "2"; "state" → counters
//	tables  big-endian uint64 table id → Table
//	files   big-endian uint64 file id → File
//
// Every value but the format is JSON followed by 4 bytes, the big-endian
// CRC-32C (Castagnoli) of the key and the JSON: bbolt checksums only its
// meta pages, and a damaged value must be refused, not read as a different
// row count. A catalog without "format" was written before the checksums
// (format 1) and gains them when opened.
var (
	bucketMeta   = []byte("meta")
	bucketTables = []byte("tables")
	bucketFiles  = []byte("files")
	keyState     = []byte("state")
	keyFormat    = []byte("format")
)

const formatChecksummed = "2"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// seal appends the value's checksum.
func seal(key, val []byte) []byte {
	sum := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, val)
	return binary.BigEndian.AppendUint32(val, sum)
}

// unseal checks a sealed value and returns its JSON.
func unseal(key, raw []byte) ([]byte, error) {
	if len(raw) < 4 {
		return nil, fmt.Errorf("%w: the value of key %x is %d bytes, too short for its checksum", ErrCorrupt, key, len(raw))
	}
	val := raw[:len(raw)-4]
	if crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, val) != binary.BigEndian.Uint32(raw[len(raw)-4:]) {
		return nil, fmt.Errorf("%w: the value of key %x fails its checksum", ErrCorrupt, key)
	}
	return val, nil
}

// counters is the persisted allocation state.
type counters struct {
	Version  uint64 `json:"version"`
	NextFile uint64 `json:"next_file"`
	NextTab  uint32 `json:"next_table"`
	NextIdx  uint32 `json:"next_index"`
}

// Catalog is the embedded catalog. All methods are safe for concurrent use;
// changes are serialised, reads (Snapshot) never wait.
type Catalog struct {
	db     *bolt.DB
	mu     sync.Mutex // serialises changes
	cur    atomic.Pointer[Snapshot]
	closed bool
}

// Open opens (creating if needed) the catalog in dir. A damaged catalog
// file is refused with ErrCorrupt and its path.
func Open(dir string) (*Catalog, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("catalog: create %s: %w", dir, err)
	}
	path := filepath.Join(dir, "catalog.db")
	db, snap, err := openDB(path)
	if errors.Is(err, ErrCorrupt) {
		return nil, fmt.Errorf("catalog: %s is damaged: %w; restore the data directory from a backup, or start over with an empty one", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("catalog: %s: %w", path, err)
	}
	c := &Catalog{db: db}
	c.cur.Store(snap)
	return c, nil
}

// openDB opens, checks and loads the database. bbolt panics on some
// damaged pages, and reading a truncated file through its memory map
// faults: both are a damaged file, not a crash.
func openDB(path string) (db *bolt.DB, snap *Snapshot, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if db != nil {
				closeQuietly(db)
			}
			db, snap, err = nil, nil, fmt.Errorf("%w: %v", ErrCorrupt, p)
		}
	}()
	db, err = bolt.Open(path, 0o644, &bolt.Options{Timeout: 2 * time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, nil, fmt.Errorf("another process has it open: %w", err)
	}
	if errors.Is(err, bolt.ErrInvalid) || errors.Is(err, bolt.ErrVersionMismatch) || errors.Is(err, bolt.ErrChecksum) {
		return nil, nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if err != nil {
		return nil, nil, err
	}
	var damage []error
	err = db.View(func(tx *bolt.Tx) error {
		// Check reads every page below the high-water mark on a goroutine
		// of its own, where a fault would crash: the file must hold them.
		if st, err := os.Stat(path); err == nil && st.Size() < tx.Size() {
			damage = append(damage, fmt.Errorf("the file is %d bytes, its pages reach %d: it was cut short", st.Size(), tx.Size()))
			return nil
		}
		for e := range tx.Check() {
			if len(damage) < 3 {
				damage = append(damage, e)
			}
		}
		return nil
	})
	if err == nil && len(damage) > 0 {
		err = fmt.Errorf("%w: %v", ErrCorrupt, errors.Join(damage...))
	}
	if err == nil {
		snap = &Snapshot{
			tables: map[uint32]*Table{}, byName: map[string]uint32{},
			files: map[uint32][]*File{}, fileByID: map[uint64]*File{},
			nextFile: 1, nextTab: 1, nextIdx: 1,
		}
		err = db.Update(func(tx *bolt.Tx) error {
			for _, b := range [][]byte{bucketMeta, bucketTables, bucketFiles} {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			return load(tx, snap)
		})
	}
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, snap, nil
}

// closeQuietly closes a database that may be too damaged to close.
func closeQuietly(db *bolt.DB) {
	defer func() { recover() }()
	db.Close()
}

// load reads the whole catalog into snap, checking every value, and
// converts a format-1 catalog to checksummed values.
func load(tx *bolt.Tx, snap *Snapshot) error {
	meta := tx.Bucket(bucketMeta)
	legacy := false
	switch f := string(meta.Get(keyFormat)); {
	case f == formatChecksummed:
	case f == "" && meta.Get(keyState) == nil:
		// A new catalog.
	case f == "":
		legacy = true
	default:
		return fmt.Errorf("%w: unknown format %q (written by a newer Retina?)", ErrCorrupt, f)
	}
	read := func(key, raw []byte) ([]byte, error) {
		if legacy {
			return raw, nil
		}
		return unseal(key, raw)
	}
	if raw := meta.Get(keyState); raw != nil {
		val, err := read(keyState, raw)
		if err != nil {
			return err
		}
		var cnt counters
		if err := json.Unmarshal(val, &cnt); err != nil {
			return fmt.Errorf("%w: meta state: %v", ErrCorrupt, err)
		}
		snap.version, snap.nextFile, snap.nextTab, snap.nextIdx = cnt.Version, cnt.NextFile, cnt.NextTab, cnt.NextIdx
	}
	err := tx.Bucket(bucketTables).ForEach(func(k, v []byte) error {
		val, err := read(k, v)
		if err != nil {
			return err
		}
		t := new(Table)
		if err := json.Unmarshal(val, t); err != nil {
			return fmt.Errorf("%w: table %x: %v", ErrCorrupt, k, err)
		}
		snap.tables[t.ID] = t
		snap.byName[strings.ToLower(t.Name)] = t.ID
		return nil
	})
	if err != nil {
		return err
	}
	err = tx.Bucket(bucketFiles).ForEach(func(k, v []byte) error {
		val, err := read(k, v)
		if err != nil {
			return err
		}
		f := new(File)
		if err := json.Unmarshal(val, f); err != nil {
			return fmt.Errorf("%w: file %x: %v", ErrCorrupt, k, err)
		}
		snap.files[f.TableID] = append(snap.files[f.TableID], f) // keys ascend: lists stay sorted
		snap.fileByID[f.ID] = f
		return nil
	})
	if err != nil {
		return err
	}
	if legacy {
		return convertLegacy(tx)
	}
	return meta.Put(keyFormat, []byte(formatChecksummed))
}

// convertLegacy seals every value of a format-1 catalog.
func convertLegacy(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketMeta, bucketTables, bucketFiles} {
		b := tx.Bucket(name)
		type kv struct{ k, v []byte }
		var all []kv
		err := b.ForEach(func(k, v []byte) error {
			all = append(all, kv{slices.Clone(k), slices.Clone(v)})
			return nil
		})
		if err != nil {
			return err
		}
		for _, e := range all {
			if err := b.Put(e.k, seal(e.k, e.v)); err != nil {
				return err
			}
		}
	}
	return tx.Bucket(bucketMeta).Put(keyFormat, []byte(formatChecksummed))
}

// Snapshot returns the current catalog version.
func (c *Catalog) Snapshot() *Snapshot { return c.cur.Load() }

// Close closes the database; later changes fail with ErrClosed.
func (c *Catalog) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.db.Close()
}

// change runs fn on a copy of the current snapshot inside one bbolt
// transaction; the copy is published only if the transaction commits.
func (c *Catalog) change(ctx context.Context, fn func(next *Snapshot, tx *bolt.Tx) error) (*Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	next := c.cur.Load().clone()
	err := c.db.Update(func(tx *bolt.Tx) error {
		if err := fn(next, tx); err != nil {
			return err
		}
		raw, err := json.Marshal(counters{Version: next.version, NextFile: next.nextFile, NextTab: next.nextTab, NextIdx: next.nextIdx})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keyState, seal(keyState, raw))
	})
	if err != nil {
		return nil, err
	}
	c.cur.Store(next)
	return next, nil
}

func idKey[T uint32 | uint64](id T) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(id))
}

func putRecord[T uint32 | uint64](tx *bolt.Tx, bucket []byte, id T, rec any) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	key := idKey(id)
	return tx.Bucket(bucket).Put(key, seal(key, raw))
}

// CreateTable adds a table. Index-service ids are assigned to its primary
// key and secondary indexes.
func (c *Catalog) CreateTable(ctx context.Context, name string, schema Schema) (*Table, error) {
	if name == "" || strings.ContainsAny(name, " \t\n\"'`") {
		return nil, fmt.Errorf("%w: table name %q", ErrInvalid, name)
	}
	if err := schema.validate(); err != nil {
		return nil, err
	}
	var t *Table
	_, err := c.change(ctx, func(s *Snapshot, tx *bolt.Tx) error {
		if _, dup := s.byName[strings.ToLower(name)]; dup {
			return fmt.Errorf("%w: table %q", ErrExists, name)
		}
		sc := cloneSchema(schema)
		t = &Table{ID: s.nextTab, Name: name, PrimaryIndexID: s.nextIdx, Schema: sc, SchemaVersion: 1, Created: time.Now().UTC()}
		s.nextTab++
		s.nextIdx++
		for i := range sc.Indexes {
			sc.Indexes[i].ID = s.nextIdx
			s.nextIdx++
		}
		s.tables[t.ID] = t
		s.byName[strings.ToLower(name)] = t.ID
		return putRecord(tx, bucketTables, t.ID, t)
	})
	return t, err
}

func cloneSchema(s Schema) Schema {
	out := Schema{Columns: slices.Clone(s.Columns), PrimaryKey: slices.Clone(s.PrimaryKey), GeneratedKey: s.GeneratedKey}
	for _, ix := range s.Indexes {
		ix.Columns = slices.Clone(ix.Columns)
		out.Indexes = append(out.Indexes, ix)
	}
	return out
}

// AddColumn appends a nullable column: existing files read it as NULL.
func (c *Catalog) AddColumn(ctx context.Context, tableID uint32, col Column) (*Table, error) {
	if !col.Nullable {
		return nil, fmt.Errorf("%w: an added column must be nullable (old rows have no value)", ErrSchemaChange)
	}
	var t *Table
	_, err := c.change(ctx, func(s *Snapshot, tx *bolt.Tx) error {
		old, ok := s.tables[tableID]
		if !ok {
			return fmt.Errorf("%w: table %d", ErrNotFound, tableID)
		}
		sc := cloneSchema(old.Schema)
		sc.Columns = append(sc.Columns, col)
		if err := sc.validate(); err != nil {
			return err
		}
		nt := *old
		nt.Schema = sc
		nt.SchemaVersion++
		t = &nt
		s.tables[t.ID] = t
		return putRecord(tx, bucketTables, t.ID, t)
	})
	return t, err
}

// DropTable removes a table; its files become retired so storage GC can
// delete their objects.
func (c *Catalog) DropTable(ctx context.Context, tableID uint32) error {
	_, err := c.change(ctx, func(s *Snapshot, tx *bolt.Tx) error {
		t, ok := s.tables[tableID]
		if !ok {
			return fmt.Errorf("%w: table %d", ErrNotFound, tableID)
		}
		delete(s.tables, tableID)
		delete(s.byName, strings.ToLower(t.Name))
		for _, f := range s.files[tableID] {
			if f.State != Retired {
				if err := s.setState(tx, f, Retired, nil); err != nil {
					return err
				}
			}
		}
		return tx.Bucket(bucketTables).Delete(idKey(tableID))
	})
	return err
}

// AllocateFileIDs reserves n new file ids and returns the first. Ids are
// never handed out twice, even across restarts.
func (c *Catalog) AllocateFileIDs(ctx context.Context, n int) (uint64, error) {
	if n <= 0 {
		return 0, fmt.Errorf("%w: allocate %d file ids", ErrInvalid, n)
	}
	var first uint64
	_, err := c.change(ctx, func(s *Snapshot, _ *bolt.Tx) error {
		first = s.nextFile
		s.nextFile += uint64(n)
		return nil
	})
	return first, err
}

// checkNewFile validates a file about to be registered in s.
func (s *Snapshot) checkNewFile(f *File) error {
	switch {
	case f.ID == 0 || f.ID >= s.nextFile:
		return fmt.Errorf("%w: %d", ErrUnallocated, f.ID)
	case s.fileByID[f.ID] != nil:
		return fmt.Errorf("%w: file %d", ErrExists, f.ID)
	case s.tables[f.TableID] == nil:
		return fmt.Errorf("%w: table %d", ErrNotFound, f.TableID)
	case f.Key == "":
		return fmt.Errorf("%w: file %d has no object key", ErrInvalid, f.ID)
	case f.State != Virtual && f.State != Regular:
		return fmt.Errorf("%w: a new file is virtual or regular, not %s", ErrBadState, f.State)
	}
	return nil
}

// RegisterFile records a new file under an allocated id. A virtual file is
// registered before its first row so its id (and every row location in it)
// is fixed from the start.
func (c *Catalog) RegisterFile(ctx context.Context, f File) (*File, error) {
	nf := f
	nf.RowGroups = slices.Clone(f.RowGroups)
	_, err := c.change(ctx, func(s *Snapshot, tx *bolt.Tx) error {
		if err := s.checkNewFile(&nf); err != nil {
			return err
		}
		nf.SchemaVersion = s.tables[nf.TableID].SchemaVersion
		nf.Updated = time.Now().UTC()
		s.putFile(&nf)
		return putRecord(tx, bucketFiles, nf.ID, &nf)
	})
	if err != nil {
		return nil, err
	}
	return &nf, nil
}

func (s *Snapshot) setState(tx *bolt.Tx, f *File, state FileState, groups []lake.RowGroupMeta) error {
	if !allowed[[2]FileState{f.State, state}] {
		return fmt.Errorf("%w: file %d is %s, cannot become %s", ErrBadState, f.ID, f.State, state)
	}
	nf := *f
	nf.State = state
	if groups != nil {
		nf.RowGroups = slices.Clone(groups)
	}
	nf.Updated = time.Now().UTC()
	s.putFile(&nf)
	return putRecord(tx, bucketFiles, nf.ID, &nf)
}

// SetFileState moves a file to a new state, optionally replacing its row
// groups (a virtual file gets its final row group when it turns regular).
func (c *Catalog) SetFileState(ctx context.Context, id uint64, state FileState, groups []lake.RowGroupMeta) (*File, error) {
	var out *File
	_, err := c.change(ctx, func(s *Snapshot, tx *bolt.Tx) error {
		f, ok := s.fileByID[id]
		if !ok {
			return fmt.Errorf("%w: file %d", ErrNotFound, id)
		}
		if err := s.setState(tx, f, state, groups); err != nil {
			return err
		}
		out = s.fileByID[id]
		return nil
	})
	return out, err
}

// Swap replaces files of a table by others in one step (storage GC): every
// removed file becomes retired and every added file appears, or nothing
// changes. Queries planning on earlier snapshots keep reading the old files.
func (c *Catalog) Swap(ctx context.Context, tableID uint32, remove []uint64, add []File) (*Snapshot, error) {
	return c.SwapAll(ctx, []FileSwap{{Table: tableID, Remove: remove, Add: add}})
}

// FileSwap is one table's part of SwapAll: the files retired and the files
// that take their place.
type FileSwap struct {
	Table  uint32
	Remove []uint64
	Add    []File
}

// SwapAll makes several swaps in one durable change: all of them or none.
// Storage GC switches every rewrite a replay checkpoint takes at once, and
// replay waits for one catalog write (an fsync) instead of one per rewrite.
func (c *Catalog) SwapAll(ctx context.Context, swaps []FileSwap) (*Snapshot, error) {
	return c.change(ctx, func(s *Snapshot, tx *bolt.Tx) error {
		for _, sw := range swaps {
			if err := s.swap(tx, sw); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *Snapshot) swap(tx *bolt.Tx, sw FileSwap) error {
	if s.tables[sw.Table] == nil {
		return fmt.Errorf("%w: table %d", ErrNotFound, sw.Table)
	}
	for _, id := range sw.Remove {
		f, ok := s.fileByID[id]
		if !ok || f.TableID != sw.Table {
			return fmt.Errorf("%w: file %d of table %d", ErrNotFound, id, sw.Table)
		}
		if err := s.setState(tx, f, Retired, nil); err != nil {
			return err
		}
	}
	for _, f := range sw.Add {
		nf := f
		nf.TableID = sw.Table
		nf.RowGroups = slices.Clone(f.RowGroups)
		if err := s.checkNewFile(&nf); err != nil {
			return err
		}
		nf.SchemaVersion = s.tables[sw.Table].SchemaVersion
		nf.Updated = time.Now().UTC()
		s.putFile(&nf)
		if err := putRecord(tx, bucketFiles, nf.ID, &nf); err != nil {
			return err
		}
	}
	return nil
}

// DeleteFile forgets a retired file once its object is gone.
func (c *Catalog) DeleteFile(ctx context.Context, id uint64) error {
	_, err := c.change(ctx, func(s *Snapshot, tx *bolt.Tx) error {
		f, ok := s.fileByID[id]
		if !ok {
			return fmt.Errorf("%w: file %d", ErrNotFound, id)
		}
		if f.State != Retired {
			return fmt.Errorf("%w: file %d is %s, only retired files are deleted", ErrBadState, id, f.State)
		}
		s.dropFile(f)
		return tx.Bucket(bucketFiles).Delete(idKey(id))
	})
	return err
}
