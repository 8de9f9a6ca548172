package index

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// tombVal marks a tombstone version; real row ids are below it.
const tombVal = math.MaxUint64

type version struct {
	ts  uint64
	val uint64 // row id, or tombVal
}

// slot holds an entry's two newest versions inline; older ones (an entry
// updated several times since the last purge) spill to a side map. Slots
// and short keys contain no pointers, so the garbage collector never scans
// the big maps however many keys they hold.
type slot struct {
	last  version
	prev  version // ts 0 when absent
	spill bool    // versions older than prev are in the shard's spill map
}

// shortKeyLen is the longest entry kept as a fixed-size key: 24 bytes
// hold an index id and four 32-bit columns (TPC-C's order lines).
const shortKeyLen = 24

// shortKey is an entry of 1..shortKeyLen bytes, zero-padded, and its
// length (which tells "ab" from "ab\x00").
type shortKey struct {
	b [shortKeyLen]byte
	n uint8
}

// toShortKey makes the fixed-size key of an entry of 1..shortKeyLen bytes
// (entries are never empty: they start with the index id).
func toShortKey(b []byte) (k shortKey, ok bool) {
	if len(b) > shortKeyLen || len(b) == 0 {
		return k, false
	}
	copy(k.b[:], b)
	k.n = uint8(len(b))
	return k, true
}

func (k *shortKey) bytes() []byte { return k.b[:k.n] }

type memShard struct {
	mu         sync.Mutex // not RW: writers are most callers, and an RWMutex costs them twice the atomics
	short      slotTable
	long       map[string]slot // entries longer than shortKeyLen
	spillShort map[shortKey][]version
	spillLong  map[string][]version
	// peak is the most entries the maps (long, spillShort, spillLong)
	// held since they were last built: Go maps keep their tables after
	// deletes, so a purge that leaves far fewer entries rebuilds them (see
	// shrink). The slot table compacts itself.
	peak [3]int
}

// shrink rebuilds the maps that a purge left at under a quarter of their
// peak, so memory follows the live entries rather than the most ever held.
func (sh *memShard) shrink() {
	sh.short.compact()
	sh.long = shrunk(sh.long, &sh.peak[0])
	sh.spillShort = shrunk(sh.spillShort, &sh.peak[1])
	sh.spillLong = shrunk(sh.spillLong, &sh.peak[2])
}

// minShrink is the smallest peak worth a rebuild.
const minShrink = 64

func shrunk[K comparable, V any](m map[K]V, peak *int) map[K]V {
	if len(m) >= *peak/4 || *peak < minShrink {
		return m
	}
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	*peak = len(m)
	return out
}

// notePeaks records the sizes before a purge: entries only leave the maps
// by purges (and rare reverts), so these are the peaks since the last one.
func (sh *memShard) notePeaks() {
	for i, n := range [3]int{len(sh.long), len(sh.spillShort), len(sh.spillLong)} {
		sh.peak[i] = max(sh.peak[i], n)
	}
}

func (sh *memShard) getSpill(entry []byte) []version {
	if k, ok := toShortKey(entry); ok {
		return sh.spillShort[k]
	}
	return sh.spillLong[string(entry)]
}

// spilled is getSpill for an entry whose slot is s: without a spill flag
// there is nothing to look up.
func (sh *memShard) spilled(entry []byte, s slot) []version {
	if !s.spill {
		return nil
	}
	return sh.getSpill(entry)
}

func (sh *memShard) setSpill(entry []byte, vs []version) {
	if k, ok := toShortKey(entry); ok {
		if len(vs) == 0 {
			delete(sh.spillShort, k)
		} else {
			sh.spillShort[k] = vs
		}
		return
	}
	if len(vs) == 0 {
		delete(sh.spillLong, string(entry))
	} else {
		sh.spillLong[string(entry)] = vs
	}
}

func (sh *memShard) get(entry []byte) (slot, bool) {
	if k, ok := toShortKey(entry); ok {
		return sh.short.get(&k)
	}
	s, found := sh.long[string(entry)]
	return s, found
}

// getToUpdate is get for a writer (mu held) that sets the entry next.
func (sh *memShard) getToUpdate(entry []byte) (slot, bool) {
	if k, ok := toShortKey(entry); ok {
		return sh.short.getToUpdate(&k)
	}
	s, found := sh.long[string(entry)]
	return s, found
}

