// Package sink turns CDC streams into exactly-once, commit-ordered mirror
// transactions. It is the driver of the mirror-transaction core
// (internal/mirror): it reads, decodes and assembles each source's
// transactions, turns their changes into operations sharded by primary-key
// hash into buckets, and carries out what the core decides: timestamps from
// the transaction service, operations to each bucket's replayer, rollbacks,
// commits and aborts, dead letters, checkpoints and memory GC.
package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/mirror"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/txn"
)

// Policy is what the sink does with a message it cannot decode and with a
// transaction it cannot apply.
type Policy string

// Bad-input policies.
const (
	// Fail stops ingestion at the message or transaction, reporting its
	// position and the reason, and does not move past it.
	Fail Policy = "fail"
	// DeadLetter appends the message, or the whole transaction, and the
	// reason to a file and goes on.
	DeadLetter Policy = "dead-letter"
)

// Replayer applies a bucket's operations and rolls them back;
// replay.Replayer implements it.
type Replayer interface {
	Apply(ctx context.Context, b replay.Batch) error
	Rollback(ctx context.Context, bucket int, from uint64) error
}

// Catalog is what the sink needs from the catalog.
type Catalog interface {
	Snapshot() *catalog.Snapshot
	CreateTable(ctx context.Context, name string, schema catalog.Schema) (*catalog.Table, error)
}

// Collector runs GC below a low watermark: memory GC of the visibility
// structures, and index purges.
type Collector interface {
	Collect(lwm uint64)
	PurgeIndex(lwm uint64)
}

// Persister takes replay checkpoints (the server's node does).
type Persister interface {
	// Seal captures the replay state at ts. Nothing is in flight while it
	// runs, so it must be quick: what is slow goes into Write.
	Seal(ctx context.Context, ts uint64) (SealedState, error)
	// Pending says the replay state holds something to persist that no
	// commit brought (a storage-GC rewrite waiting to be switched in): the
	// next scheduled checkpoint is taken even if nothing committed.
	Pending() bool
}

// SealedState is a captured replay state on its way to disk.
type SealedState interface {
	// Write makes it durable together with the sources' resume points;
	// only then may a source confirm those points upstream.
	Write(ctx context.Context, sources []change.Checkpoint) error
}

// Config configures a sink.
type Config struct {
	// Sources are read in parallel; their transactions get timestamps in
	// the order they are assembled.
	Sources []cdc.Source
	// SourceNames name them (their URIs) in dead-letter records; optional.
	SourceNames []string
	Catalog     Catalog
	Txn         txn.Service
	Replayers   []Replayer
	// Buckets shard operations by primary-key hash; bucket b goes to
	// replayer b mod len(Replayers) (default 16).
	Buckets int
	// SnapshotBatch is the number of snapshot events per mirror
	// transaction (default 4096).
	SnapshotBatch int
	// GroupMax bounds the transactions of one group begin (0: the core's
	// default).
	GroupMax int
	// BadInput is Fail (default) or DeadLetter with DeadLetterPath.
	BadInput       Policy
	DeadLetterPath string
	// Decoder tunes Debezium decoding (decimal handling).
	Decoder cdc.DecoderOptions
	// Checkpoints, when set, receives every source's checkpoint after every
	// group commit, for replayers whose state outlives the sink. Without
	// it, the caller takes Checkpoints() after Run, once the replay state
	// is durable.
	Checkpoints CheckpointStore
	// Start is where each source resumes (usually the last persisted
	// checkpoints); missing entries start from the beginning.
	Start []change.Checkpoint
	// Collector, when set, runs memory GC below the low watermark on ticks,
	// and index purges every PurgeTicks ticks (default 60; negative: never).
	Collector  Collector
	PurgeTicks int
	// Persister, when set, takes replay checkpoints every CheckpointTicks
	// ticks (default 5) or CheckpointCommits commits (default 100000),
	// whichever comes first.
	Persister         Persister
	CheckpointTicks   int
	CheckpointCommits int
	// RedoUpTo is how far the process before committed each stream of each
	// source, where known: the transactions up to there count as redone.
	RedoUpTo []map[string]int64
	// Progress, when set, is told on every tick how far each stream of each
	// source is committed (the server keeps it for the next start's redo
	// count).
	Progress func([]map[string]int64)
	// Tick is how often the low watermark is read and GC decided (1s).
	Tick time.Duration
	// Visible, when set, is told of every committed transaction that
	// carried its source commit time: the time from that commit to the
	// transaction becoming visible is Retina's freshness.
	Visible func(sourceMS int64, at time.Time)
	Logger  *slog.Logger
}

