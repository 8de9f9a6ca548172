// Package memengine is Skeena's fast engine: multi-version rows in memory
// with snapshot isolation (first committer wins), commit timestamps from a
// lock-free counter, a redo log with group commit and a durable mark,
// checkpoints, and recovery from checkpoint plus log.
//
// Write path: Put/Delete take the row's write lock (no wait: a held lock or
// a version newer than the snapshot is a write conflict) and buffer the
// write; PreCommit takes a commit timestamp and, when serializable,
// validates the reads; PostCommit installs the versions, appends the redo
// record and finishes the timestamp, so the watermark passes it only once
// the versions are in place. Read path: the newest version at or below the
// snapshot. The redo log and checkpoint formats are described in
// redolog.go and checkpoint.go.
package memengine

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/tsorder"
)

// Options configure an engine.
type Options struct {
	// Dir holds the redo log and checkpoints.
	Dir    string
	Tables []engine.TableSpec
	Logger *slog.Logger
	// GCInterval is how often version GC advances (default 100 ms;
	// negative: never on its own, for tests that step it).
	GCInterval time.Duration
}

// Engine is the in-memory engine.
type Engine struct {
	dir    string
	logger *slog.Logger
	clock  *tsorder.Clock
	tables map[string]*table
	log    *redoLog

	recovery *recovery // non-nil until Start
	closed   atomic.Bool
	ckptMu   sync.Mutex
	// closedSegs are the redo segments not yet covered by a checkpoint,
	// oldest first (under ckptMu).
	closedSegs []segment

	// Version GC (gc.go).
	readers    tsorder.Readers
	gcInterval time.Duration
	gcStop     chan struct{}
	gcDone     chan struct{}
}

type table struct {
	spec    engine.TableSpec
	mu      sync.RWMutex
	rows    *btree.BTreeG[*record]
	indexes map[string]*secIndex
}

type secIndex struct {
	spec engine.IndexSpec
	mu   sync.RWMutex
	tree *btree.BTreeG[secEntry]
}

// secEntry points from an index key to a row; entries are added when a
// write is buffered and never removed, so readers check the row's version
// at their snapshot still has this index key.
type secEntry struct {
	sec []byte
	rec *record
}

type record struct {
	key   []byte
	head  atomic.Pointer[version]
	owner atomic.Pointer[txState]
}

type version struct {
	cts     uint64
	row     []byte
	deleted bool
	next    atomic.Pointer[version] // older; cut by version GC (gc.go)
}

// newVersion links a version above next.
func newVersion(cts uint64, row []byte, deleted bool, next *version) *version {
	v := &version{cts: cts, row: row, deleted: deleted}
	v.next.Store(next)
	return v
}

// txState is what other transactions see of a writer: its commit
// timestamp once pre-committed (0 before).
type txState struct{ cts atomic.Uint64 }

func recordLess(a, b *record) bool { return bytes.Compare(a.key, b.key) < 0 }

func secLess(a, b secEntry) bool {
	if c := bytes.Compare(a.sec, b.sec); c != 0 {
		return c < 0
	}
	return bytes.Compare(a.rec.key, b.rec.key) < 0
}

// Open recovers the engine from dir: the newest valid checkpoint and the
// redo log after it. The engine serves nothing until Start, which decides
// the fate of the recovered transactions Recovered lists.
func Open(opts Options) (*Engine, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("memory engine: no data directory given")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.GCInterval == 0 {
		opts.GCInterval = 100 * time.Millisecond
	}
	e := &Engine{dir: opts.Dir, logger: opts.Logger, tables: make(map[string]*table), gcInterval: opts.GCInterval}
	for _, spec := range opts.Tables {
		if _, dup := e.tables[spec.Name]; dup {
			return nil, fmt.Errorf("memory engine: table %q declared twice", spec.Name)
		}
		t := &table{spec: spec, rows: btree.NewG(32, recordLess), indexes: make(map[string]*secIndex)}
		for _, ix := range spec.Indexes {
			if ix.Key == nil || ix.Name == "" {
				return nil, fmt.Errorf("memory engine: table %q: index %q needs a name and a key function", spec.Name, ix.Name)
			}
			t.indexes[ix.Name] = &secIndex{spec: ix, tree: btree.NewG(32, secLess)}
		}
		e.tables[spec.Name] = t
	}
	rec, err := recoverState(e)
	if err != nil {
		return nil, err
	}
	e.recovery = rec
	return e, nil
}

// Name implements engine.Engine.
func (e *Engine) Name() string { return "memory" }

// Records counts the records (keys with any version) the engine holds.
// The tables are fixed when the engine opens.
func (e *Engine) Records() int64 {
	var n int64
	for _, t := range e.tables {
		t.mu.RLock()
		n += int64(t.rows.Len())
		t.mu.RUnlock()
	}
	return n
}

// LatestSnapshot implements engine.Engine: one atomic load.
func (e *Engine) LatestSnapshot() uint64 { return e.clock.Visible() }

// WaitVisible implements engine.Engine.
func (e *Engine) WaitVisible(ctx context.Context, ts uint64) error {
	return e.clock.WaitVisible(ctx, ts)
}

// OldestReader is the oldest snapshot a running transaction reads at, or
// the latest snapshot when none runs.
func (e *Engine) OldestReader() uint64 { return e.readers.Oldest(e.clock.Visible()) }

// DurableTS implements engine.Engine.
func (e *Engine) DurableTS() uint64 { return e.clock.Durable() }

// WaitDurable implements engine.Engine.
func (e *Engine) WaitDurable(ctx context.Context, ts uint64) error {
	if e.closed.Load() {
		return fmt.Errorf("memory engine: %w", engine.ErrClosed)
	}
	// Aborts and read-only commits move the watermark without a log
	// append: nudge the flusher so the durable mark follows.
	return e.clock.Wait(ctx, func() bool { return e.clock.Durable() >= ts }, e.log.poke, e.log.failed, e.log.failure())
}

// Close stops the log flusher after a last flush.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	if e.log == nil {
		return nil
	}
	close(e.gcStop)
	<-e.gcDone
	return e.log.close()
}

func (e *Engine) table(name string) (*table, error) {
	t, ok := e.tables[name]
	if !ok {
		return nil, fmt.Errorf("memory engine: table %q: %w", name, engine.ErrUnknownTable)
	}
	return t, nil
}

// find returns the record under key, or nil.
func (t *table) find(key []byte) *record {
	t.mu.RLock()
	r, _ := t.rows.Get(&record{key: key})
	t.mu.RUnlock()
	return r
}

// findOrCreate returns the record under key, creating an empty one (no
// versions: invisible to everyone) if there is none.
func (t *table) findOrCreate(key []byte) *record {
	if r := t.find(key); r != nil {
		return r
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r, ok := t.rows.Get(&record{key: key}); ok {
		return r
	}
	r := &record{key: bytes.Clone(key)}
	t.rows.ReplaceOrInsert(r)
	return r
}

// visible returns the newest version at or below snap.
func (r *record) visible(snap uint64) *version {
	for v := r.head.Load(); v != nil; v = v.next.Load() {
		if v.cts <= snap {
			return v
		}
	}
	return nil
}

func (ix *secIndex) add(sec []byte, r *record) {
	ent := secEntry{sec: sec, rec: r}
	ix.mu.RLock()
	has := ix.tree.Has(ent)
	ix.mu.RUnlock()
	if has {
		return
	}
	ix.mu.Lock()
	ix.tree.ReplaceOrInsert(secEntry{sec: bytes.Clone(sec), rec: r})
	ix.mu.Unlock()
}
