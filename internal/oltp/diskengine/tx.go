package diskengine

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/tsorder"
)

// Tx is a storage-engine transaction.
type Tx struct {
	e     *Engine
	snap  uint64
	iso   engine.Isolation
	state *txState
	it    *pebble.Iterator // point reads at the snapshot, opened lazily

	writes []*write // first-write order
	byKey  map[string]*write
	reads  [][]byte // serializable: row prefixes read
	scans  []scanRange
	cts    uint64
	done   bool
	reader tsorder.Reader // holds back version GC
	err    error          // set at Begin when the snapshot is below the GC horizon
}

type write struct {
	t       *table
	pk      []byte
	rp      []byte // row prefix; also the lock key
	row     []byte
	deleted bool
	// oldSecs are the index keys of the row this write replaces (by index
	// name): a pending update moves the row out of those ranges.
	oldSecs map[string][]byte
}

type scanRange struct {
	t      *table
	index  string
	lo, hi []byte
}

// Begin implements engine.Engine.
// The transaction holds back version GC until it finishes: every Tx must
// end with PostCommit or Abort.
func (e *Engine) Begin(snapshot uint64, iso engine.Isolation) engine.Tx {
	tx := &Tx{e: e, snap: snapshot, iso: iso, state: &txState{}}
	var ok bool
	if tx.reader, ok = e.readers.Register(snapshot); !ok {
		tx.err = fmt.Errorf("storage engine: snapshot %d is below the version GC horizon %d: %w", snapshot, e.readers.Horizon(), engine.ErrSnapshotUnavailable)
	}
	return tx
}

func (tx *Tx) usable() error {
	if tx.done {
		return engine.ErrTxDone
	}
	return tx.err
}

// Snapshot implements engine.Tx.
func (tx *Tx) Snapshot() uint64 { return tx.snap }

// Writes implements engine.Tx.
func (tx *Tx) Writes() bool { return len(tx.writes) > 0 }

func (tx *Tx) iter() (*pebble.Iterator, error) {
	if tx.it != nil {
		return tx.it, nil
	}
	it, err := tx.e.db.NewIter(nil)
	if err != nil {
		return nil, fmt.Errorf("storage engine: %s: open iterator: %w", tx.e.dir, err)
	}
	tx.it = it
	return it, nil
}

// readAt returns the newest version of rp at or below snap. A version's
// value is a kind byte and the row.
func readAt(it *pebble.Iterator, rp []byte, snap uint64) (row []byte, ok bool) {
	k := versionKey(rp, snap)
	if !it.SeekGE(k) || !bytes.HasPrefix(it.Key(), rp) || len(it.Key()) != len(rp)+8 {
		return nil, false
	}
	v := it.Value()
	if len(v) == 0 || v[0] == kindDelete {
		return nil, false
	}
	return bytes.Clone(v[1:]), true
}

// Get implements engine.Tx.
func (tx *Tx) Get(tableName string, key []byte) ([]byte, bool, error) {
	if err := tx.usable(); err != nil {
		return nil, false, err
	}
	t, err := tx.e.table(tableName)
	if err != nil {
		return nil, false, err
	}
	rp := rowPrefix(t.prefix, key)
	if w := tx.byKey[string(rp)]; w != nil {
		return w.row, !w.deleted, nil
	}
	if tx.iso == engine.Serializable {
		tx.reads = append(tx.reads, rp)
	}
	it, err := tx.iter()
	if err != nil {
		return nil, false, err
	}
	row, ok := readAt(it, rp, tx.snap)
	return row, ok, it.Error()
}

// Scan implements engine.Tx.
func (tx *Tx) Scan(tableName, index string, lo, hi []byte, fn func(key, row []byte) bool) error {
	if err := tx.usable(); err != nil {
		return err
	}
	t, err := tx.e.table(tableName)
	if err != nil {
		return err
	}
	var secKey func([]byte) []byte
	var base []engine.Row
	if index == "" {
		base, err = tx.scanPrimary(t, lo, hi)
	} else {
		ix, ok := t.indexes[index]
		if !ok {
			return fmt.Errorf("storage engine: table %q index %q: %w", tableName, index, engine.ErrUnknownIndex)
		}
		secKey = ix.spec.Key
		base, err = tx.scanIndex(t, ix, lo, hi)
	}
	if err != nil {
		return err
	}
	if tx.iso == engine.Serializable {
		tx.scans = append(tx.scans, scanRange{t: t, index: index, lo: bytes.Clone(lo), hi: bytes.Clone(hi)})
	}
	var own []engine.OwnWrite
	for _, w := range tx.writes {
		if w.t == t {
			own = append(own, engine.OwnWrite{Key: w.pk, Row: w.row, Deleted: w.deleted})
		}
	}
	engine.Emit(engine.Overlay(base, own, secKey, lo, hi), fn)
	return nil
}