// Stats count the sink's work.
type Stats struct {
	Messages, Transactions, Duplicates, Ops, Skipped, DeadLettered, Aborted uint64
	LastCommitTS                                                            uint64
	// Committed counts the row changes of committed transactions: they
	// are visible to queries.
	Committed uint64
	// LastSourceMS is the source commit time (ms) of the newest committed
	// transaction that carried one: now minus it is the replay lag.
	LastSourceMS int64
	// Checkpoints counts the replay checkpoints written; CheckpointTS is
	// the newest one's timestamp, LastCheckpoint when it was durable and
	// CheckpointDuration how long it took from seal to durable.
	Checkpoints        uint64
	CheckpointTS       uint64
	LastCheckpoint     time.Time
	CheckpointDuration time.Duration
	CheckpointErrors   uint64
	// CommittedOffset is the highest message offset of a committed
	// transaction (with one stream: how far the source is applied).
	CommittedOffset int64
	// Redone counts the transactions redone after a crash; Redoing is true
	// until the sources are past where the process before had committed.
	Redone  uint64
	Redoing bool
	// RedoTook is how long the redo took from the pipeline's start (0
	// while it runs, or when there was none).
	RedoTook time.Duration
}

// Sink runs the pipeline; Run blocks until the sources end or fail, a
// transaction stops it, or ctx is cancelled.
type Sink struct {
	cfg   Config
	log   *slog.Logger
	core  *mirror.Core
	start []change.Checkpoint // one per source
	dead  *deadLetters

	messages, skipped, deadDecoded, ops atomic.Uint64
	// sourceMessages counts each source's messages read.
	sourceMessages []atomic.Uint64
	ckptErrors     atomic.Uint64
	lastCkpt       atomic.Pointer[ckptInfo]
	coreStats      atomic.Pointer[mirror.Stats] // the core's counters, for other goroutines
	redoTook       atomic.Int64                 // nanoseconds the redo after a crash took (0: none or running)
	ran            atomic.Bool
	waits          waiters
	wakeup         chan struct{} // a new wait: check the waiters
}

// DefaultBuckets is how many buckets the operations are sharded into
// when Config.Buckets is 0.
const DefaultBuckets = 16

