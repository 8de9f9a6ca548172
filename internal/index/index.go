// Package index is Retina's index service: a versioned single-point index
// (SPI) from index keys to row ids, and the main index (MI) from row-id
// ranges to row locations, over a Pebble (durable) or in-memory backend.
//
// SPI entries are versioned by mirror-transaction timestamp: Lookup(key, ts)
// returns the entry with the largest timestamp ≤ ts, and a tombstone there
// means "not found". Unique indexes (primary keys included) map a key to one
// row id. Non-unique secondary indexes keep the row id as a key suffix:
// Scan(key, ts) returns every live row id for those key values.
//
// The memory backend keeps everything in RAM and writes nothing to disk: its
// durability comes from the replay checkpoints of the replayer (the index is
// rebuilt from the last checkpoint and the source). The Pebble backend is
// durable: every batch is fsynced in its write-ahead log before Apply
// returns, unless Config.NoSync or Config.NoWAL trades that for speed (the
// server keeps no log: Sync at a clean stop flushes the memtables, and any
// other stop rebuilds the index from the files).
package index

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/retinadb/retina/internal/types"
)

// Errors callers branch on.
var (
	ErrUnknownIndex = errors.New("index: unknown index")
	ErrNotFound     = errors.New("index: not found")
	ErrBadDef       = errors.New("index: invalid index definition")
	ErrClosed       = errors.New("index: closed")
	ErrInvalidTS    = errors.New("index: timestamp must be in [1, 2^52)")
)

const maxTS = 1<<52 - 1

// Def describes one index.
type Def struct {
	ID      uint32
	Name    string
	Columns []types.Type
	// Unique indexes map a key to one row id; non-unique ones store the row
	// id as a key suffix so equal keys can point at many rows.
	Unique bool
}

func (d Def) validate() error {
	if len(d.Columns) == 0 {
		return fmt.Errorf("%w: %s (id %d) has no columns", ErrBadDef, d.Name, d.ID)
	}
	for i, c := range d.Columns {
		if err := c.Validate(); err != nil {
			return fmt.Errorf("%w: %s column %d: %w", ErrBadDef, d.Name, i, err)
		}
	}
	return nil
}

func (d Def) equal(o Def) bool {
	return d.ID == o.ID && d.Name == o.Name && d.Unique == o.Unique && slices.Equal(d.Columns, o.Columns)
}

// Key is an encoded key of a defined index, made by Store.Key.
type Key struct {
	unique bool
	enc    []byte // index id + columns
}

// Bytes is the encoded key (see AppendKey); do not modify it.
func (k Key) Bytes() []byte { return k.enc }

// AppendBinary appends the key's binary form: whether its index is unique,
// then its encoding.
func (k Key) AppendBinary(dst []byte) ([]byte, error) {
	flag := byte(0)
	if k.unique {
		flag = 1
	}
	return append(append(dst, flag), k.enc...), nil
}

// UnmarshalBinary reads what AppendBinary wrote.
func (k *Key) UnmarshalBinary(b []byte) error {
	if len(b) < 1 || b[0] > 1 {
		return fmt.Errorf("index: a key's binary form starts with 0 or 1")
	}
	k.unique, k.enc = b[0] == 1, append([]byte(nil), b[1:]...)
	return nil
}

// entryKey is the SPI entry the op addresses: the key, plus the row id for
// non-unique indexes.
func (k Key) entryKey(dst []byte, rowID uint64) []byte {
	dst = append(dst, k.enc...)
	if !k.unique {
		dst = appendRowID(dst, rowID)
	}
	return dst
}

