package index

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/retinadb/retina/internal/pebblelog"
)

// Pebble key layout:
//
//	'S' entry ^ts     → 8-byte row id, or empty for a tombstone
//	'M' first         → n (4) file id (8) row group (4) offset (4) [kept (4)…]
//	'T'               → ts (8): the snapshot a clean stop synced the index at
//
// All integers are big-endian. The kept row numbers (first + k, ascending)
// are there only after storage GC rewrote the range's file: the i-th of
// them lives at offset + i, and the range's other rows are gone.
//
// entry is the encoded key (plus the row id for non-unique indexes) and ts
// is inverted so a key's versions sort newest first: one seek to
// entry ^ts lands on the newest version ≤ ts. Encoded keys are prefix-free,
// so the bytes after entry are always exactly the 8 timestamp bytes.
//
// The comparer tells Pebble that split (the 'S' prefix and entry, without
// ^ts) is the key proper: sstables carry bloom filters of it, and a lookup
// is a prefix seek that skips every sstable whose filter says the entry is
// not there. Plain byte order is still the key order (entries are
// prefix-free), so only the name differs from Pebble's default comparer.
const (
	pfxSPI   = 'S'
	pfxMI    = 'M'
	keyStamp = 'T'
)

// comparerName is stored in the database; an index made with another
// comparer does not open and is rebuilt from the files.
const comparerName = "retina.index.v2"

var comparer = func() *pebble.Comparer {
	c := *pebble.DefaultComparer
	c.Name = comparerName
	c.Split = split
	// Pebble requires every key it compares, the ones it makes for index
	// blocks and seeks too, to order as "prefix by split, then version".
	// The default comparer shortens keys to any bytes in between, which
	// split would cut in the wrong place; so separators and successors are
	// the keys themselves, and a prefix's immediate successor is the
	// prefix with the largest version suffix (no stored version is 0).
	c.Separator = func(dst, a, _ []byte) []byte { return append(dst, a...) }
	c.Successor = func(dst, a []byte) []byte { return append(dst, a...) }
	c.ImmediateSuccessor = func(dst, prefix []byte) []byte {
		return append(append(dst, prefix...), 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
	}
	return &c
}()

// split is the length of a key without its version suffix.
func split(k []byte) int {
	if len(k) > 9 && k[0] == pfxSPI {
		return len(k) - 8
	}
	return len(k)
}

type pebbleSPI struct {
	db    *pebble.DB
	cache interface{ Unref() }
	wopt  *pebble.WriteOptions
	noWAL bool
	log   *slog.Logger
}

func openPebble(cfg Config) (*pebbleSPI, error) {
	if cfg.CacheBytes <= 0 {
		cfg.CacheBytes = 512 << 20
	}
	if cfg.MemTableBytes == 0 {
		cfg.MemTableBytes = 64 << 20
	}
	cache := pebble.NewCache(cfg.CacheBytes)
	opts := &pebble.Options{
		Cache:                       cache,
		Comparer:                    comparer,
		MemTableSize:                cfg.MemTableBytes,
		MemTableStopWritesThreshold: 4,
		L0CompactionThreshold:       4,
		L0StopWritesThreshold:       24,
		DisableWAL:                  cfg.NoWAL,
		Logger:                      pebblelog.Logger{Log: cfg.Logger},
	}
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	opts.EnsureDefaults()
	db, err := pebble.Open(cfg.Dir, opts)
	if err != nil {
		cache.Unref()
		return nil, fmt.Errorf("index: open pebble at %s: %w", cfg.Dir, err)
	}
	wopt := pebble.Sync
	if cfg.NoSync || cfg.NoWAL {
		wopt = pebble.NoSync
	}
	return &pebbleSPI{db: db, cache: cache, wopt: wopt, noWAL: cfg.NoWAL, log: cfg.Logger}, nil
}

func spiKey(dst, entry []byte, ts uint64) []byte {
	dst = append(dst, pfxSPI)
	dst = append(dst, entry...)
	return binary.BigEndian.AppendUint64(dst, ^ts)
}

func (p *pebbleSPI) apply(ops []op) error {
	b := p.db.NewBatch()
	defer b.Close()
	var key, val []byte
	for _, o := range ops {
		key = spiKey(key[:0], o.entry, o.ts)
		val = val[:0]
		if !o.tomb {
			val = binary.BigEndian.AppendUint64(val, o.rowID)
		}
		if err := b.Set(key, val, nil); err != nil {
			return fmt.Errorf("index: batch: %w", err)
		}
	}
	if err := b.Commit(p.wopt); err != nil {
		return fmt.Errorf("index: commit %d writes: %w", len(ops), err)
	}
	return nil
}

// bound makes an 'S' bound or seek key from a key prefix k: k followed by
// the version suffix of the newest possible version (^MaxUint64, all
// zeros). Every 'S' key Pebble sees must end in a version, or split would
// cut an unversioned one in the wrong place; no stored key lies between k
// and the bound, as every stored key has at least eight bytes after any
// entry prefix.
func bound(k []byte) []byte {
	return append(k, 0, 0, 0, 0, 0, 0, 0, 0)
}

// upperBound is the smallest key greater than every key with prefix p.
func upperBound(p []byte) []byte {
	up := bytes.Clone(p)
	for i := len(up) - 1; i >= 0; i-- {
		if up[i] != 0xFF {
			up[i]++
			return up[:i+1]
		}
	}
	return nil
}

func (p *pebbleSPI) lookup(entry []byte, ts uint64) (uint64, bool, error) {
	lower := append([]byte{pfxSPI}, entry...)
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: bound(bytes.Clone(lower)), UpperBound: bound(upperBound(lower))})
	if err != nil {
		return 0, false, fmt.Errorf("index: iterator: %w", err)
	}
	defer it.Close()
	return readVersion(it, spiKey(nil, entry, ts), len(lower))
}