// New validates the configuration.
func New(cfg Config) (*Sink, error) {
	if len(cfg.Sources) == 0 || cfg.Catalog == nil || cfg.Txn == nil || len(cfg.Replayers) == 0 {
		return nil, fmt.Errorf("sink: sources, catalog, transaction service and replayers are required")
	}
	if cfg.Buckets <= 0 {
		cfg.Buckets = DefaultBuckets
	}
	if cfg.SnapshotBatch <= 0 {
		cfg.SnapshotBatch = 4096
	}
	if cfg.BadInput == "" {
		cfg.BadInput = Fail
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.Persister == nil {
		cfg.CheckpointTicks, cfg.CheckpointCommits = 0, 0
	} else {
		if cfg.CheckpointTicks == 0 {
			cfg.CheckpointTicks = 5
		}
		if cfg.CheckpointCommits == 0 {
			cfg.CheckpointCommits = 100_000
		}
	}
	if cfg.PurgeTicks == 0 {
		cfg.PurgeTicks = 60
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.Start) > len(cfg.Sources) {
		return nil, fmt.Errorf("sink: %d checkpoints for %d sources", len(cfg.Start), len(cfg.Sources))
	}
	start := make([]change.Checkpoint, len(cfg.Sources))
	copy(start, cfg.Start)
	s := &Sink{cfg: cfg, log: cfg.Logger.With("component", "sink"), start: start, wakeup: make(chan struct{}, 1),
		sourceMessages: make([]atomic.Uint64, len(cfg.Sources))}
	policy := mirror.Fail
	switch cfg.BadInput {
	case Fail:
	case DeadLetter:
		if cfg.DeadLetterPath == "" {
			return nil, fmt.Errorf("sink: the dead-letter policy needs a file")
		}
		policy = mirror.DeadLetter
	default:
		return nil, fmt.Errorf("sink: unknown bad-input policy %q (fail or dead-letter)", cfg.BadInput)
	}
	core, err := mirror.New(mirror.Config{Buckets: cfg.Buckets, Policy: policy, GroupMax: cfg.GroupMax,
		CheckpointOnCommit: cfg.Checkpoints != nil, CheckpointTicks: max(cfg.CheckpointTicks, 0),
		CheckpointCommits: max(cfg.CheckpointCommits, 0), PurgeTicks: max(cfg.PurgeTicks, 0), Start: start, RedoUpTo: cfg.RedoUpTo})
	if err != nil {
		return nil, err
	}
	s.core = core
	st := core.Stats()
	s.coreStats.Store(&st)
	return s, nil
}

type ckptInfo struct {
	at       time.Time
	duration time.Duration
}

// Stats returns the counters.
func (s *Sink) Stats() Stats {
	c := s.coreStats.Load()
	st := Stats{
		Messages: s.messages.Load(), Transactions: c.Committed + c.DeadLettered, Duplicates: c.Duplicates,
		Ops: s.ops.Load(), Skipped: s.skipped.Load(), DeadLettered: s.deadDecoded.Load() + c.DeadLettered,
		Aborted: c.Aborted, LastCommitTS: c.LastCommitTS, LastSourceMS: c.LastSourceMS, Committed: c.Rows,
		Checkpoints: c.Checkpoints, CheckpointTS: c.CheckpointTS, CheckpointErrors: s.ckptErrors.Load(),
		CommittedOffset: c.CommittedOffset, Redone: c.Redone, Redoing: c.Redoing,
		RedoTook: time.Duration(s.redoTook.Load()),
	}
	if ci := s.lastCkpt.Load(); ci != nil {
		st.LastCheckpoint, st.CheckpointDuration = ci.at, ci.duration
	}
	return st
}

// Checkpoints are every source's resume points, covering every committed
// transaction. Call it after Run returned.
func (s *Sink) Checkpoints() []change.Checkpoint { return s.core.Checkpoints() }

// SourceMessages counts each source's messages read so far.
func (s *Sink) SourceMessages() []uint64 {
	out := make([]uint64, len(s.sourceMessages))
	for i := range s.sourceMessages {
		out[i] = s.sourceMessages[i].Load()
	}
	return out
}

// event is something that happened outside the driver, fed to the core on
// the driver's goroutine.
type event func(c *mirror.Core) error

// Run consumes the sources until every one ends (returns nil after every
// transaction is committed), ingestion stops on an error (returns it: a
// *mirror.TxnError names the transaction), or ctx is cancelled (returns
// ctx's error after the transactions holding timestamps are committed).
// A Sink runs once.
func (s *Sink) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("sink: Run called twice")
	}
	if s.cfg.BadInput == DeadLetter {
		d, err := openDeadLetters(s.cfg.DeadLetterPath)
		if err != nil {
			return err
		}
		defer d.close()
		s.dead = d
	}
	d := newDriver(s)
	return d.run(ctx)
}

// driver carries out the core's decisions.
type driver struct {
	s       *Sink
	core    *mirror.Core
	events  chan event
	stopped chan struct{} // closed when the core is done: senders give up
	work    context.Context
	cancel  context.CancelFunc
	started time.Time

	buckets  []*bucketQueue
	bucketWG sync.WaitGroup
	gc       chan gcJob
	gcWG     sync.WaitGroup
	ckptWG   sync.WaitGroup // the checkpoint being written
}

func newDriver(s *Sink) *driver {
	return &driver{s: s, core: s.core, events: make(chan event, 1024), stopped: make(chan struct{}), gc: make(chan gcJob, 1), started: time.Now()}
}

// send hands an event to the driver unless it is done.
func (d *driver) send(e event) {
	select {
	case d.events <- e:
	case <-d.stopped:
	}
}