// Config selects and tunes the backend.
type Config struct {
	Backend string // "pebble" or "memory"
	Dir     string // pebble: the database directory
	// CacheBytes is Pebble's block cache (default 512 MiB).
	CacheBytes int64
	// MemTableBytes is Pebble's memtable size (default 64 MiB).
	MemTableBytes uint64
	// NoSync skips the WAL fsync on Apply. By default every acknowledged
	// write is fsynced (concurrent batches share one fsync). With NoSync a
	// write may still be in Pebble's buffer when Apply returns, so a crash can
	// lose recent writes: use it only when the replay checkpoint (which calls
	// Sync) is the recovery point anyway.
	NoSync bool
	// NoWAL keeps no write-ahead log at all: Sync flushes the memtables to
	// sstables, and a crash loses every write since the last Sync (Pebble
	// opens at that point). Use it when any unclean stop rebuilds the index
	// from the files, as the server does.
	NoWAL  bool
	Logger *slog.Logger
}

// op is one SPI write.
type op struct {
	entry []byte // entry key: encoded key [+ row id]
	ts    uint64
	rowID uint64
	tomb  bool
	multi bool // entry of a non-unique index: entry = key + row id
}

// spi is what a backend provides for the single-point index.
type spi interface {
	apply(ops []op) error
	// lookup finds the newest version ≤ ts of exactly entry.
	lookup(entry []byte, ts uint64) (rowID uint64, found bool, err error)
	// lookupBatch is lookup for many entries at one snapshot.
	lookupBatch(entries [][]byte, ts uint64, out []Found) error
	// mutate applies checked mutations of unique keys in order.
	mutate(muts []Mutation) error
	// revert removes exactly the versions (entry, ts) of ops, if present.
	revert(ops []op) error
	// each reports every entry under prefix whose newest version ≤ ts is
	// live, with its row id.
	each(prefix []byte, ts uint64, fn func(entry []byte, rowID uint64) error) error
	// scan reports the live row ids of non-unique entries under prefix.
	scan(prefix []byte, ts uint64, fn func(rowID uint64)) error
	// purge drops versions no snapshot ≥ gcTS can see.
	purge(gcTS uint64) (int, error)
	// versions counts the versions held, tombstones included.
	versions() (int64, error)
	// setHorizon says no snapshot below gcTS will read again: a version
	// superseded by one ≤ gcTS may go as soon as it is superseded.
	setHorizon(gcTS uint64)
	// stamp records the snapshot the index is at; stamped reads it back.
	stamp(ts uint64) error
	stamped() (uint64, bool, error)
	sync() error
	close() error
}

// Store is the index service. All methods are safe for concurrent use,
// except that Close must not overlap other calls (stop the writers first).
type Store struct {
	spi spi
	mi  *mainIndex

	defMu  sync.Mutex                     // serialises Define
	defs   atomic.Pointer[map[uint32]Def] // copy-on-write: readers never lock
	closed atomic.Bool
}

// Open opens the configured backend.
func Open(cfg Config) (*Store, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{}
	s.defs.Store(&map[uint32]Def{})
	switch cfg.Backend {
	case "memory":
		s.spi = newMemorySPI()
		s.mi = newMainIndex(nil)
	case "pebble", "":
		if cfg.Dir == "" {
			return nil, fmt.Errorf("index: the pebble backend needs a directory")
		}
		p, err := openPebble(cfg)
		if err != nil {
			return nil, err
		}
		s.spi = p
		if s.mi, err = loadMainIndex(p); err != nil {
			p.close()
			return nil, err
		}
	default:
		return nil, fmt.Errorf("index: unknown backend %q (want pebble or memory)", cfg.Backend)
	}
	return s, nil
}

// Define registers an index. Defining the same index again is a no-op;
// redefining an id differently is an error.
func (s *Store) Define(d Def) error {
	if err := d.validate(); err != nil {
		return err
	}
	d.Columns = slices.Clone(d.Columns)
	s.defMu.Lock()
	defer s.defMu.Unlock()
	cur := *s.defs.Load()
	if old, ok := cur[d.ID]; ok {
		if !old.equal(d) {
			return fmt.Errorf("%w: id %d is already %s", ErrBadDef, d.ID, old.Name)
		}
		return nil
	}
	next := maps.Clone(cur)
	next[d.ID] = d
	s.defs.Store(&next)
	return nil
}