func (p *pebbleSPI) lookupBatch(entries [][]byte, ts uint64, out []Found) error {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: []byte{pfxSPI}, UpperBound: []byte{pfxSPI + 1}})
	if err != nil {
		return fmt.Errorf("index: iterator: %w", err)
	}
	defer it.Close()
	var seek []byte
	for i, e := range entries {
		seek = spiKey(seek[:0], e, ts)
		id, ok, err := readVersion(it, seek, 1+len(e))
		if err != nil {
			return err
		}
		out[i] = Found{RowID: id, OK: ok}
	}
	return nil
}

func (p *pebbleSPI) mutate(muts []Mutation) error {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: []byte{pfxSPI}, UpperBound: []byte{pfxSPI + 1}})
	if err != nil {
		return fmt.Errorf("index: iterator: %w", err)
	}
	defer it.Close()
	b := p.db.NewBatch()
	defer b.Close()
	// Keys written earlier in this call: the iterator does not see them.
	written := map[string]version{}
	var seek, val []byte
	for i := range muts {
		m := &muts[i]
		var cur version
		found := false
		if w, ok := written[string(m.Key.enc)]; ok && w.ts <= m.TS {
			cur, found = w, true
		} else {
			seek = spiKey(seek[:0], m.Key.enc, m.TS)
			id, live, err := readVersion(it, seek, 1+len(m.Key.enc))
			if err != nil {
				return err
			}
			cur, found = version{val: id}, live
			if !live {
				cur.val = tombVal
			}
		}
		live := found && cur.val != tombVal
		nv, ok := m.check(cur.val, live)
		if !ok {
			continue
		}
		written[string(m.Key.enc)] = nv
		seek = spiKey(seek[:0], m.Key.enc, nv.ts)
		val = val[:0]
		if nv.val != tombVal {
			val = binary.BigEndian.AppendUint64(val, nv.val)
		}
		if err := b.Set(seek, val, nil); err != nil {
			return fmt.Errorf("index: batch: %w", err)
		}
	}
	if err := b.Commit(p.wopt); err != nil {
		for i := range muts {
			muts[i].Err = nil
		}
		return fmt.Errorf("index: commit %d mutations: %w", len(muts), err)
	}
	return nil
}