func (d *driver) run(ctx context.Context) error {
	s := d.s
	// In-flight work finishes even when ctx ends; intake stops at once.
	d.work, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer d.cancel()
	d.startWorkers()
	intake, stopIntake := context.WithCancel(ctx)
	defer stopIntake()
	batches := make(chan intakeBatch, 4)
	var intakeWG sync.WaitGroup
	for i, src := range s.cfg.Sources {
		in := newIntake(s, i, src, s.start[i])
		intakeWG.Go(func() { in.run(intake, batches) })
	}
	intakeDone := make(chan struct{})
	go func() { intakeWG.Wait(); close(intakeDone) }()

	tick := time.NewTicker(s.cfg.Tick)
	defer tick.Stop()
	stop := ctx.Done()
	var result error
	for {
		in := batches
		if !s.core.CanPropose() {
			in = nil // back-pressure: the intakes wait
		}
		select {
		case b := <-in:
			d.take(b)
		case e := <-d.events:
			if err := e(s.core); err != nil {
				s.core.Fail(fmt.Errorf("sink: the mirror core refused an event: %w", err))
			}
		case <-tick.C:
			if s.cfg.Persister != nil && s.cfg.Persister.Pending() {
				s.core.WantCheckpoint()
			}
			if w, err := s.cfg.Txn.Watermarks(d.work); err == nil {
				s.core.Tick(w.LWM)
			}
			if s.cfg.Progress != nil {
				s.cfg.Progress(s.core.CommittedOffsets())
			}
		case <-stop:
			stop = nil
			s.core.Drain(nil)
		case <-s.wakeup:
		}
		// Carrying out a Ready can feed the core (a failed write drains it):
		// take Readys until there is nothing left to do.
		done := false
		for rd := s.core.Ready(); !rd.Empty(); rd = s.core.Ready() {
			d.exec(rd)
			if rd.Done {
				done, result = true, rd.Err
				break
			}
		}
		st := s.core.Stats()
		if prev := s.coreStats.Load(); prev.Redoing && !st.Redoing {
			took := time.Since(d.started)
			s.redoTook.Store(int64(took))
			s.log.Info("redo after the crash is done: the sources are past where the last process stopped", "transactions", st.Redone,
				"took", took.Round(time.Millisecond))
		}
		s.coreStats.Store(&st)
		s.release(s.core)
		if done {
			break
		}
	}
	s.stopWaits()
	close(d.stopped)
	stopIntake()
	go func() { // let blocked intakes finish
		for range batches {
		}
	}()
	<-intakeDone
	close(batches)
	d.stopWorkers(result)
	if result == nil && ctx.Err() != nil {
		result = ctx.Err()
	}
	return result
}

// take feeds one intake batch to the core, in order.
func (d *driver) take(b intakeBatch) {
	c := d.core
	if err := c.Read(b.source, b.read); err != nil {
		c.Fail(fmt.Errorf("sink: the mirror core refused input of source %d: %w", b.source, err))
		return
	}
	for _, it := range b.items {
		var err error
		switch {
		case it.txn != nil:
			err = c.Propose(*it.txn)
		case it.ended:
			err = c.SourceEnded(b.source)
		case it.failed != nil:
			c.Finish(it.failed) // what came before it is applied
		default:
			err = c.Handled(b.source, it.handled)
		}
		if err != nil {
			c.Fail(fmt.Errorf("sink: the mirror core refused input of source %d: %w", b.source, err))
			return
		}
	}
}