func (sh *memShard) set(entry []byte, s slot) {
	if k, ok := toShortKey(entry); ok {
		sh.short.set(&k, s)
		return
	}
	sh.long[string(entry)] = s
}

func (sh *memShard) remove(entry []byte) {
	if k, ok := toShortKey(entry); ok {
		sh.short.remove(&k)
	} else {
		delete(sh.long, string(entry))
	}
	sh.setSpill(entry, nil)
}

// all lists an entry's versions, oldest first.
func (sh *memShard) all(entry []byte, s slot) []version {
	var out []version
	if s.spill {
		out = append(out, sh.getSpill(entry)...)
	}
	if s.prev.ts != 0 {
		out = append(out, s.prev)
	}
	return append(out, s.last)
}

// store writes a non-empty ascending version list back into slot form.
func (sh *memShard) store(entry []byte, vs []version) {
	s := slot{last: vs[len(vs)-1]}
	if len(vs) > 1 {
		s.prev = vs[len(vs)-2]
	}
	older := vs[:max(len(vs)-2, 0)]
	sh.setSpill(entry, slices.Clone(older))
	s.spill = len(older) > 0
	sh.set(entry, s)
}

func (sh *memShard) at(entry []byte, s slot, ts uint64) (version, bool) {
	switch {
	case s.last.ts <= ts:
		return s.last, true
	case s.prev.ts != 0 && s.prev.ts <= ts:
		return s.prev, true
	case s.spill:
		older := sh.getSpill(entry)
		for i := len(older) - 1; i >= 0; i-- {
			if older[i].ts <= ts {
				return older[i], true
			}
		}
	}
	return version{}, false
}

// put adds or replaces the version at nv.ts; called with mu held. Versions
// no snapshot ≥ horizon sees may go instead of being kept for the purge.
func (sh *memShard) put(entry []byte, nv version, horizon uint64) (isNew bool) {
	s, found := sh.getToUpdate(entry)
	return sh.putAt(entry, s, found, nv, horizon)
}

// putAt is put for a caller that already holds the entry's slot: a
// replayer's update looks the entry up once, not twice.
func (sh *memShard) putAt(entry []byte, s slot, found bool, nv version, horizon uint64) (isNew bool) {
	switch {
	case !found:
		sh.set(entry, slot{last: nv})
		return true
	case nv.ts == s.last.ts:
		s.last = nv
		sh.set(entry, s)
	case nv.ts > s.last.ts:
		// The newest version ≤ horizon is the oldest any snapshot still
		// reads: the versions older than it are the purge's already.
		switch {
		case s.prev.ts == 0:
		case s.last.ts <= horizon: // prev and the spilled versions go
			if s.spill {
				sh.setSpill(entry, nil)
				s.spill = false
			}
		case s.prev.ts <= horizon: // prev is kept, the spilled versions go
			sh.setSpill(entry, append(sh.spilled(entry, s)[:0], s.prev))
			s.spill = true
		default: // the usual next version: push prev down
			sh.setSpill(entry, append(sh.spilled(entry, s), s.prev))
			s.spill = true
		}
		s.prev, s.last = s.last, nv
		sh.set(entry, s)
	default: // a third version, or one out of timestamp order
		vs := sh.all(entry, s)
		i, exact := slices.BinarySearchFunc(vs, nv.ts, func(v version, ts uint64) int {
			switch {
			case v.ts < ts:
				return -1
			case v.ts > ts:
				return 1
			}
			return 0
		})
		if exact {
			vs[i] = nv
		} else {
			vs = slices.Insert(vs, i, nv)
		}
		sh.store(entry, vs)
	}
	return false
}

// purgeEntry drops what no snapshot ≥ gcTS sees. It returns how many
// versions went and whether the entry is gone.
func (sh *memShard) purgeEntry(entry []byte, s slot, gcTS uint64) (int, bool) {
	if s.prev.ts == 0 && !s.spill { // one version: only a tombstone ≤ gcTS goes
		if s.last.ts <= gcTS && s.last.val == tombVal {
			sh.remove(entry)
			return 1, true
		}
		return 0, false
	}
	vs := sh.all(entry, s)
	keep := -1 // newest version ≤ gcTS
	for i, v := range vs {
		if v.ts <= gcTS {
			keep = i
		}
	}
	if keep < 0 {
		return 0, false
	}
	if vs[keep].val == tombVal {
		keep++
	}
	if keep == 0 {
		return 0, false
	}
	if keep == len(vs) {
		sh.remove(entry)
		return keep, true
	}
	sh.store(entry, vs[keep:])
	return keep, false
}