// readVersion seeks to seek (entry ^ts) and decodes the version found, if it
// belongs to the entry (length prefixLen+8).
func readVersion(it *pebble.Iterator, seek []byte, prefixLen int) (uint64, bool, error) {
	var found bool
	if len(seek) == prefixLen+8 && split(seek) == prefixLen {
		found = it.SeekPrefixGE(seek) // bloom filters skip sstables without the entry
	} else {
		found = it.SeekGE(seek)
	}
	if !found || len(it.Key()) != prefixLen+8 || !bytes.Equal(it.Key()[:prefixLen], seek[:prefixLen]) {
		return 0, false, it.Error()
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return 0, false, fmt.Errorf("index: read value: %w", err)
	}
	switch len(v) {
	case 0:
		return 0, false, nil // tombstone
	case 8:
		return binary.BigEndian.Uint64(v), true, nil
	}
	return 0, false, fmt.Errorf("index: corrupt value of %d bytes at %x", len(v), it.Key())
}

func (p *pebbleSPI) scan(prefix []byte, ts uint64, fn func(uint64)) error {
	lower := append([]byte{pfxSPI}, prefix...)
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: bound(bytes.Clone(lower)), UpperBound: bound(upperBound(lower))})
	if err != nil {
		return fmt.Errorf("index: iterator: %w", err)
	}
	defer it.Close()
	entryLen := len(lower) + 8 // prefix + row id
	var seek []byte
	for ok := it.First(); ok; {
		k := it.Key()
		if len(k) != entryLen+8 {
			return fmt.Errorf("index: unexpected key %x under non-unique prefix", k)
		}
		entry := bytes.Clone(k[:entryLen])
		seek = binary.BigEndian.AppendUint64(append(seek[:0], entry...), ^ts)
		id, live, err := readVersion(it, seek, entryLen)
		if err != nil {
			return err
		}
		if live {
			fn(id)
		}
		// Next row id: past every version of this entry.
		ok = it.SeekGE(bound(upperBound(entry)))
	}
	return it.Error()
}

func (p *pebbleSPI) revert(ops []op) error {
	b := p.db.NewBatch()
	defer b.Close()
	var key []byte
	for _, o := range ops {
		key = spiKey(key[:0], o.entry, o.ts)
		if err := b.Delete(key, nil); err != nil {
			return fmt.Errorf("index: batch: %w", err)
		}
	}
	if err := b.Commit(p.wopt); err != nil {
		return fmt.Errorf("index: revert %d versions: %w", len(ops), err)
	}
	return nil
}

func (p *pebbleSPI) each(prefix []byte, ts uint64, fn func(entry []byte, rowID uint64) error) error {
	lower := append([]byte{pfxSPI}, prefix...)
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: bound(bytes.Clone(lower)), UpperBound: bound(upperBound(lower))})
	if err != nil {
		return fmt.Errorf("index: iterator: %w", err)
	}
	defer it.Close()
	var seek []byte
	for ok := it.First(); ok; {
		k := it.Key()
		if len(k) < len(lower)+8 {
			return fmt.Errorf("index: short key %x", k)
		}
		entry := bytes.Clone(k[:len(k)-8])
		seek = binary.BigEndian.AppendUint64(append(seek[:0], entry...), ^ts)
		id, live, err := readVersion(it, seek, len(entry))
		if err != nil {
			return err
		}
		if live {
			if err := fn(entry[1:], id); err != nil {
				return err
			}
		}
		ok = it.SeekGE(bound(upperBound(entry))) // the next entry, past every version of this one
	}
	return it.Error()
}

func (p *pebbleSPI) purge(gcTS uint64) (int, error) {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: []byte{pfxSPI}, UpperBound: []byte{pfxSPI + 1}})
	if err != nil {
		return 0, fmt.Errorf("index: iterator: %w", err)
	}
	defer it.Close()
	b := p.db.NewBatch()
	defer b.Close()
	removed := 0
	var entry []byte
	seenVisible := false // the current entry's newest version ≤ gcTS was passed
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) < 9 {
			return removed, fmt.Errorf("index: short key %x", k)
		}
		e, ts := k[:len(k)-8], ^binary.BigEndian.Uint64(k[len(k)-8:])
		if !bytes.Equal(e, entry) {
			entry = append(entry[:0], e...)
			seenVisible = false
		}
		if ts > gcTS {
			continue
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return removed, err
		}
		// Versions arrive newest first: the first one ≤ gcTS is what
		// snapshots ≥ gcTS see (dropped too if it is a tombstone); every
		// older one is invisible to them.
		if seenVisible || len(v) == 0 {
			if err := b.Delete(k, nil); err != nil {
				return removed, err
			}
			removed++
		}
		seenVisible = true
		if b.Len() > 4<<20 {
			if err := b.Commit(p.wopt); err != nil {
				return removed, err
			}
			b.Reset()
		}
	}
	if err := it.Error(); err != nil {
		return removed, err
	}
	return removed, b.Commit(p.wopt)
}