// exec carries out a Ready, in the order its documentation gives.
func (d *driver) exec(rd mirror.Ready) {
	s := d.s
	for _, r := range rd.DeadLetters {
		if err := s.dead.writeTxn(s.sourceName(r.Txn.Source), r); err != nil {
			// Nothing may be lost: without its record the transaction
			// cannot count as handled, so no position may be saved.
			d.core.Fail(fmt.Errorf("sink: set aside transaction %s: %w", r.Txn.ID, err))
		}
		s.log.Warn("transaction dead-lettered", "txn", r.Txn.ID, "position", firstPos(r.Txn.Positions), "reason", r.Err)
	}
	// The transaction service is called from the driver itself: in process
	// it answers in microseconds, and a commit reaches HWM without waiting
	// for another goroutine to be scheduled.
	if len(rd.Commit) > 0 {
		if err := s.cfg.Txn.CommitMirror(context.WithoutCancel(d.work), rd.Commit...); err != nil {
			d.core.CommitFailed(err)
		} else {
			if s.cfg.Visible != nil {
				now := time.Now()
				for _, ts := range rd.Commit {
					if ms := d.core.SourceMS(ts); ms > 0 {
						s.cfg.Visible(ms, now)
					}
				}
			}
			if err := d.core.Committed(rd.Commit); err != nil {
				d.core.Fail(fmt.Errorf("sink: %w", err))
			}
		}
	}
	if len(rd.Abort) > 0 {
		if err := s.cfg.Txn.AbandonMirror(context.WithoutCancel(d.work), rd.Abort...); err != nil {
			s.log.Error("aborting timestamps failed", "ts", len(rd.Abort), "err", err)
		}
	}
	for i := range rd.Sends {
		snd := &rd.Sends[i]
		s.ops.Add(uint64(len(snd.Ops)))
		d.buckets[snd.Bucket].push(bucketItem{send: snd})
	}
	if rd.Rollback != 0 {
		s.log.Warn("rolling back every bucket", "from", rd.Rollback)
		for _, q := range d.buckets {
			q.push(bucketItem{rollback: rd.Rollback})
		}
	}
	if rd.Request > 0 {
		r, err := s.cfg.Txn.BeginMirror(d.work, rd.Request)
		if err != nil {
			d.core.GrantFailed(err)
		} else if err := d.core.Grant(r.First, r.N); err != nil {
			d.core.Fail(fmt.Errorf("sink: %w", err))
		}
	}
	if rd.Checkpoint != nil && s.cfg.Checkpoints != nil {
		if err := s.cfg.Checkpoints.Save(rd.Checkpoint); err != nil {
			d.core.Drain(fmt.Errorf("sink: save checkpoint: %w", err))
		} else {
			for i, src := range s.cfg.Sources {
				if err := src.Commit(d.work, rd.Checkpoint[i].Resume); err != nil {
					s.log.Warn("source offset commit failed; it will be retried", "err", err)
				}
			}
		}
	}
	if p := rd.Persist; p != nil {
		d.persist(p)
	}
	if (rd.Collect != 0 || rd.Purge != 0) && s.cfg.Collector != nil {
		job := gcJob{collect: rd.Collect, purge: rd.Purge}
		select { // the newest watermarks win; GC never holds up the loop
		case old := <-d.gc:
			job.collect, job.purge = max(job.collect, old.collect), max(job.purge, old.purge)
		default:
		}
		d.gc <- job
	}
	if rd.Done && rd.Err != nil {
		s.log.Error("ingestion stopped", "err", rd.Err)
	}
}

// gcJob is the GC the core decided: low watermarks to collect and to
// purge the index below (0: none).
type gcJob struct{ collect, purge uint64 }

// persist seals the replay state while nothing is in flight and writes it
// out in the background; the sources confirm upstream only what it made
// durable.
func (d *driver) persist(p *mirror.Persist) {
	s := d.s
	start := time.Now()
	st, err := s.cfg.Persister.Seal(d.work, p.TS)
	if err != nil {
		s.ckptErrors.Add(1)
		s.log.Error("replay checkpoint: seal failed; the next one will try again", "ts", p.TS, "err", err)
	}
	if serr := d.core.Sealed(p.TS, err); serr != nil {
		d.core.Fail(fmt.Errorf("sink: %w", serr))
		return
	}
	if errors.Is(err, mirror.ErrUnclean) { // the replay state is not whole
		d.core.Fail(fmt.Errorf("sink: replay checkpoint: %w", err))
		return
	}
	if err != nil {
		return
	}
	d.ckptWG.Go(func() {
		err := st.Write(d.work, p.Sources)
		if err == nil {
			s.lastCkpt.Store(&ckptInfo{at: time.Now(), duration: time.Since(start)})
			for i, src := range s.cfg.Sources {
				if cerr := src.Commit(d.work, p.Sources[i].Resume); cerr != nil {
					s.log.Warn("source offset commit failed; the next checkpoint retries it", "source", s.sourceName(i), "err", cerr)
				}
			}
		} else {
			s.ckptErrors.Add(1)
			s.log.Error("replay checkpoint failed; the previous one stays current and the next one will try again", "ts", p.TS, "err", err)
		}
		d.send(func(c *mirror.Core) error { return c.Persisted(p.TS, err) })
	})
}

func (s *Sink) sourceName(i int) string {
	if i < len(s.cfg.SourceNames) {
		return s.cfg.SourceNames[i]
	}
	return ""
}