// bounds covers the keys under prefix whose first escaped field f has
// lo ≤ f < hi: the escaping keeps order and is prefix-free.
func bounds(prefix, lo, hi []byte) *pebble.IterOptions {
	o := &pebble.IterOptions{LowerBound: appendEscaped(bytes.Clone(prefix), lo)}
	if hi == nil {
		o.UpperBound = upperOf(prefix)
	} else {
		o.UpperBound = appendEscaped(bytes.Clone(prefix), hi)
	}
	return o
}

func (tx *Tx) scanPrimary(t *table, lo, hi []byte) ([]engine.Row, error) {
	it, err := tx.e.db.NewIter(bounds(t.prefix, lo, hi))
	if err != nil {
		return nil, fmt.Errorf("storage engine: %s: open iterator: %w", tx.e.dir, err)
	}
	defer it.Close()
	var out []engine.Row
	var last []byte // pk already decided
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		pk, rest, err := readEscaped(k[len(t.prefix):])
		if err != nil || len(rest) != 8 {
			return nil, fmt.Errorf("storage engine: %s: table %q: row key %x is malformed: %w", tx.e.dir, t.spec.Name, k, errBadKey)
		}
		if last != nil && bytes.Equal(pk, last) {
			continue
		}
		if versionTS(k) > tx.snap {
			continue
		}
		last = pk
		v := it.Value()
		if len(v) > 0 && v[0] == kindPut {
			out = append(out, engine.Row{Key: pk, Val: bytes.Clone(v[1:])})
		}
	}
	return out, it.Error()
}

func (tx *Tx) scanIndex(t *table, ix *index, lo, hi []byte) ([]engine.Row, error) {
	it, err := tx.e.db.NewIter(bounds(ix.prefix, lo, hi))
	if err != nil {
		return nil, fmt.Errorf("storage engine: %s: open iterator: %w", tx.e.dir, err)
	}
	defer it.Close()
	rowIt, err := tx.iter()
	if err != nil {
		return nil, err
	}
	var out []engine.Row
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		sec, rest, err := readEscaped(k[len(ix.prefix):])
		if err == nil {
			var pk []byte
			if pk, rest, err = readEscaped(rest); err == nil && len(rest) == 0 {
				row, ok := readAt(rowIt, rowPrefix(t.prefix, pk), tx.snap)
				// Entries are never removed: keep only rows whose version
				// at the snapshot still has this index key.
				if ok && bytes.Equal(ix.spec.Key(row), sec) {
					out = append(out, engine.Row{Sec: sec, Key: pk, Val: row})
				}
				continue
			}
		}
		return nil, fmt.Errorf("storage engine: %s: index %s.%s: entry %x is malformed: %w", tx.e.dir, t.spec.Name, ix.spec.Name, k, errBadKey)
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	return out, rowIt.Error()
}

// Put implements engine.Tx.
func (tx *Tx) Put(tableName string, key, row []byte) error {
	return tx.write(tableName, key, bytes.Clone(row), false)
}

// Delete implements engine.Tx.
func (tx *Tx) Delete(tableName string, key []byte) error {
	return tx.write(tableName, key, nil, true)
}

func (tx *Tx) write(tableName string, key, row []byte, deleted bool) error {
	if tx.cts != 0 {
		return engine.ErrTxDone
	}
	if err := tx.usable(); err != nil {
		return err
	}
	t, err := tx.e.table(tableName)
	if err != nil {
		return err
	}
	rp := rowPrefix(t.prefix, key)
	if w := tx.byKey[string(rp)]; w != nil {
		w.row, w.deleted = row, deleted
		return nil
	}
	conflict := &engine.ConflictError{Engine: "storage", Table: tableName, Key: bytes.Clone(key), Err: engine.ErrWriteConflict}
	if !tx.e.tryLock(string(rp), tx.state) {
		return conflict
	}
	// First committer wins: a version newer than the snapshot. A committer
	// applies its batch before it unlocks, so a fresh view has it.
	newest, oldRow, err := tx.e.newestVersion(rp)
	if err != nil || newest > tx.snap {
		tx.e.unlock(string(rp), tx.state)
		if err != nil {
			return err
		}
		return conflict
	}
	w := &write{t: t, pk: bytes.Clone(key), rp: rp, row: row, deleted: deleted}
	if oldRow != nil {
		for name, ix := range t.indexes {
			if sec := ix.spec.Key(oldRow); sec != nil {
				if w.oldSecs == nil {
					w.oldSecs = make(map[string][]byte, len(t.indexes))
				}
				w.oldSecs[name] = sec
			}
		}
	}
	if tx.byKey == nil {
		tx.byKey = make(map[string]*write)
	}
	tx.byKey[string(rp)] = w
	tx.writes = append(tx.writes, w)
	return nil
}