// Key encodes key values of index id, checking them against its columns.
func (s *Store) Key(id uint32, vals ...any) (Key, error) {
	// Room for the id and fixed-width columns: one allocation, not one per
	// doubling.
	return s.AppendKey(make([]byte, 0, 4+10*len(vals)), id, vals...)
}

// AppendKey is Key encoding into dst's spare capacity.
func (s *Store) AppendKey(dst []byte, id uint32, vals ...any) (Key, error) {
	d, ok := (*s.defs.Load())[id]
	if !ok {
		return Key{}, fmt.Errorf("%w: %d", ErrUnknownIndex, id)
	}
	enc, err := AppendKey(dst[:0], id, d.Columns, vals)
	if err != nil {
		return Key{}, fmt.Errorf("index %s: %w", d.Name, err)
	}
	return Key{unique: d.Unique, enc: enc}, nil
}

func checkTS(ts uint64) error {
	if ts == 0 || ts > maxTS {
		return fmt.Errorf("%w: %d", ErrInvalidTS, ts)
	}
	return nil
}

func (s *Store) usable() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Batch collects SPI writes to apply together.
type Batch struct {
	ops []op
	buf []byte
}

// Put records that key maps to rowID from ts on.
func (b *Batch) Put(k Key, ts, rowID uint64) {
	b.add(k, ts, rowID, false)
}

// Tombstone records that key has no row from ts on. For a non-unique index
// rowID names the entry removed; for a unique index it is ignored.
func (b *Batch) Tombstone(k Key, ts, rowID uint64) {
	b.add(k, ts, rowID, true)
}

func (b *Batch) add(k Key, ts, rowID uint64, tomb bool) {
	start := len(b.buf)
	b.buf = k.entryKey(b.buf, rowID)
	b.ops = append(b.ops, op{entry: b.buf[start:len(b.buf):len(b.buf)], ts: ts, rowID: rowID, tomb: tomb, multi: !k.unique})
}

// Len is the number of writes in the batch.
func (b *Batch) Len() int { return len(b.ops) }

// Reset empties the batch for reuse.
func (b *Batch) Reset() {
	b.ops = b.ops[:0]
	b.buf = b.buf[:0]
}

// Apply writes the batch, in order: a later write of the same entry and
// timestamp replaces an earlier one. With Pebble the batch is atomic across
// a crash; concurrent readers of the memory backend may see part of it (the
// replayer never reads keys another bucket is writing).
func (s *Store) Apply(_ context.Context, b *Batch) error {
	if err := s.usable(); err != nil {
		return err
	}
	for _, o := range b.ops {
		if err := checkTS(o.ts); err != nil {
			return err
		}
	}
	return s.spi.apply(collapse(b.ops))
}

// collapse drops writes that the next write replaces (same entry and
// timestamp), e.g. the tombstone of an update that puts the same key at the
// same timestamp. It returns ops itself when nothing is dropped.
func collapse(ops []op) []op {
	var out []op
	for i := range ops {
		replaced := i+1 < len(ops) && ops[i+1].ts == ops[i].ts && bytes.Equal(ops[i+1].entry, ops[i].entry)
		switch {
		case replaced && out == nil:
			out = append(make([]op, 0, len(ops)), ops[:i]...)
		case !replaced && out != nil:
			out = append(out, ops[i])
		}
	}
	if out == nil {
		return ops
	}
	return out
}

// Put writes one version: key → rowID from ts on.
func (s *Store) Put(ctx context.Context, k Key, ts, rowID uint64) error {
	var b Batch
	b.Put(k, ts, rowID)
	return s.Apply(ctx, &b)
}

// Tombstone writes one deletion version; see Batch.Tombstone.
func (s *Store) Tombstone(ctx context.Context, k Key, ts, rowID uint64) error {
	var b Batch
	b.Tombstone(k, ts, rowID)
	return s.Apply(ctx, &b)
}

// MutKind is what a Mutation does to a unique key.
type MutKind uint8

