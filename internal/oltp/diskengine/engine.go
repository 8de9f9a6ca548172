// Package diskengine is Skeena's storage engine: multi-version rows on
// Pebble with snapshot isolation (first committer wins), its own commit
// timestamps and a durable mark over Pebble's WAL, and recovery by Pebble.
//
// Writes are buffered in the transaction under an in-memory row lock (no
// wait: a held lock or a committed version newer than the snapshot is a
// conflict). PostCommit applies one Pebble batch without syncing (row
// versions, index entries and a txn record), then finishes the timestamp;
// a syncer goroutine syncs the WAL for everything applied so far and moves
// the durable mark (group commit). Key layout: keys.go.
package diskengine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/tsorder"
	"github.com/retinadb/retina/internal/pebblelog"
)

// Options configure an engine.
type Options struct {
	Dir    string
	Tables []engine.TableSpec
	Logger *slog.Logger
	// CacheBytes sizes Pebble's block cache (default 256 MiB).
	CacheBytes int64
	// GCInterval is how often version GC runs a pass (default 100 ms;
	// negative: never on its own, for tests that step it).
	GCInterval time.Duration
}

// Engine is the Pebble-backed engine.
type Engine struct {
	dir    string
	db     *pebble.DB
	cache  *pebble.Cache
	logger *slog.Logger
	clock  *tsorder.Clock
	tables map[string]*table
	locks  [64]lockShard

	inflightMu sync.Mutex
	inflight   map[*Tx]struct{} // pre-committed writers not yet applied

	recovered []txnRecord // until Start
	lastTS    uint64
	started   bool

	wake   chan struct{}
	stop   chan struct{}
	done   chan struct{}
	failed chan struct{}
	errMu  sync.Mutex
	err    error
	closed atomic.Bool
	forgot atomic.Uint64

	// Version GC (gc.go).
	readers    tsorder.Readers
	gcInterval time.Duration
	gcCursor   []byte // gc goroutine only
	gcStop     chan struct{}
	gcDone     chan struct{}
}

type table struct {
	spec    engine.TableSpec
	prefix  []byte
	indexes map[string]*index
}

type index struct {
	spec   engine.IndexSpec
	prefix []byte
}

type lockShard struct {
	mu    sync.Mutex
	owner map[string]*txState
}

type txState struct{ cts atomic.Uint64 }

type txnRecord struct {
	cts, snapshot uint64
	tag           []byte
	keys          [][]byte
}

// Open opens (and by Pebble's WAL, recovers) the engine in dir. It serves
// nothing until Start decides the fate of the transactions Recovered lists.
func Open(opts Options) (*Engine, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("storage engine: no data directory given")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.CacheBytes <= 0 {
		opts.CacheBytes = 256 << 20
	}
	if opts.GCInterval == 0 {
		opts.GCInterval = 100 * time.Millisecond
	}
	e := &Engine{dir: opts.Dir, logger: opts.Logger, tables: make(map[string]*table), gcInterval: opts.GCInterval,
		gcStop: make(chan struct{}), gcDone: make(chan struct{}),
		inflight: make(map[*Tx]struct{}), wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), failed: make(chan struct{})}
	for _, spec := range opts.Tables {
		if _, dup := e.tables[spec.Name]; dup {
			return nil, fmt.Errorf("storage engine: table %q declared twice", spec.Name)
		}
		t := &table{spec: spec, prefix: tablePrefix(prefixRow, spec.Name), indexes: make(map[string]*index)}
		for _, ix := range spec.Indexes {
			if ix.Key == nil || ix.Name == "" {
				return nil, fmt.Errorf("storage engine: table %q: index %q needs a name and a key function", spec.Name, ix.Name)
			}
			t.indexes[ix.Name] = &index{spec: ix, prefix: indexPrefix(spec.Name, ix.Name)}
		}
		e.tables[spec.Name] = t
	}
	for i := range e.locks {
		e.locks[i].owner = make(map[string]*txState)
	}
	e.cache = pebble.NewCache(opts.CacheBytes)
	popts := &pebble.Options{Cache: e.cache, MemTableSize: 64 << 20, Logger: pebblelog.Logger{Log: opts.Logger}}
	popts.EnsureDefaults()
	db, err := pebble.Open(opts.Dir, popts)
	if err != nil {
		e.cache.Unref()
		return nil, fmt.Errorf("storage engine: open pebble at %s: %w", opts.Dir, err)
	}
	e.db = db
	if err := e.readTxnRecords(); err != nil {
		db.Close()
		e.cache.Unref()
		return nil, err
	}
	return e, nil
}