// newestVersion is the commit timestamp of rp's newest version (0: none)
// and its row (nil: none or a delete).
func (e *Engine) newestVersion(rp []byte) (uint64, []byte, error) {
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: rp, UpperBound: upperOf(rp)})
	if err != nil {
		return 0, nil, fmt.Errorf("storage engine: %s: open iterator: %w", e.dir, err)
	}
	defer it.Close()
	if it.First() && len(it.Key()) == len(rp)+8 {
		var row []byte
		if v := it.Value(); len(v) > 0 && v[0] == kindPut {
			row = bytes.Clone(v[1:])
		}
		return versionTS(it.Key()), row, nil
	}
	return 0, nil, it.Error()
}

// PreCommit implements engine.Tx. A read-only snapshot transaction needs no
// timestamp: it returns its snapshot.
func (tx *Tx) PreCommit() (uint64, error) {
	if tx.cts != 0 {
		return 0, engine.ErrTxDone
	}
	if err := tx.usable(); err != nil {
		tx.Abort()
		return 0, err
	}
	if !tx.Writes() && tx.iso != engine.Serializable {
		return tx.snap, nil
	}
	tx.cts = tx.e.precommit(tx)
	if tx.iso == engine.Serializable {
		if err := tx.validate(); err != nil {
			tx.Abort()
			return 0, err
		}
	}
	return tx.cts, nil
}

// precommit takes a timestamp and, for a writer, registers it as in flight
// in one step, so a validator with a larger timestamp finds every writer
// ordered before it either in flight or applied.
func (e *Engine) precommit(tx *Tx) uint64 {
	e.inflightMu.Lock()
	defer e.inflightMu.Unlock()
	cts := e.clock.Next()
	tx.state.cts.Store(cts)
	if tx.Writes() {
		e.inflight[tx] = struct{}{}
	}
	return cts
}

func (e *Engine) retire(tx *Tx) {
	e.inflightMu.Lock()
	delete(e.inflight, tx)
	e.inflightMu.Unlock()
}

