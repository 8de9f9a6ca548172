// Package skeena composes the memory engine (the anchor) and the storage
// engine into one transactional store: a transaction may touch tables in
// both and still reads one consistent snapshot and commits atomically and
// durably, without two-phase commit.
//
//   - A transaction takes an anchor snapshot s at Begin (one atomic load).
//     Memory-only transactions never touch the registry.
//   - On its first storage access it selects a storage snapshot v through
//     the cross-engine snapshot registry (package csr) and records s→v.
//   - A transaction that wrote both engines pre-commits both (c1, c2), passes
//     the commit check (records c1→c2), post-commits storage and then memory
//     (its writes become visible to anchor snapshots only after both), and
//     is acknowledged once both logs are durable. A serializable transaction
//     that touched both does the same even if it wrote one or none: each
//     engine orders by commit timestamp and the check makes the two orders
//     agree (commit ordering).
//   - Acknowledgement also waits until everything the transaction read is
//     durable, including both halves of every cross-engine transaction its
//     snapshot saw, so recovery can drop what was not acknowledged without
//     losing what was (recovery.go).
package skeena

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retinadb/retina/internal/oltp/csr"
	"github.com/retinadb/retina/internal/oltp/diskengine"
	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/memengine"
)

// Placement names the engine a table lives in.
type Placement uint8

const (
	Memory Placement = iota
	Storage
)

func (p Placement) String() string {
	if p == Storage {
		return "storage"
	}
	return "memory"
}

// Table declares a table and its engine.
type Table struct {
	engine.TableSpec
	Engine Placement
}

// Options configure a store.
type Options struct {
	// Dir holds the two engines' data (memory/ and storage/).
	Dir    string
	Tables []Table
	// Isolation is the default for Begin (snapshot isolation).
	Isolation engine.Isolation
	Logger    *slog.Logger
	// StorageCacheBytes sizes the storage engine's block cache.
	StorageCacheBytes int64
	// CSRPartSize is the number of points per registry part (default 4096).
	CSRPartSize int
	// CheckpointEvery is how often the memory engine checkpoints (default
	// one minute; negative: only when Checkpoint is called).
	CheckpointEvery time.Duration
	// DisableCSR turns the registry off: storage reads at its latest
	// snapshot and cross-engine commits skip the check. Only for showing
	// the anomalies the registry prevents.
	DisableCSR bool
	// Stream turns the commit stream on (Store.Commits). Its consumer must
	// keep reading, or call StopStream: commits it has not taken are held
	// in memory.
	Stream bool

	// betweenPostCommits runs after a cross-engine commit's storage half is
	// post-committed and before its memory half (tests).
	betweenPostCommits func()
}

// Store is the two-engine store.
type Store struct {
	mem       *memengine.Engine
	disk      *diskengine.Engine
	placement map[string]Placement
	iso       engine.Isolation
	noCSR     bool
	logger    *slog.Logger
	hook      func()

	csrMu  sync.Mutex
	reg    *csr.Registry
	active map[uint64]int // anchor snapshots of running transactions that selected

	cross crossRegistry

	// pin holds the storage engine's version GC at the oldest storage
	// snapshot a running transaction that has not touched storage yet may
	// select (maintain's goroutine only).
	pin   engine.Tx
	pinAt uint64

	stream     *commitStream // nil unless Options.Stream
	streamDone chan struct{}

	// commits and aborts count the transactions that committed and those
	// whose commit failed.
	commits, aborts atomic.Uint64

	stop chan struct{}
	done chan struct{}
	ckpt time.Duration
	once sync.Once
	life context.Context // ends at Close
	end  context.CancelFunc
}

// crossRegistry tracks cross-engine transactions from their commit check
// until both halves are durable. A reader's acknowledgement waits until
// none it could have seen is still in flight.
type crossRegistry struct {
	mu       sync.Mutex
	inflight map[*Tx]struct{}
	minC1    atomic.Uint64 // smallest anchor timestamp in flight (MaxUint64: none)
	minC2    atomic.Uint64
	changed  chan struct{}
}