func firstPos(ps []cdc.Position) string {
	if len(ps) == 0 {
		return ""
	}
	return ps[0].String()
}

func (d *driver) startWorkers() {
	s := d.s
	for b := range s.cfg.Buckets {
		q := newBucketQueue()
		d.buckets = append(d.buckets, q)
		r := s.cfg.Replayers[b%len(s.cfg.Replayers)]
		d.bucketWG.Go(func() { d.bucketLoop(b, r, q) })
	}
	if s.cfg.Collector != nil {
		d.gcWG.Go(func() {
			for job := range d.gc {
				if job.collect != 0 {
					s.cfg.Collector.Collect(job.collect)
				}
				if job.purge != 0 {
					s.cfg.Collector.PurgeIndex(job.purge)
				}
			}
		})
	}
}

// stopWorkers ends the goroutines.
func (d *driver) stopWorkers(result error) {
	if errors.Is(result, mirror.ErrUnclean) {
		d.cancel() // what is queued can no longer be made whole
	}
	for _, q := range d.buckets {
		q.close()
	}
	d.bucketWG.Wait()
	d.ckptWG.Wait()
	d.cancel()
	close(d.gc)
	d.gcWG.Wait()
}

// A bucket merges what is queued into one Apply call, up to these bounds:
// a larger call amortises more, but every transaction in it waits for the
// whole call before it can commit.
const (
	maxMergedSends = 64
	maxMergedOps   = 4096
)

// bucketLoop applies one bucket's operations in order, merging what is
// queued into one Apply call, and carries out rollbacks.
func (d *driver) bucketLoop(bucket int, r Replayer, q *bucketQueue) {
	s := d.s
	failed := false     // a failure was reported: skip sends until the rollback
	var ops []change.Op // merged sends, reused: Apply keeps none of them
	for {
		items, ok := q.take()
		if !ok {
			return
		}
		for i := 0; i < len(items); {
			it := items[i]
			if it.send == nil {
				from := it.rollback
				err := r.Rollback(d.work, bucket, from)
				failed = false
				d.send(func(c *mirror.Core) error { return c.RolledBack(bucket, from, err) })
				i++
				continue
			}
			j := i
			clear(ops) // rows of the last batch are not kept alive
			ops = ops[:0]
			stable := uint64(0)
			for ; j < len(items) && items[j].send != nil && j-i < maxMergedSends && len(ops) < maxMergedOps; j++ {
				ops = append(ops, items[j].send.Ops...)
				stable = max(stable, items[j].send.Stable)
			}
			first, sends := items[i].send.TS, j-i
			i = j
			if failed || d.work.Err() != nil {
				continue
			}
			err := r.Apply(d.work, replay.Batch{Bucket: bucket, Buckets: s.cfg.Buckets, Ops: ops, Stable: stable})
			if err == nil {
				d.send(func(c *mirror.Core) error { return c.AppliedSends(bucket, sends) })
				continue
			}
			failed = true
			var oe *replay.OpError
			ts, system := first, true
			if errors.As(err, &oe) {
				ts, system = oe.TS, false
			}
			d.send(func(c *mirror.Core) error { return c.Failed(bucket, ts, err, system) })
		}
	}
}

type bucketItem struct {
	send     *mirror.Send
	rollback uint64
}

type bucketQueue = queue[bucketItem]

func newBucketQueue() *bucketQueue { return newQueue[bucketItem]() }

// queue is an unbounded FIFO between the driver and one worker: the driver
// never blocks on a worker (the core bounds what is in flight).
type queue[T any] struct {
	mu     sync.Mutex
	items  []T
	closed bool
	wake   chan struct{}
}

func newQueue[T any]() *queue[T] { return &queue[T]{wake: make(chan struct{}, 1)} }

func (q *queue[T]) push(it T) {
	q.mu.Lock()
	q.items = append(q.items, it)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue[T]) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take waits for items and returns all of them; ok is false once the queue
// is closed and empty.
func (q *queue[T]) take() (items []T, ok bool) {
	for {
		q.mu.Lock()
		items, q.items = q.items, nil
		closed := q.closed
		q.mu.Unlock()
		if len(items) > 0 {
			return items, true
		}
		if closed {
			return nil, false
		}
		<-q.wake
	}
}