// validate checks that no transaction ordered before this one wrote a row
// this one read or a row in a range it scanned: first the writers still in
// flight, then (they apply before they retire) what is in Pebble.
func (tx *Tx) validate() error {
	fail := func(t string, key []byte) error {
		return &engine.ConflictError{Engine: "storage", Table: t, Key: bytes.Clone(key), Err: engine.ErrValidation}
	}
	tx.e.inflightMu.Lock()
	for o := range tx.e.inflight {
		if o == tx || o.state.cts.Load() > tx.cts {
			continue
		}
		for _, w := range o.writes {
			if tx.readsWrite(w) {
				tx.e.inflightMu.Unlock()
				return fail(w.t.spec.Name, w.pk)
			}
		}
	}
	tx.e.inflightMu.Unlock()
	for _, rp := range tx.reads {
		if c, err := tx.e.changedBetween(rp, tx.snap, tx.cts); err != nil || c {
			if err != nil {
				return err
			}
			return fail("", rp)
		}
	}
	for _, s := range tx.scans {
		var prefix []byte
		if s.index == "" {
			prefix = s.t.prefix
		} else {
			prefix = s.t.indexes[s.index].prefix
		}
		it, err := tx.e.db.NewIter(bounds(prefix, s.lo, s.hi))
		if err != nil {
			return fmt.Errorf("storage engine: %s: open iterator: %w", tx.e.dir, err)
		}
		for it.First(); it.Valid(); it.Next() {
			k := it.Key()
			if s.index == "" {
				if ts := versionTS(k); ts > tx.snap && ts < tx.cts {
					it.Close()
					return fail(s.t.spec.Name, k)
				}
				continue
			}
			_, rest, err := readEscaped(k[len(prefix):])
			var pk []byte
			if err == nil {
				pk, _, err = readEscaped(rest)
			}
			if err != nil {
				it.Close()
				return fmt.Errorf("storage engine: %s: index entry %x is malformed: %w", tx.e.dir, k, err)
			}
			c, err := tx.e.changedBetween(rowPrefix(s.t.prefix, pk), tx.snap, tx.cts)
			if err != nil || c {
				it.Close()
				if err != nil {
					return err
				}
				return fail(s.t.spec.Name, pk)
			}
		}
		err = it.Error()
		it.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// readsWrite reports whether w (another transaction's pending write) falls
// in what this transaction read: its key, or its old or new index key in a
// scanned index range.
func (tx *Tx) readsWrite(w *write) bool {
	for _, rp := range tx.reads {
		if bytes.Equal(rp, w.rp) {
			return true
		}
	}
	for _, s := range tx.scans {
		if s.t != w.t {
			continue
		}
		if s.index == "" {
			if engine.InRange(w.pk, s.lo, s.hi) {
				return true
			}
			continue
		}
		if old, ok := w.oldSecs[s.index]; ok && engine.InRange(old, s.lo, s.hi) {
			return true
		}
		if w.deleted {
			continue
		}
		if sec := s.t.indexes[s.index].spec.Key(w.row); sec != nil && engine.InRange(sec, s.lo, s.hi) {
			return true
		}
	}
	return false
}

// changedBetween reports a version of rp with lo < cts < hi.
func (e *Engine) changedBetween(rp []byte, lo, hi uint64) (bool, error) {
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: rp, UpperBound: upperOf(rp)})
	if err != nil {
		return false, fmt.Errorf("storage engine: %s: open iterator: %w", e.dir, err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		if len(it.Key()) != len(rp)+8 {
			continue
		}
		ts := versionTS(it.Key())
		if ts <= lo {
			break
		}
		if ts < hi {
			return true, nil
		}
	}
	return false, it.Error()
}

// PostCommit implements engine.Tx: one unsynced batch with the versions,
// index entries and the txn record; the syncer makes it durable.
func (tx *Tx) PostCommit(tag []byte) error {
	if tx.done {
		return engine.ErrTxDone
	}
	tx.done = true
	tx.closeIter()
	tx.e.readers.Release(tx.reader)
	if tx.cts == 0 {
		return nil
	}
	if len(tx.writes) == 0 {
		tx.e.clock.Finish(tx.cts)
		return nil
	}
	b := tx.e.db.NewBatch()
	rec := txnRecord{cts: tx.cts, snapshot: tx.snap, tag: tag}
	val := make([]byte, 0, 64)
	for _, w := range tx.writes {
		vk := versionKey(w.rp, tx.cts)
		val = val[:0]
		if w.deleted {
			val = append(val, kindDelete)
		} else {
			val = append(append(val, kindPut), w.row...)
		}
		_ = b.Set(vk, val, nil)
		rec.keys = append(rec.keys, vk)
		if w.deleted {
			continue
		}
		for _, ix := range w.t.indexes {
			if sec := ix.spec.Key(w.row); sec != nil {
				ik := appendEscaped(appendEscaped(bytes.Clone(ix.prefix), sec), w.pk)
				_ = b.Set(ik, nil, nil)
			}
		}
	}
	_ = b.Set(txnKey(tx.cts), rec.encode(), nil)
	err := b.Commit(pebble.NoSync)
	b.Close()
	if err != nil {
		// The versions may be partly applied in memory only; without the
		// WAL nothing at or above cts can be acknowledged.
		err = fmt.Errorf("storage engine: %s: apply commit %d: %w (restart to recover)", tx.e.dir, tx.cts, err)
		tx.e.fail(err)
	}
	tx.release()
	tx.e.retire(tx)
	tx.e.clock.Finish(tx.cts)
	tx.e.poke()
	return err
}

func (tx *Tx) release() {
	for _, w := range tx.writes {
		tx.e.unlock(string(w.rp), tx.state)
	}
}

func (tx *Tx) closeIter() {
	if tx.it != nil {
		tx.it.Close()
		tx.it = nil
	}
}

// Abort implements engine.Tx.
func (tx *Tx) Abort() {
	if tx.done {
		return
	}
	tx.done = true
	tx.closeIter()
	tx.e.readers.Release(tx.reader)
	tx.release()
	if tx.cts != 0 {
		tx.e.retire(tx)
		tx.e.clock.Finish(tx.cts)
	}
}