// The mutation kinds.
const (
	// Insert puts RowID; the key must have no live row at TS.
	Insert MutKind = iota + 1
	// Delete writes a tombstone; the key must be live at TS. Old is set to
	// the row id it had.
	Delete
	// Replace puts RowID; the key must be live at TS. Old is set to the row
	// id it had.
	Replace
	// Upsert puts RowID whether or not the key is live at TS; Live and Old
	// report the row it replaced (a snapshot read of a row that exists).
	Upsert
)

func (k MutKind) String() string {
	switch k {
	case Insert:
		return "insert"
	case Delete:
		return "delete"
	case Replace:
		return "replace"
	case Upsert:
		return "upsert"
	}
	return fmt.Sprintf("mutation(%d)", uint8(k))
}

// ErrConflict is wrapped by a Mutation's Err when the key's state forbids
// it: an insert of a live key, a delete or replace of a key with no row.
var ErrConflict = errors.New("index: key conflict")

// Mutation is a checked write of a unique key: the replayer's unit of work,
// done with one lookup instead of a separate Lookup and Put.
type Mutation struct {
	Key   Key
	TS    uint64
	Kind  MutKind
	RowID uint64
	Old   uint64 // out: the previous row id, when Live
	Live  bool   // out: the key had a live row at TS
	Err   error  // out: nil, or an error wrapping ErrConflict
}

// Mutate applies the mutations in order; each sees the ones before it. A
// mutation whose check fails is skipped and gets Err; the others apply.
// It returns the number of failed mutations, and an error only when the
// backend fails (then none of the mutations may have applied).
func (s *Store) Mutate(_ context.Context, muts []Mutation) (int, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	for i := range muts {
		m := &muts[i]
		if !m.Key.unique {
			return 0, fmt.Errorf("%w: Mutate on a non-unique index; use Put and Tombstone", ErrBadDef)
		}
		if m.Kind < Insert || m.Kind > Upsert {
			return 0, fmt.Errorf("index: unknown mutation kind %d", m.Kind)
		}
		if err := checkTS(m.TS); err != nil {
			return 0, err
		}
	}
	if err := s.spi.mutate(muts); err != nil {
		return 0, err
	}
	failed := 0
	for i := range muts {
		if muts[i].Err != nil {
			failed++
		}
	}
	return failed, nil
}

// check decides a mutation given the key's current state; it returns the
// version to write.
func (m *Mutation) check(old uint64, live bool) (version, bool) {
	m.Live, m.Old = live, 0
	if live {
		m.Old = old
	}
	switch {
	case m.Kind == Insert && live:
		m.Err = fmt.Errorf("%w: insert of a key that has a live row", ErrConflict)
	case (m.Kind == Delete || m.Kind == Replace) && !live:
		m.Err = fmt.Errorf("%w: %s of a key that has no live row", ErrConflict, m.Kind)
	default:
		m.Err = nil
		if m.Kind == Delete {
			return version{m.TS, tombVal}, true
		}
		return version{m.TS, m.RowID}, true
	}
	return version{}, false
}

// Written names one version a write put into the index: the key, the row id
// (which, for a non-unique index, is part of the entry) and the timestamp.
type Written struct {
	Key   Key
	RowID uint64
	TS    uint64
}

// Revert removes exactly the given versions, wherever they are: the undo of
// mirror transactions rolled back before they committed. A version that is
// not there is skipped. Older versions of the same entries are untouched, so
// a lookup afterwards answers as if the reverted writes never happened.
func (s *Store) Revert(_ context.Context, ws []Written) error {
	if err := s.usable(); err != nil {
		return err
	}
	if len(ws) == 0 {
		return nil
	}
	var b Batch
	for _, w := range ws {
		b.add(w.Key, w.TS, w.RowID, false)
	}
	return s.spi.revert(b.ops)
}

// Each reports every entry of index id that is live at snapshot ts, in no
// particular order: the key and its row id. fn must not call the store.
func (s *Store) Each(_ context.Context, id uint32, ts uint64, fn func(k Key, rowID uint64) error) error {
	if err := s.usable(); err != nil {
		return err
	}
	d, ok := (*s.defs.Load())[id]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownIndex, id)
	}
	prefix := binary.BigEndian.AppendUint32(nil, id)
	return s.spi.each(prefix, ts, func(entry []byte, rowID uint64) error {
		if !d.Unique {
			entry = entry[:len(entry)-8] // the row id suffix
		}
		return fn(Key{unique: d.Unique, enc: entry}, rowID)
	})
}