// Open recovers and opens the store.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, errors.New("skeena: no data directory given")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.CSRPartSize <= 0 {
		opts.CSRPartSize = 4096
	}
	if opts.CheckpointEvery == 0 {
		opts.CheckpointEvery = time.Minute
	}
	s := &Store{placement: make(map[string]Placement), iso: opts.Isolation, noCSR: opts.DisableCSR,
		logger: opts.Logger, hook: opts.betweenPostCommits, reg: csr.New(opts.CSRPartSize),
		active: make(map[uint64]int), stop: make(chan struct{}), done: make(chan struct{}), ckpt: opts.CheckpointEvery}
	s.life, s.end = context.WithCancel(context.Background())
	s.cross.inflight = make(map[*Tx]struct{})
	s.cross.minC1.Store(math.MaxUint64)
	s.cross.minC2.Store(math.MaxUint64)
	s.cross.changed = make(chan struct{})
	var memTables, diskTables []engine.TableSpec
	for _, t := range opts.Tables {
		if _, dup := s.placement[t.Name]; dup {
			return nil, fmt.Errorf("skeena: table %q declared twice", t.Name)
		}
		s.placement[t.Name] = t.Engine
		if t.Engine == Storage {
			diskTables = append(diskTables, t.TableSpec)
		} else {
			memTables = append(memTables, t.TableSpec)
		}
	}
	mem, err := memengine.Open(memengine.Options{Dir: opts.Dir + "/memory", Tables: memTables, Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("skeena: %w", err)
	}
	disk, err := diskengine.Open(diskengine.Options{Dir: opts.Dir + "/storage", Tables: diskTables, Logger: opts.Logger, CacheBytes: opts.StorageCacheBytes})
	if err != nil {
		mem.Close()
		return nil, fmt.Errorf("skeena: %w", err)
	}
	s.mem, s.disk = mem, disk
	if err := s.recover(ctx); err != nil {
		disk.Close()
		mem.Close()
		return nil, err
	}
	go s.maintain()
	if opts.Stream {
		if opts.DisableCSR {
			s.Close()
			return nil, errors.New("skeena: the commit stream needs the snapshot registry (DisableCSR is set)")
		}
		s.stream, s.streamDone = newCommitStream(), make(chan struct{})
		go func() {
			defer close(s.streamDone)
			s.runStream()
		}()
	}
	return s, nil
}

// Close stops maintenance and closes both engines.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		s.end()
		close(s.stop)
		<-s.done
		if s.streamDone != nil {
			<-s.streamDone
		}
		err = errors.Join(s.disk.Close(), s.mem.Close())
	})
	return err
}

func (s *Store) engineOf(table string) (Placement, error) {
	p, ok := s.placement[table]
	if !ok {
		return 0, fmt.Errorf("skeena: table %q: %w", table, engine.ErrUnknownTable)
	}
	return p, nil
}