func (e *Engine) readTxnRecords() error {
	v, closer, err := e.db.Get([]byte{keyForgot})
	switch {
	case err == nil:
		if len(v) != 8 {
			closer.Close()
			return fmt.Errorf("storage engine: %s: the forgotten-through mark is malformed; the data directory is corrupt", e.dir)
		}
		e.forgot.Store(binary.BigEndian.Uint64(v))
		e.lastTS = e.forgot.Load()
		closer.Close()
	case !errors.Is(err, pebble.ErrNotFound):
		return fmt.Errorf("storage engine: %s: %w", e.dir, err)
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixTxn}, UpperBound: []byte{prefixTxn + 1}})
	if err != nil {
		return fmt.Errorf("storage engine: %s: %w", e.dir, err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != 9 {
			return fmt.Errorf("storage engine: %s: txn record key %x is malformed; the data directory is corrupt", e.dir, k)
		}
		rec, err := decodeTxnRecord(binary.BigEndian.Uint64(k[1:]), it.Value())
		if err != nil {
			return fmt.Errorf("storage engine: %s: txn record %x: %w; the data directory is corrupt", e.dir, k, err)
		}
		e.recovered = append(e.recovered, rec)
		e.lastTS = max(e.lastTS, rec.cts)
	}
	return it.Error()
}

func (r *txnRecord) encode() []byte {
	b := binary.AppendUvarint(nil, r.snapshot)
	b = binary.AppendUvarint(b, uint64(len(r.tag)))
	b = append(b, r.tag...)
	b = binary.AppendUvarint(b, uint64(len(r.keys)))
	for _, k := range r.keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
	}
	return b
}

func decodeTxnRecord(cts uint64, v []byte) (txnRecord, error) {
	r := txnRecord{cts: cts}
	next := func() (uint64, error) {
		x, n := binary.Uvarint(v)
		if n <= 0 {
			return 0, errBadKey
		}
		v = v[n:]
		return x, nil
	}
	bytesOf := func() ([]byte, error) {
		n, err := next()
		if err != nil || uint64(len(v)) < n {
			return nil, errBadKey
		}
		b := append([]byte(nil), v[:n]...)
		v = v[n:]
		return b, nil
	}
	var err error
	if r.snapshot, err = next(); err != nil {
		return r, err
	}
	if r.tag, err = bytesOf(); err != nil {
		return r, err
	}
	n, err := next()
	if err != nil {
		return r, err
	}
	for i := uint64(0); i < n; i++ {
		k, err := bytesOf()
		if err != nil {
			return r, err
		}
		r.keys = append(r.keys, k)
	}
	return r, nil
}

// Recovered lists the tagged transactions whose records remain.
func (e *Engine) Recovered() []engine.Recovered {
	var out []engine.Recovered
	for _, r := range e.recovered {
		if len(r.tag) > 0 {
			out = append(out, engine.Recovered{CommitTS: r.cts, Snapshot: r.snapshot, Tag: r.tag})
		}
	}
	return out
}

// Start takes out what d drops (durably) and starts serving.
func (e *Engine) Start(ctx context.Context, d engine.Discard) error {
	if e.started {
		return fmt.Errorf("storage engine: started twice")
	}
	b := e.db.NewBatch()
	dropped := 0
	for _, r := range e.recovered {
		if !d.Drops(engine.Recovered{CommitTS: r.cts, Snapshot: r.snapshot, Tag: r.tag}) {
			continue
		}
		dropped++
		for _, k := range r.keys {
			b.Delete(k, nil)
		}
		b.Delete(txnKey(r.cts), nil)
	}
	if dropped > 0 {
		if err := b.Commit(pebble.Sync); err != nil {
			return fmt.Errorf("storage engine: %s: take out %d dropped transactions: %w", e.dir, dropped, err)
		}
		e.logger.Info("storage engine dropped recovered transactions", "count", dropped, "dir", e.dir)
	}
	b.Close()
	e.recovered = nil
	e.clock = tsorder.New(e.lastTS)
	e.started = true
	go e.syncLoop()
	go e.gcLoop()
	return nil
}

// syncLoop is the group commit: one WAL sync covers every batch applied
// before it.
func (e *Engine) syncLoop() {
	defer close(e.done)
	for {
		select {
		case <-e.wake:
		case <-e.stop:
			e.syncOnce()
			return
		}
		e.syncOnce()
	}
}