// Lookup returns the row id of a unique index key at snapshot ts, or
// found = false when there is none (or a tombstone).
func (s *Store) Lookup(_ context.Context, k Key, ts uint64) (rowID uint64, found bool, err error) {
	if err := s.usable(); err != nil {
		return 0, false, err
	}
	if !k.unique {
		return 0, false, fmt.Errorf("%w: Lookup on a non-unique index; use Scan", ErrBadDef)
	}
	return s.spi.lookup(k.enc, ts)
}

// Found is one LookupBatch result.
type Found struct {
	RowID uint64
	OK    bool
}

// LookupBatch looks up many unique keys at one snapshot into out[:len(keys)].
func (s *Store) LookupBatch(_ context.Context, keys []Key, ts uint64, out []Found) error {
	if err := s.usable(); err != nil {
		return err
	}
	if len(out) < len(keys) {
		return fmt.Errorf("index: %d result slots for %d keys", len(out), len(keys))
	}
	entries := make([][]byte, len(keys))
	for i, k := range keys {
		if !k.unique {
			return fmt.Errorf("%w: Lookup on a non-unique index; use Scan", ErrBadDef)
		}
		entries[i] = k.enc
	}
	return s.spi.lookupBatch(entries, ts, out)
}

// Scan returns the live row ids of a non-unique index's key at snapshot ts,
// in row-id order.
func (s *Store) Scan(_ context.Context, k Key, ts uint64) ([]uint64, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	if k.unique {
		return nil, fmt.Errorf("%w: Scan on a unique index; use Lookup", ErrBadDef)
	}
	var ids []uint64
	err := s.spi.scan(k.enc, ts, func(id uint64) { ids = append(ids, id) })
	slices.Sort(ids)
	return ids, err
}

// Purge removes the versions that no snapshot ≥ gcTS can see: everything
// older than each entry's newest version ≤ gcTS, and that version too when
// it is a tombstone. It returns how many versions it removed.
func (s *Store) Purge(_ context.Context, gcTS uint64) (int, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	return s.spi.purge(gcTS)
}

// SetHorizon tells the index that no snapshot below gcTS reads it any more
// (the bound a purge at gcTS would use). The memory backend then drops a
// version, rather than keeping it for the next purge, when a write makes it
// invisible at every snapshot ≥ gcTS: an entry updated again and again
// between purges keeps two versions, not all of them. A horizon never
// moves back.
func (s *Store) SetHorizon(gcTS uint64) {
	if s.usable() == nil {
		s.spi.setHorizon(gcTS)
	}
}

// Stamp records in the index that it is the index at snapshot ts; a Sync
// after it makes the stamp durable with everything written before it. A
// clean stop stamps its checkpoint's snapshot, and a start keeps the index
// only if it finds that stamp: an index missing its last writes (a torn
// Pebble manifest reopens at an earlier state) is rebuilt, not served.
func (s *Store) Stamp(ts uint64) error {
	if err := s.usable(); err != nil {
		return err
	}
	return s.spi.stamp(ts)
}

// Stamped returns the last stamp, and false when there is none (always
// for the memory backend).
func (s *Store) Stamped() (uint64, bool, error) {
	if err := s.usable(); err != nil {
		return 0, false, err
	}
	return s.spi.stamped()
}

// Versions counts the key versions the index holds (tombstones included):
// what purges keep bounded. It walks the whole index.
func (s *Store) Versions() (int64, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	return s.spi.versions()
}

// Sync makes every applied write durable (a no-op for the memory backend).
func (s *Store) Sync() error {
	if err := s.usable(); err != nil {
		return err
	}
	return s.spi.sync()
}

// Close releases the backend. Later calls fail with ErrClosed.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	return s.spi.close()
}
