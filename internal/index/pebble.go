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
//	'S' entry 0x00 ^ts 0x09 → 8-byte row id, or empty for a tombstone
//	'M' first               → n (4) file id (8) row group (4) offset (4) [kept (4)…]
//	'T'                     → ts (8): the snapshot a clean stop synced the index at
//
// All integers are big-endian. The kept row numbers (first + k, ascending)
// are there only after storage GC rewrote the range's file: the i-th of
// them lives at offset + i, and the range's other rows are gone.
//
// entry is the encoded key (plus the row id for non-unique indexes) and ts
// is inverted so a key's versions sort newest first: one seek to
// entry ^ts lands on the newest version ≤ ts. Encoded keys are prefix-free.
//
// The comparer tells Pebble that split ('S' entry 0x00, without the
// version) is the key proper: sstables carry bloom filters of it, and a
// lookup is a prefix seek that skips every sstable whose filter says the
// entry is not there. Pebble also splits bare prefixes (and requires that
// split leaves them whole), so a versioned key says it is one: it ends in
// 0x09 (the version's length with that byte) after the 0x00 that ends
// every prefix, and a prefix ends in that 0x00. Plain byte order is still
// the key order (entries are prefix-free), so only the name and split
// differ from Pebble's default comparer.
const (
	pfxSPI   = 'S'
	pfxMI    = 'M'
	keyStamp = 'T'
	// entryEnd ends every 'S' prefix; versionMark ends every versioned key.
	entryEnd    = 0x00
	versionMark = 0x09
	versionLen  = 9 // ^ts and versionMark
)

// comparerName is stored in the database; an index made with another
// comparer does not open and is rebuilt from the files.
const comparerName = "retina.index.v3"

var comparer = func() *pebble.Comparer {
	c := *pebble.DefaultComparer
	c.Name = comparerName
	c.Split = split
	// Pebble requires every key it compares, the ones it makes for index
	// blocks and seeks too, to order as "prefix by split, then version".
	// The default comparer shortens keys to any bytes in between, which
	// split would cut in the wrong place; so separators and successors are
	// the keys themselves. A prefix's immediate successor must sort after
	// every version of it: for an 'S' prefix, the prefix with its entryEnd
	// one higher (a bare prefix too, as split sees it).
	c.Separator = func(dst, a, _ []byte) []byte { return append(dst, a...) }
	c.Successor = func(dst, a []byte) []byte { return append(dst, a...) }
	c.ImmediateSuccessor = func(dst, prefix []byte) []byte {
		if len(prefix) >= 2 && prefix[0] == pfxSPI && prefix[len(prefix)-1] == entryEnd {
			return appendPastPrefix(dst, prefix)
		}
		return append(append(dst, prefix...), 0)
	}
	return &c
}()

// split is the length of a key without its version: the key whole unless
// it is a versioned 'S' key.
func split(k []byte) int {
	n := len(k)
	if n >= 2+versionLen && k[0] == pfxSPI && k[n-1] == versionMark && k[n-1-versionLen] == entryEnd {
		return n - versionLen
	}
	return n
}

// spiPrefix is entry's prefix: every version's key starts with it.
func spiPrefix(dst, entry []byte) []byte {
	dst = append(dst, pfxSPI)
	dst = append(dst, entry...)
	return append(dst, entryEnd)
}

func spiKey(dst, entry []byte, ts uint64) []byte {
	return versioned(spiPrefix(dst, entry), ts)
}

// versioned appends the version ts to a prefix.
func versioned(prefix []byte, ts uint64) []byte {
	return append(binary.BigEndian.AppendUint64(prefix, ^ts), versionMark)
}

// versionOf is the timestamp of a versioned key.
func versionOf(k []byte) uint64 {
	return ^binary.BigEndian.Uint64(k[len(k)-versionLen:])
}

// appendPastPrefix appends the smallest key after every version of
// prefix: the prefix with its last byte (entryEnd) one higher.
func appendPastPrefix(dst, prefix []byte) []byte {
	dst = append(dst, prefix...)
	dst[len(dst)-1]++
	return dst
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
	prefix := spiPrefix(nil, entry)
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: appendPastPrefix(nil, prefix)})
	if err != nil {
		return 0, false, fmt.Errorf("index: iterator: %w", err)
	}
	defer it.Close()
	return readVersion(it, versioned(bytes.Clone(prefix), ts), len(prefix))
}