func (e *Engine) syncOnce() {
	if e.failure() != nil {
		return
	}
	w := e.clock.Visible()
	if w <= e.clock.Durable() {
		return
	}
	if err := e.db.LogData(nil, pebble.Sync); err != nil {
		e.fail(fmt.Errorf("storage engine: sync the WAL in %s: %w (commits after this are not acknowledged; restart to recover)", e.dir, err))
		return
	}
	e.clock.SetDurable(w)
}

// fail records the first fatal error and stops acknowledgements.
func (e *Engine) fail(err error) {
	e.errMu.Lock()
	defer e.errMu.Unlock()
	if e.err != nil {
		return
	}
	e.err = err
	e.logger.Error("storage engine failed", "err", err)
	close(e.failed)
}

func (e *Engine) failure() error {
	e.errMu.Lock()
	defer e.errMu.Unlock()
	return e.err
}

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Name implements engine.Engine.
func (e *Engine) Name() string { return "storage" }

// DiskBytes is the space the engine's Pebble store takes on disk.
func (e *Engine) DiskBytes() int64 { return int64(e.db.Metrics().DiskSpaceUsage()) }

// LatestSnapshot implements engine.Engine.
func (e *Engine) LatestSnapshot() uint64 { return e.clock.Visible() }

// WaitVisible implements engine.Engine.
func (e *Engine) WaitVisible(ctx context.Context, ts uint64) error {
	return e.clock.WaitVisible(ctx, ts)
}

// DurableTS implements engine.Engine.
func (e *Engine) DurableTS() uint64 { return e.clock.Durable() }

// WaitDurable implements engine.Engine.
func (e *Engine) WaitDurable(ctx context.Context, ts uint64) error {
	if e.closed.Load() {
		return fmt.Errorf("storage engine: %w", engine.ErrClosed)
	}
	return e.clock.Wait(ctx, func() bool { return e.clock.Durable() >= ts }, e.poke, e.failed,
		fmt.Errorf("storage engine: WAL in %s failed; commits are not acknowledged", e.dir))
}

// ForgetThrough drops txn records at or below ts: the caller promises
// recovery will never need to take those transactions out. Version GC
// never goes past this mark.
func (e *Engine) ForgetThrough(ts uint64) error {
	if ts <= e.forgot.Load() {
		return nil
	}
	b := e.db.NewBatch()
	defer b.Close()
	_ = b.DeleteRange(txnKey(0), txnKey(ts+1), nil)
	_ = b.Set([]byte{keyForgot}, binary.BigEndian.AppendUint64(nil, ts), nil)
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("storage engine: %s: drop txn records through %d: %w", e.dir, ts, err)
	}
	e.forgot.Store(ts)
	return nil
}

// ForgottenThrough is the mark of the last ForgetThrough: transactions at
// or below it have no txn record, so Recovered does not list them.
func (e *Engine) ForgottenThrough() uint64 { return e.forgot.Load() }

// Close syncs and closes Pebble.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	if e.started {
		close(e.gcStop)
		<-e.gcDone
		close(e.stop)
		<-e.done
	}
	err := e.db.Close()
	e.cache.Unref()
	if err != nil {
		return fmt.Errorf("storage engine: close pebble at %s: %w", e.dir, err)
	}
	return e.failure()
}

func (e *Engine) table(name string) (*table, error) {
	t, ok := e.tables[name]
	if !ok {
		return nil, fmt.Errorf("storage engine: table %q: %w", name, engine.ErrUnknownTable)
	}
	return t, nil
}

func (e *Engine) shard(lockKey string) *lockShard {
	var h uint32 = 2166136261
	for i := 0; i < len(lockKey); i++ {
		h = (h ^ uint32(lockKey[i])) * 16777619
	}
	return &e.locks[h%uint32(len(e.locks))]
}

func (e *Engine) tryLock(lockKey string, s *txState) bool {
	sh := e.shard(lockKey)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if o, ok := sh.owner[lockKey]; ok && o != s {
		return false
	}
	sh.owner[lockKey] = s
	return true
}

func (e *Engine) unlock(lockKey string, s *txState) {
	sh := e.shard(lockKey)
	sh.mu.Lock()
	if sh.owner[lockKey] == s {
		delete(sh.owner, lockKey)
	}
	sh.mu.Unlock()
}

func (e *Engine) lockOwner(lockKey string) *txState {
	sh := e.shard(lockKey)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.owner[lockKey]
}