const memShards = 256

type prefixShard struct {
	mu sync.RWMutex
	m  map[string]map[uint64]struct{} // non-unique key → row ids with entries
}

// memorySPI is the in-memory backend: hash-sharded maps under RW locks.
type memorySPI struct {
	// horizon is the latest bound below which no snapshot reads (see
	// Store.SetHorizon).
	horizon  atomic.Uint64
	seed     maphash.Seed
	shards   [memShards]memShard
	prefixes [memShards]prefixShard
}

func newMemorySPI() *memorySPI {
	s := &memorySPI{seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i] = memShard{
			short: newSlotTable(), long: map[string]slot{},
			spillShort: map[shortKey][]version{}, spillLong: map[string][]version{},
		}
		s.prefixes[i].m = map[string]map[uint64]struct{}{}
	}
	return s
}

func (s *memorySPI) shard(b []byte) *memShard { return &s.shards[maphash.Bytes(s.seed, b)%memShards] }

func (s *memorySPI) apply(ops []op) error {
	for _, o := range ops {
		val := o.rowID
		if o.tomb {
			val = tombVal
		}
		sh := s.shard(o.entry)
		sh.mu.Lock()
		isNew := sh.put(o.entry, version{o.ts, val}, s.horizon.Load())
		sh.mu.Unlock()
		if isNew && o.multi {
			s.addPrefix(o.entry[:len(o.entry)-8], o.rowID)
		}
	}
	return nil
}

func (s *memorySPI) mutate(muts []Mutation) error {
	for i := range muts {
		m := &muts[i]
		sh := s.shard(m.Key.enc)
		sh.mu.Lock()
		var cur version
		sl, inMap := sh.getToUpdate(m.Key.enc)
		found := false
		if inMap {
			cur, found = sh.at(m.Key.enc, sl, m.TS)
		}
		live := found && cur.val != tombVal
		if nv, ok := m.check(cur.val, live); ok {
			sh.putAt(m.Key.enc, sl, inMap, nv, s.horizon.Load())
		}
		sh.mu.Unlock()
	}
	return nil
}

func (s *memorySPI) revert(ops []op) error {
	for _, o := range ops {
		sh := s.shard(o.entry)
		sh.mu.Lock()
		gone := sh.removeVersion(o.entry, o.ts)
		sh.mu.Unlock()
		if gone && o.multi {
			s.dropPrefixEntry(o.entry)
		}
	}
	return nil
}

// removeVersion drops the version at ts of entry, if there is one, and
// reports whether the entry is gone; called with mu held.
func (sh *memShard) removeVersion(entry []byte, ts uint64) (gone bool) {
	s, found := sh.getToUpdate(entry)
	if !found {
		return false
	}
	vs := sh.all(entry, s)
	i := slices.IndexFunc(vs, func(v version) bool { return v.ts == ts })
	if i < 0 {
		return false
	}
	vs = slices.Delete(vs, i, i+1)
	if len(vs) == 0 {
		sh.remove(entry)
		return true
	}
	sh.store(entry, vs)
	return false
}