func (p *pebbleSPI) lookupBatch(entries [][]byte, ts uint64, out []Found) error {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: []byte{pfxSPI}, UpperBound: []byte{pfxSPI + 1}})
	if err != nil {
		return fmt.Errorf("index: iterator: %w", err)
	}
	defer it.Close()
	var seek []byte
	for _, i := range keyOrder(len(entries), func(i int) []byte { return entries[i] }) {
		seek = spiKey(seek[:0], entries[i], ts)
		id, ok, err := readVersion(it, seek, len(seek)-versionLen)
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
	// In key order, a key's mutations in their given order: each seek
	// lands after the one before it, which Pebble's iterator turns into a
	// short step forward where it can, and a key's mutations are adjacent.
	order := keyOrder(len(muts), func(i int) []byte { return muts[i].Key.enc })
	// The previous mutation's key and what it wrote: the iterator does not
	// see writes of this call.
	var lastKey []byte
	var last version
	haveLast := false
	var seek, val []byte
	for _, i := range order {
		m := &muts[i]
		var cur version
		found := false
		if haveLast && !bytes.Equal(lastKey, m.Key.enc) {
			haveLast = false // the first mutation of another key
		}
		if haveLast && last.ts <= m.TS {
			cur, found = last, true
		} else {
			seek = spiKey(seek[:0], m.Key.enc, m.TS)
			id, live, err := readVersion(it, seek, len(seek)-versionLen)
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
		lastKey, last, haveLast = m.Key.enc, nv, true
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

// keyOrder is the positions 0..n-1 in the order of their keys, equal keys
// in position order. Seeks in key order each land after the one before, which
// Pebble's iterator turns into a short step forward where it can (the same
// sstable, its index block already loaded): one goroutine looking up
// batches of 512 random keys of a compacted 4M-key index did 10% more per
// second, and bench index's checked updates, memtables and sstables
// overlapping, 30-50% more.
func keyOrder(n int, key func(int) []byte) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return bytes.Compare(key(a), key(b)) })
	return order
}

// readVersion seeks to seek (a prefix and a version) and decodes the version
// found, if it has the same prefix (of length prefixLen).
func readVersion(it *pebble.Iterator, seek []byte, prefixLen int) (uint64, bool, error) {
	// A prefix seek: bloom filters skip sstables without the entry.
	found := it.SeekPrefixGE(seek)
	if !found || len(it.Key()) != prefixLen+versionLen || !bytes.Equal(it.Key()[:prefixLen], seek[:prefixLen]) {
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
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upperBound(lower)})
	if err != nil {
		return fmt.Errorf("index: iterator: %w", err)
	}
	defer it.Close()
	keyLen := len(lower) + 8 + 1 + versionLen // prefix, row id, entryEnd, version
	var seek []byte
	for ok := it.First(); ok; {
		k := it.Key()
		if len(k) != keyLen || split(k) != keyLen-versionLen {
			return fmt.Errorf("index: unexpected key %x under non-unique prefix", k)
		}
		entryPrefix := bytes.Clone(k[:keyLen-versionLen])
		seek = versioned(append(seek[:0], entryPrefix...), ts)
		id, live, err := readVersion(it, seek, len(entryPrefix))
		if err != nil {
			return err
		}
		if live {
			fn(id)
		}
		// Next row id: past every version of this entry.
		ok = it.SeekGE(appendPastPrefix(nil, entryPrefix))
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
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upperBound(lower)})
	if err != nil {
		return fmt.Errorf("index: iterator: %w", err)
	}
	defer it.Close()
	var seek []byte
	for ok := it.First(); ok; {
		k := it.Key()
		n := split(k)
		if n == len(k) || n < len(lower)+1 {
			return fmt.Errorf("index: key %x has no version", k)
		}
		entryPrefix := bytes.Clone(k[:n])
		seek = versioned(append(seek[:0], entryPrefix...), ts)
		id, live, err := readVersion(it, seek, len(entryPrefix))
		if err != nil {
			return err
		}
		if live {
			if err := fn(entryPrefix[1:len(entryPrefix)-1], id); err != nil {
				return err
			}
		}
		ok = it.SeekGE(appendPastPrefix(nil, entryPrefix)) // the next entry, past every version of this one
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
		n := split(k)
		if n == len(k) {
			return removed, fmt.Errorf("index: key %x has no version", k)
		}
		e, ts := k[:n], versionOf(k)
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