func (p *pebbleSPI) versions() (int64, error) {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: []byte{pfxSPI}, UpperBound: []byte{pfxSPI + 1}})
	if err != nil {
		return 0, fmt.Errorf("index: iterator: %w", err)
	}
	var n int64
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	return n, errors.Join(it.Error(), it.Close())
}

func (p *pebbleSPI) stamp(ts uint64) error {
	if err := p.db.Set([]byte{keyStamp}, binary.BigEndian.AppendUint64(nil, ts), p.wopt); err != nil {
		return fmt.Errorf("index: stamp: %w", err)
	}
	return nil
}

func (p *pebbleSPI) stamped() (uint64, bool, error) {
	v, closer, err := p.db.Get([]byte{keyStamp})
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("index: read the stamp: %w", err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, false, fmt.Errorf("index: corrupt stamp of %d bytes", len(v))
	}
	return binary.BigEndian.Uint64(v), true, nil
}

// setHorizon does nothing: superseded versions stay in Pebble until a purge.
func (p *pebbleSPI) setHorizon(uint64) {}

func (p *pebbleSPI) sync() error {
	if p.noWAL {
		// Without a log only sstables are durable: flush the memtables.
		return p.db.Flush()
	}
	// An empty synced batch fsyncs the WAL behind every earlier write.
	return p.db.LogData(nil, pebble.Sync)
}

func (p *pebbleSPI) close() error {
	err := p.db.Close()
	p.cache.Unref()
	return err
}

func miKey(first uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{pfxMI}, first)
}

func (p *pebbleSPI) saveMI(put []miEntry, del []uint64) error {
	b := p.db.NewBatch()
	defer b.Close()
	for _, first := range del {
		if err := b.Delete(miKey(first), nil); err != nil {
			return err
		}
	}
	for _, e := range put {
		v := binary.BigEndian.AppendUint32(nil, e.r.N)
		v = binary.BigEndian.AppendUint64(v, e.loc.FileID)
		v = binary.BigEndian.AppendUint32(v, e.loc.RowGroup)
		v = binary.BigEndian.AppendUint32(v, e.loc.Offset)
		for _, k := range e.rows { // the rows storage GC kept, if it ran
			v = binary.BigEndian.AppendUint32(v, k)
		}
		if err := b.Set(miKey(e.r.First), v, nil); err != nil {
			return err
		}
	}
	if err := b.Commit(p.wopt); err != nil {
		return fmt.Errorf("index: main index write: %w", err)
	}
	return nil
}

func (p *pebbleSPI) loadMI(fn func(miEntry)) error {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: []byte{pfxMI}, UpperBound: []byte{pfxMI + 1}})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if len(k) != 9 || len(v) < 20 || (len(v)-20)%4 != 0 {
			return fmt.Errorf("corrupt main-index record %x = %x", k, v)
		}
		e := miEntry{
			r: RowRange{First: binary.BigEndian.Uint64(k[1:]), N: binary.BigEndian.Uint32(v)},
			loc: Location{
				FileID:   binary.BigEndian.Uint64(v[4:]),
				RowGroup: binary.BigEndian.Uint32(v[12:]),
				Offset:   binary.BigEndian.Uint32(v[16:]),
			},
		}
		for p := 20; p < len(v); p += 4 {
			e.rows = append(e.rows, binary.BigEndian.Uint32(v[p:]))
		}
		if e.rows != nil && (len(e.rows) > int(e.r.N) || !slices.IsSorted(e.rows) || e.rows[len(e.rows)-1] >= e.r.N) {
			return fmt.Errorf("corrupt main-index record %x: kept rows out of range or order", k)
		}
		fn(e)
	}
	return it.Error()
}
