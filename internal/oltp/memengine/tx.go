package memengine

import (
	"bytes"
	"fmt"
	"runtime"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/tsorder"
)

// Tx is a memory-engine transaction.
type Tx struct {
	e     *Engine
	snap  uint64
	iso   engine.Isolation
	state *txState
	// writes in first-write order (the redo record keeps it), indexed.
	writes []*write
	byKey  map[string]*write
	reads  []*record   // serializable: rows read
	scans  []scanRange // serializable: ranges scanned
	cts    uint64
	done   bool
	reader tsorder.Reader // holds back version GC
	err    error          // set at Begin when the snapshot is below the GC horizon
}

type write struct {
	t       *table
	rec     *record
	row     []byte
	deleted bool
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
		tx.err = fmt.Errorf("memory engine: snapshot %d is below the version GC horizon %d: %w", snapshot, e.readers.Horizon(), engine.ErrSnapshotUnavailable)
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

func writeKey(table string, key []byte) string { return table + "\x00" + string(key) }

// Get implements engine.Tx.
func (tx *Tx) Get(tableName string, key []byte) ([]byte, bool, error) {
	if err := tx.usable(); err != nil {
		return nil, false, err
	}
	t, err := tx.e.table(tableName)
	if err != nil {
		return nil, false, err
	}
	if w := tx.byKey[writeKey(tableName, key)]; w != nil {
		return w.row, !w.deleted, nil
	}
	r := t.find(key)
	if tx.iso == engine.Serializable {
		if r == nil {
			// An absent row is a one-key range: a later insert is a phantom.
			tx.scans = append(tx.scans, scanRange{t: t, lo: bytes.Clone(key), hi: append(bytes.Clone(key), 0)})
		} else {
			tx.reads = append(tx.reads, r)
		}
	}
	if r == nil {
		return nil, false, nil
	}
	v := r.visible(tx.snap)
	if v == nil || v.deleted {
		return nil, false, nil
	}
	return v.row, true, nil
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
		base = t.scanPrimary(tx.snap, lo, hi)
	} else {
		ix, ok := t.indexes[index]
		if !ok {
			return fmt.Errorf("memory engine: table %q index %q: %w", tableName, index, engine.ErrUnknownIndex)
		}
		secKey = ix.spec.Key
		base = ix.scan(tx.snap, lo, hi)
	}
	if tx.iso == engine.Serializable {
		tx.scans = append(tx.scans, scanRange{t: t, index: index, lo: bytes.Clone(lo), hi: bytes.Clone(hi)})
	}
	var own []engine.OwnWrite
	for _, w := range tx.writes {
		if w.t == t {
			own = append(own, engine.OwnWrite{Key: w.rec.key, Row: w.row, Deleted: w.deleted})
		}
	}
	engine.Emit(engine.Overlay(base, own, secKey, lo, hi), fn)
	return nil
}