func (s *memorySPI) each(prefix []byte, ts uint64, fn func(entry []byte, rowID uint64) error) error {
	type hit struct {
		entry []byte
		row   uint64
	}
	for i := range s.shards {
		sh := &s.shards[i]
		var hits []hit
		visit := func(entry []byte, sl slot) {
			if !bytes.HasPrefix(entry, prefix) {
				return
			}
			if v, ok := sh.at(entry, sl, ts); ok && v.val != tombVal {
				hits = append(hits, hit{slices.Clone(entry), v.val})
			}
		}
		sh.mu.Lock()
		for k, sl := range sh.short.all() {
			visit(k.bytes(), sl)
		}
		for k, sl := range sh.long {
			visit([]byte(k), sl)
		}
		sh.mu.Unlock()
		for _, h := range hits {
			if err := fn(h.entry, h.row); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *memorySPI) addPrefix(prefix []byte, rowID uint64) {
	ps := &s.prefixes[maphash.Bytes(s.seed, prefix)%memShards]
	ps.mu.Lock()
	set := ps.m[string(prefix)]
	if set == nil {
		set = map[uint64]struct{}{}
		ps.m[string(prefix)] = set
	}
	set[rowID] = struct{}{}
	ps.mu.Unlock()
}

func (s *memorySPI) lookup(entry []byte, ts uint64) (uint64, bool, error) {
	sh := s.shard(entry)
	sh.mu.Lock()
	sl, ok := sh.get(entry)
	var x version
	if ok {
		x, ok = sh.at(entry, sl, ts)
	}
	sh.mu.Unlock()
	if !ok || x.val == tombVal {
		return 0, false, nil
	}
	return x.val, true, nil
}

func (s *memorySPI) lookupBatch(entries [][]byte, ts uint64, out []Found) error {
	for i, e := range entries {
		id, ok, _ := s.lookup(e, ts)
		out[i] = Found{RowID: id, OK: ok}
	}
	return nil
}

func (s *memorySPI) scan(prefix []byte, ts uint64, fn func(uint64)) error {
	ps := &s.prefixes[maphash.Bytes(s.seed, prefix)%memShards]
	ps.mu.RLock()
	ids := make([]uint64, 0, len(ps.m[string(prefix)]))
	for id := range ps.m[string(prefix)] {
		ids = append(ids, id)
	}
	ps.mu.RUnlock()
	entry := append([]byte(nil), prefix...)
	for _, id := range ids {
		entry = appendRowID(entry[:len(prefix)], id)
		if _, live, _ := s.lookup(entry, ts); live {
			fn(id)
		}
	}
	return nil
}

func (s *memorySPI) purge(gcTS uint64) (int, error) {
	total := 0
	for i := range s.shards {
		sh := &s.shards[i]
		var gone [][]byte
		sh.mu.Lock()
		sh.notePeaks()
		for k, sl := range sh.short.all() {
			n, empty := sh.purgeEntry(k.bytes(), sl, gcTS)
			total += n
			if empty {
				gone = append(gone, slices.Clone(k.bytes()))
			}
		}
		for k, sl := range sh.long {
			n, empty := sh.purgeEntry([]byte(k), sl, gcTS)
			total += n
			if empty {
				gone = append(gone, []byte(k))
			}
		}
		sh.shrink()
		sh.mu.Unlock()
		for _, e := range gone {
			s.dropPrefixEntry(e)
		}
	}
	return total, nil
}

func (s *memorySPI) versions() (int64, error) {
	var n int64
	count := func(sl slot) {
		n++
		if sl.prev.ts != 0 {
			n++
		}
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, sl := range sh.short.all() {
			count(sl)
		}
		for _, sl := range sh.long {
			count(sl)
		}
		for _, vs := range sh.spillShort {
			n += int64(len(vs))
		}
		for _, vs := range sh.spillLong {
			n += int64(len(vs))
		}
		sh.mu.Unlock()
	}
	return n, nil
}

// dropPrefixEntry forgets a purged non-unique entry in its prefix set. For a
// unique entry it finds nothing: prefixes start with a non-unique index id.
func (s *memorySPI) dropPrefixEntry(entry []byte) {
	if len(entry) < 12 {
		return
	}
	prefix, id := entry[:len(entry)-8], binary.BigEndian.Uint64(entry[len(entry)-8:])
	ps := &s.prefixes[maphash.Bytes(s.seed, prefix)%memShards]
	ps.mu.Lock()
	if set, ok := ps.m[string(prefix)]; ok {
		delete(set, id)
		if len(set) == 0 {
			delete(ps.m, string(prefix))
		}
	}
	ps.mu.Unlock()
}

func (s *memorySPI) setHorizon(gcTS uint64) {
	for {
		cur := s.horizon.Load()
		if gcTS <= cur || s.horizon.CompareAndSwap(cur, gcTS) {
			return
		}
	}
}

// The memory backend keeps nothing across a restart: there is no stamp to
// find.
func (s *memorySPI) stamp(uint64) error             { return nil }
func (s *memorySPI) stamped() (uint64, bool, error) { return 0, false, nil }

func (s *memorySPI) sync() error  { return nil }
func (s *memorySPI) close() error { return nil }

func appendRowID(dst []byte, id uint64) []byte { return binary.BigEndian.AppendUint64(dst, id) }