// maintain recycles registry parts, checkpoints the memory engine and lets
// the storage engine forget txn records recovery can no longer need (which
// also lets its version GC go that far).
func (s *Store) maintain() {
	defer close(s.done)
	defer func() {
		if s.pin != nil {
			s.pin.Abort()
		}
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastCkpt := time.Now()
	for n := 1; ; n++ {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		s.recycle()
		s.pinStorage()
		memSafe, diskSafe := s.safePoints()
		// Each forget is a range deletion in Pebble: once a second.
		if n%10 == 0 {
			if err := s.disk.ForgetThrough(diskSafe); err != nil {
				s.logger.Warn("skeena: storage engine could not drop old txn records", "err", err)
			}
		}
		if s.ckpt > 0 && time.Since(lastCkpt) >= s.ckpt {
			lastCkpt = time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if _, err := s.mem.Checkpoint(ctx, memSafe); err != nil {
				s.logger.Warn("skeena: memory checkpoint failed", "err", err)
			}
			cancel()
		}
	}
}

// pinStorage moves the pin. A transaction selects its storage snapshot
// when it first touches storage, at min(latest, Upper(anchor)), which for
// every anchor at or above the oldest running one is at least
// min(latest now, Upper(oldest)): versions there must outlive the version
// GC however long the transaction worked in memory first.
func (s *Store) pinStorage() {
	if s.noCSR {
		return
	}
	oldest := s.mem.OldestReader()
	s.csrMu.Lock()
	b, err := s.reg.Bounds(oldest)
	s.csrMu.Unlock()
	if err != nil {
		return // its registry part is recycled: such a transaction cannot select anyway
	}
	at := min(b.Upper, s.disk.LatestSnapshot())
	if s.pin != nil && at == s.pinAt {
		return
	}
	old := s.pin
	s.pin, s.pinAt = s.disk.Begin(at, engine.SnapshotIsolation), at
	if old != nil {
		old.Abort()
	}
}

// Checkpoint checkpoints the memory engine now (up to what recovery can
// never need to roll back). It reports whether a checkpoint was written.
func (s *Store) Checkpoint(ctx context.Context) (bool, error) {
	memSafe, _ := s.safePoints()
	return s.mem.Checkpoint(ctx, memSafe)
}

// safePoints are the highest timestamps of each engine at or below which
// no transaction can ever be rolled back by recovery: durable, and no
// cross-engine transaction at or below still waiting for its other half.
func (s *Store) safePoints() (mem, disk uint64) {
	s.cross.mu.Lock()
	defer s.cross.mu.Unlock()
	mem, disk = s.mem.DurableTS(), s.disk.DurableTS()
	if m := s.cross.minC1.Load(); m != math.MaxUint64 {
		mem = min(mem, m-1)
	}
	if m := s.cross.minC2.Load(); m != math.MaxUint64 {
		disk = min(disk, m-1)
	}
	return mem, disk
}

func (s *Store) recycle() {
	if s.noCSR {
		return
	}
	oldest := s.mem.LatestSnapshot()
	s.csrMu.Lock()
	for a := range s.active {
		oldest = min(oldest, a)
	}
	s.reg.Recycle(oldest, 4)
	s.csrMu.Unlock()
}

// CSRStats reports the registry's parts and points.
func (s *Store) CSRStats() (parts, points int) {
	s.csrMu.Lock()
	defer s.csrMu.Unlock()
	return s.reg.Stats()
}

func (c *crossRegistry) add(tx *Tx) {
	c.mu.Lock()
	c.inflight[tx] = struct{}{}
	c.recompute()
	c.mu.Unlock()
}

func (c *crossRegistry) remove(tx *Tx) {
	c.mu.Lock()
	delete(c.inflight, tx)
	c.recompute()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *crossRegistry) recompute() {
	m1, m2 := uint64(math.MaxUint64), uint64(math.MaxUint64)
	for tx := range c.inflight {
		m1, m2 = min(m1, tx.c1), min(m2, tx.c2)
	}
	c.minC1.Store(m1)
	c.minC2.Store(m2)
}

// waitSettled blocks until no cross-engine transaction with an anchor
// timestamp ≤ s or a storage timestamp ≤ v is still in flight.
func (c *crossRegistry) waitSettled(ctx context.Context, s, v uint64) error {
	for {
		if c.minC1.Load() > s && c.minC2.Load() > v {
			return nil
		}
		c.mu.Lock()
		ch := c.changed
		ok := c.minC1.Load() > s && c.minC2.Load() > v
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Engines returns the two engines behind the store, for benchmarks that
// compare the store against an engine used alone. Transactions run on them
// directly bypass the store's guarantees.
func (s *Store) Engines() (memory, storage engine.Engine) { return s.mem, s.disk }

// Outcomes counts the transactions that committed and those whose commit
// failed (conflicts, validation, the commit check) since the store opened.
func (s *Store) Outcomes() (commits, aborts uint64) { return s.commits.Load(), s.aborts.Load() }