func (t *table) scanPrimary(snap uint64, lo, hi []byte) []engine.Row {
	var out []engine.Row
	visit := func(r *record) bool {
		if v := r.visible(snap); v != nil && !v.deleted {
			out = append(out, engine.Row{Key: r.key, Val: v.row})
		}
		return true
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	if hi == nil {
		t.rows.AscendGreaterOrEqual(&record{key: lo}, visit)
	} else {
		t.rows.AscendRange(&record{key: lo}, &record{key: hi}, visit)
	}
	return out
}

func (ix *secIndex) scan(snap uint64, lo, hi []byte) []engine.Row {
	var out []engine.Row
	ix.each(lo, hi, func(ent secEntry) {
		v := ent.rec.visible(snap)
		if v == nil || v.deleted {
			return
		}
		if sec := ix.spec.Key(v.row); !bytes.Equal(sec, ent.sec) {
			return // the row moved away from this index key
		}
		out = append(out, engine.Row{Sec: ent.sec, Key: ent.rec.key, Val: v.row})
	})
	return out
}

// each visits the index entries with lo ≤ index key < hi.
func (ix *secIndex) each(lo, hi []byte, fn func(secEntry)) {
	visit := func(ent secEntry) bool {
		if hi != nil && bytes.Compare(ent.sec, hi) >= 0 {
			return false
		}
		fn(ent)
		return true
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	ix.tree.AscendGreaterOrEqual(secEntry{sec: lo, rec: &record{}}, visit)
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
	wk := writeKey(tableName, key)
	if w := tx.byKey[wk]; w != nil {
		w.row, w.deleted = row, deleted
		tx.indexRow(w)
		return nil
	}
	r := t.findOrCreate(key)
	if !r.owner.CompareAndSwap(nil, tx.state) {
		return &engine.ConflictError{Engine: "memory", Table: tableName, Key: bytes.Clone(key), Err: engine.ErrWriteConflict}
	}
	if h := r.head.Load(); h != nil && h.cts > tx.snap {
		r.owner.Store(nil)
		return &engine.ConflictError{Engine: "memory", Table: tableName, Key: bytes.Clone(key), Err: engine.ErrWriteConflict}
	}
	w := &write{t: t, rec: r, row: row, deleted: deleted}
	if tx.byKey == nil {
		tx.byKey = make(map[string]*write)
	}
	tx.byKey[wk] = w
	tx.writes = append(tx.writes, w)
	tx.indexRow(w)
	return nil
}

// indexRow adds the row's index entries now, so a serializable scan of an
// index range sees this pending writer as a phantom.
func (tx *Tx) indexRow(w *write) {
	if w.deleted {
		return
	}
	for _, ix := range w.t.indexes {
		if sec := ix.spec.Key(w.row); sec != nil {
			ix.add(sec, w.rec)
		}
	}
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
	// Validators treat a writer between taking its timestamp and
	// publishing it as pending, so none misses a smaller timestamp.
	// Publish before any wait for ring room: a validator spinning on the
	// pending mark could be what holds the watermark back.
	tx.state.cts.Store(pendingTS)
	tx.cts = tx.e.clock.Reserve()
	tx.state.cts.Store(tx.cts)
	tx.e.clock.WaitRoom(tx.cts)
	if tx.iso == engine.Serializable {
		if err := tx.validate(); err != nil {
			tx.Abort()
			return 0, err
		}
	}
	return tx.cts, nil
}

// validate checks that no transaction ordered before this one (committed
// after the snapshot, or pre-committed with a smaller timestamp) wrote a
// row this transaction read or a row in a range it scanned.
func (tx *Tx) validate() error {
	for _, r := range tx.reads {
		if tx.changed(r) {
			return &engine.ConflictError{Engine: "memory", Key: bytes.Clone(r.key), Err: engine.ErrValidation}
		}
	}
	for _, s := range tx.scans {
		var bad *record
		check := func(r *record) {
			if bad == nil && tx.changed(r) {
				bad = r
			}
		}
		if s.index == "" {
			s.t.mu.RLock()
			visit := func(r *record) bool { check(r); return bad == nil }
			if s.hi == nil {
				s.t.rows.AscendGreaterOrEqual(&record{key: s.lo}, visit)
			} else {
				s.t.rows.AscendRange(&record{key: s.lo}, &record{key: s.hi}, visit)
			}
			s.t.mu.RUnlock()
		} else {
			s.t.indexes[s.index].each(s.lo, s.hi, func(ent secEntry) { check(ent.rec) })
		}
		if bad != nil {
			return &engine.ConflictError{Engine: "memory", Table: s.t.spec.Name, Key: bytes.Clone(bad.key), Err: engine.ErrValidation}
		}
	}
	return nil
}

// changed checks the owner before the versions: a writer installs its
// version before it releases the row, so one of the two checks sees it.
func (tx *Tx) changed(r *record) bool {
	if o := r.owner.Load(); o != nil && o != tx.state {
		c := o.cts.Load()
		for c == pendingTS {
			runtime.Gosched()
			c = o.cts.Load()
		}
		if c != 0 && c < tx.cts {
			return true
		}
	}
	for v := r.head.Load(); v != nil && v.cts > tx.snap; v = v.next.Load() {
		if v.cts < tx.cts {
			return true
		}
	}
	return false
}

// pendingTS marks a writer that is taking its commit timestamp.
const pendingTS = ^uint64(0)

// PostCommit implements engine.Tx.
func (tx *Tx) PostCommit(tag []byte) error {
	if tx.done {
		return engine.ErrTxDone
	}
	tx.done = true
	tx.e.readers.Release(tx.reader)
	if tx.cts == 0 {
		return nil // read-only
	}
	if len(tx.writes) > 0 {
		rec := logRecord{cts: tx.cts, snapshot: tx.snap, tag: tag}
		bound := tx.e.readers.Bound()
		for _, w := range tx.writes {
			rec.writes = append(rec.writes, logWrite{table: w.t.spec.Name, key: w.rec.key, row: w.row, deleted: w.deleted})
			w.rec.head.Store(newVersion(tx.cts, w.row, w.deleted, w.rec.head.Load()))
			w.rec.prune(bound)
		}
		// Logged before the timestamp finishes: whatever the watermark
		// covers is in the log buffer.
		tx.e.log.append(&rec)
		tx.release()
	}
	tx.e.clock.Finish(tx.cts)
	return nil
}

func (tx *Tx) release() {
	for _, w := range tx.writes {
		w.rec.owner.CompareAndSwap(tx.state, nil)
	}
}

// Abort implements engine.Tx.
func (tx *Tx) Abort() {
	if tx.done {
		return
	}
	tx.done = true
	tx.e.readers.Release(tx.reader)
	tx.release()
	if tx.cts != 0 {
		tx.e.clock.Finish(tx.cts)
	}
}
