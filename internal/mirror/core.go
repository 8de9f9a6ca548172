// Package mirror is the deterministic core of mirror transactions, built
// the way etcd's raft is: a state machine with no goroutines, clock or I/O.
// Events go in (messages read, a transaction assembled, timestamps granted,
// a bucket applied or failed, a rollback done, commits acknowledged, a
// tick) and a Ready comes out: the operations to send to each bucket, what
// to roll back, commit and abort, which transactions to set aside, what to
// persist and what to collect. The sink is its driver: it owns the
// goroutines, the transaction service, the replayers and the files.
//
// # Rules
//
//   - Transactions get timestamps in the order they are proposed (each
//     source's commit order) and commit in timestamp order: a transaction
//     commits once every bucket it touches applied it and every transaction
//     below it has committed or been aborted.
//   - A transaction is applied whole or not at all. When a bucket fails one,
//     every bucket rolls back everything from its timestamp on; the
//     transactions below it commit, it and everything above are aborted (so
//     HWM passes them without showing any of their writes).
//   - Fail policy, or a failure of the system rather than of the data:
//     ingestion stops at that transaction and its messages stay unapplied,
//     so a restart reaches it again and stops there again.
//   - Dead-letter policy: the transaction is set aside whole, its messages
//     count as handled, and the transactions above it are proposed again in
//     order under new timestamps, applied to the state without it.
//   - LWM moves only on a tick; memory GC is decided there.
package mirror

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/retinadb/retina/internal/change"
)

// Policy is what happens to a transaction that cannot be applied.
type Policy uint8

// The policies.
const (
	// Fail stops ingestion at the transaction.
	Fail Policy = iota
	// DeadLetter sets the transaction aside and goes on.
	DeadLetter
)

func (p Policy) String() string {
	if p == DeadLetter {
		return "dead-letter"
	}
	return "fail"
}

// Config configures a core.
type Config struct {
	// Buckets is how many buckets operations are sharded into.
	Buckets int
	Policy  Policy
	// GroupMax bounds the timestamps of one request (default 512).
	GroupMax int
	// MaxInflight bounds the transactions holding timestamps and not yet
	// committed (default 8192): it bounds what the buckets have queued.
	MaxInflight int
	// MaxPartOps bounds the operations of later parts sent to buckets and
	// not yet applied (default 65536): the back-pressure that keeps a
	// transaction proposed in parts from filling memory when the buckets
	// are slower than its source.
	MaxPartOps int
	// MaxQueued bounds the assembled transactions waiting for timestamps
	// (default 4096); CanPropose is false at it.
	MaxQueued int
	// CheckpointOnCommit asks for the sources' resume points after every
	// commit acknowledgement (for replayers whose state outlives the sink).
	CheckpointOnCommit bool
	// A replay checkpoint is taken every CheckpointTicks ticks, or after
	// CheckpointCommits commits, whichever comes first, when anything
	// committed since the last one (0 turns a trigger off).
	CheckpointTicks   int
	CheckpointCommits int
	// PurgeTicks: every PurgeTicks ticks, when LWM has moved since the
	// last purge, the index drops the versions no snapshot ≥ LWM can see
	// (0 never purges). A purge walks the whole index, so it is rarer than
	// memory GC.
	PurgeTicks int
	// Start holds each source's resume point (one per source).
	Start []change.Checkpoint
	// RedoUpTo holds, per source and stream, how far the process before
	// this one had committed (as far as it is known): transactions up to
	// there are redone after a crash, and Stats counts them.
	RedoUpTo []map[string]int64
}

// Txn is one source transaction, assembled.
type Txn struct {
	Source int
	// ID identifies it for de-duplication: the source transaction id, or the
	// position of its first message when there is no metadata.
	ID string
	// Positions of every message that belongs to it.
	Positions []change.Position
	// Ops per bucket, buckets ascending, none empty.
	Ops []change.BucketOps
	// Rows is how many row changes it carries; SourceMS is the newest
	// source commit time (ms) among them, 0 if unknown.
	Rows     int
	SourceMS int64
	// Open says more parts of this transaction follow; Part numbers them
	// (0: the first, or the whole transaction). A large transaction whose
	// source sends it whole and in commit order can be proposed in parts
	// as it arrives, so no part of the pipeline holds all of it: the parts
	// share the first part's timestamp, and it commits once the last
	// (Open false) is applied. A later part carries only its own operations
	// and positions. A transaction in parts that a rollback aborts cannot
	// be proposed again (its earlier parts are gone): under the dead-letter
	// policy the driver proposes transactions whole.
	Open bool
	Part int
	// Invalid, when set, says the transaction cannot be turned into
	// operations (a change the catalog cannot place): it fails in its
	// place in the order, as if a bucket had refused it.
	Invalid error
	// Raw is the driver's: the sink keeps the transaction's messages here
	// ([]cdc.Message) to write a set-aside transaction whole. The core
	// only hands it back, so it does not depend on the change model.
	Raw any
}

// Stats count the core's work.
type Stats struct {
	Proposed, Duplicates, Committed, Aborted, DeadLettered uint64
	// Rows counts the row changes of committed transactions.
	Rows uint64
	// LastCommitTS is the newest committed timestamp; LastSourceMS the
	// newest source commit time among committed transactions.
	LastCommitTS uint64
	LastSourceMS int64
	// HWM: every timestamp below it is committed or aborted.
	HWM uint64
	// LWM as of the last tick.
	LWM uint64
	// Checkpoints counts the replay checkpoints persisted; CheckpointTS is
	// the newest one's timestamp.
	Checkpoints  uint64
	CheckpointTS uint64
	// CommittedOffset is the highest message offset of a committed
	// transaction (with one stream: how far the source is applied).
	CommittedOffset int64
	// Redone counts committed transactions that the process before had
	// committed too (see Config.RedoUpTo); Redoing is true until every
	// stream is past where that process was.
	Redone  uint64
	Redoing bool
}

// TxnError is why a transaction was not applied.
type TxnError struct {
	Source    int
	ID        string
	TS        uint64
	Positions []change.Position
	// System says the replayer failed, not the transaction's data.
	System bool
	Err    error
}

func (e *TxnError) Error() string {
	at := ""
	if len(e.Positions) > 0 {
		at = " at " + e.Positions[0].String()
		if n := len(e.Positions); n > 1 {
			at += fmt.Sprintf(" (and %d more messages)", n-1)
		}
	}
	if e.System {
		return fmt.Sprintf("applying transaction %s%s failed: %v", e.ID, at, e.Err)
	}
	return fmt.Sprintf("transaction %s%s cannot be applied: %v", e.ID, at, e.Err)
}

func (e *TxnError) Unwrap() error { return e.Err }

// ErrUnclean is wrapped when the replay state may hold writes of a
// transaction that was neither committed nor rolled back: it must not be
// saved as a clean state.
var ErrUnclean = errors.New("replay state is not clean")

type inflight struct {
	txn     Txn
	ts      uint64
	pending int // sends to buckets not yet applied
	parts   int // parts proposed after the first
}

// sentOps is one send to a bucket not yet applied.
type sentOps struct {
	ts   uint64
	ops  int
	part bool // of a later part: counts toward MaxPartOps
}

type rollback struct {
	from    uint64
	waiting map[int]bool
	err     error
	system  bool
	quiet   bool // of an unfinished transaction at a stop: no error, nothing set aside
}

// Core is the state machine. It is not safe for concurrent use: one driver
// goroutine feeds it events and takes its Ready.
type Core struct {
	cfg      Config
	trackers []*tracker
	ended    []bool

	queue     []Txn // assembled, waiting for timestamps
	requested int   // timestamps asked for and not granted yet
	inflight  []*inflight
	byTS      map[uint64]*inflight
	sent      [][]sentOps          // per bucket: sends not applied, in order (timestamps ascending)
	partOps   int                  // operations of later parts sent and not applied
	acking    map[uint64]*inflight // commit decided, acknowledgement pending

	rb       *rollback
	closed   bool // no new proposals are taken
	draining bool // queued transactions are dropped, not applied
	stopErr  error
	done     bool

	collected uint64
	purged    uint64 // LWM of the last index purge
	purgeWait int    // ticks since it
	ckpt      checkpointState
	committed []map[string]int64 // per source and stream: highest committed offset
	ready     Ready
	stats     Stats
}

// A replay checkpoint goes through phases: dispatch stops until nothing is
// in flight (quiescing), the driver captures the state at that exact
// timestamp (sealing), dispatch resumes while the driver writes it out
// (writing).
type ckptPhase uint8

const (
	ckptIdle ckptPhase = iota
	ckptQuiescing
	ckptSealing
	ckptWriting
)

type checkpointState struct {
	phase   ckptPhase
	ticks   int    // since the last checkpoint
	commits uint64 // since the last checkpoint
	wanted  bool   // the driver has state to persist that no commit brought
	handled bool   // messages were handled without a transaction: resume points moved
	ts      uint64 // of the checkpoint under way
}

// New makes a core.
func New(cfg Config) (*Core, error) {
	if cfg.Buckets <= 0 {
		return nil, fmt.Errorf("mirror: %d buckets", cfg.Buckets)
	}
	if len(cfg.Start) == 0 {
		return nil, fmt.Errorf("mirror: no sources")
	}
	if cfg.GroupMax <= 0 {
		cfg.GroupMax = 512
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 8192
	}
	if cfg.MaxPartOps <= 0 {
		cfg.MaxPartOps = 1 << 16
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 4096
	}
	c := &Core{cfg: cfg, ended: make([]bool, len(cfg.Start)), byTS: map[uint64]*inflight{},
		sent: make([][]sentOps, cfg.Buckets), acking: map[uint64]*inflight{}}
	for range cfg.Start {
		c.committed = append(c.committed, map[string]int64{})
	}
	for _, cp := range cfg.Start {
		c.trackers = append(c.trackers, newTracker(cp))
	}
	c.stats.Redoing = c.redoing()
	return c, nil
}

// CanPropose says whether the core takes another transaction now.
func (c *Core) CanPropose() bool {
	return len(c.queue) < c.cfg.MaxQueued && c.partOps < c.cfg.MaxPartOps && !c.closed
}

// Stats returns the counters.
func (c *Core) Stats() Stats { return c.stats }

// Checkpoints is every source's resume point as of the acknowledged
// commits and the transactions set aside.
func (c *Core) Checkpoints() []change.Checkpoint {
	out := make([]change.Checkpoint, len(c.trackers))
	for i, t := range c.trackers {
		out[i] = t.checkpoint()
	}
	return out
}

// Ready returns what the driver must do now and starts a new one.
func (c *Core) Ready() Ready {
	r := c.ready
	c.ready = Ready{}
	return r
}

func (c *Core) source(i int) (*tracker, error) {
	if i < 0 || i >= len(c.trackers) {
		return nil, fmt.Errorf("mirror: source %d of %d", i, len(c.trackers))
	}
	return c.trackers[i], nil
}

// Read registers messages read from a source, before they are assembled.
func (c *Core) Read(source int, ps []change.Position) error {
	t, err := c.source(source)
	if err != nil {
		return err
	}
	t.seen(ps)
	return nil
}

// Handled marks messages that need no transaction: skipped, set aside as
// undecodable, or dropped as redelivered copies.
func (c *Core) Handled(source int, ps []change.Position) error {
	t, err := c.source(source)
	if err != nil {
		return err
	}
	t.done(ps)
	c.ckpt.handled = c.ckpt.handled || len(ps) > 0
	return nil
}

// Propose hands in an assembled transaction. A transaction applied before
// (a redelivery) is dropped as handled.
func (c *Core) Propose(txn Txn) error {
	t, err := c.source(txn.Source)
	if err != nil {
		return err
	}
	for i, b := range txn.Ops {
		if b.Bucket < 0 || b.Bucket >= c.cfg.Buckets || len(b.Ops) == 0 || i > 0 && b.Bucket <= txn.Ops[i-1].Bucket {
			return fmt.Errorf("mirror: transaction %s: bad bucket list", txn.ID)
		}
	}
	if t.duplicate(txn.ID, txn.Positions) {
		t.done(txn.Positions)
		if txn.Part == 0 {
			c.stats.Duplicates++
		}
		return nil
	}
	if c.closed {
		return nil // left unapplied: a restart reads it again
	}
	if txn.Part > 0 {
		return c.proposePart(txn)
	}
	c.stats.Proposed++
	c.queue = append(c.queue, txn)
	c.maybeRequest()
	return nil
}

// proposePart adds a later part to its open transaction: to the queued
// first part while it waits for its timestamp, else straight to the
// buckets at that timestamp.
func (c *Core) proposePart(part Txn) error {
	for i := len(c.queue) - 1; i >= 0; i-- {
		q := &c.queue[i]
		if q.Source != part.Source || q.ID != part.ID {
			continue
		}
		if !q.Open {
			return fmt.Errorf("mirror: part %d of transaction %s after its last", part.Part, part.ID)
		}
		q.Ops = mergeOps(q.Ops, part.Ops)
		c.joinPart(q, part)
		return nil
	}
	for _, f := range c.inflight {
		if f.txn.Source != part.Source || f.txn.ID != part.ID {
			continue
		}
		if !f.txn.Open {
			return fmt.Errorf("mirror: part %d of transaction %s after its last", part.Part, part.ID)
		}
		c.joinPart(&f.txn, part)
		f.parts++
		switch {
		case c.rb != nil && f.ts >= c.rb.from:
			// Being rolled back: the transaction is aborted whole.
		case part.Invalid != nil:
			f.pending++ // never applied: it holds back the commits above it
			c.startRollback(f.ts, part.Invalid, false)
		default:
			c.send(f, part.Ops)
		}
		c.commitReady()
		c.maybePersist()
		return nil
	}
	// Not queued and not in flight: the rollback that aborted it is
	// stopping ingestion, or a restart will read it again.
	return nil
}

// joinPart records a later part on its transaction.
func (c *Core) joinPart(txn *Txn, part Txn) {
	txn.Open = part.Open
	for _, p := range part.Positions { // a position repeated part after part is kept once
		if n := len(txn.Positions); n == 0 || txn.Positions[n-1] != p {
			txn.Positions = append(txn.Positions, p)
		}
	}
	txn.Rows += part.Rows
	txn.SourceMS = max(txn.SourceMS, part.SourceMS)
	if txn.Invalid == nil {
		txn.Invalid = part.Invalid
	}
}

// mergeOps appends b's operations to a's, bucket by bucket, buckets
// ascending.
func mergeOps(a, b []change.BucketOps) []change.BucketOps {
	for _, bo := range b {
		i, found := slices.BinarySearchFunc(a, bo.Bucket, func(x change.BucketOps, bucket int) int { return x.Bucket - bucket })
		if found {
			a[i].Ops = append(a[i].Ops, bo.Ops...)
		} else {
			a = slices.Insert(a, i, bo)
		}
	}
	return a
}

// maybeRequest asks for timestamps for the head of the queue.
func (c *Core) maybeRequest() {
	if c.requested > 0 || c.rb != nil || c.draining || c.ckpt.phase == ckptQuiescing || c.ckpt.phase == ckptSealing {
		return
	}
	n := min(len(c.queue), c.cfg.GroupMax, c.cfg.MaxInflight-len(c.inflight))
	if n <= 0 {
		return
	}
	c.requested = n
	c.ready.Request = n
}

// Grant hands in the timestamps [first, first+n) of the last request.
func (c *Core) Grant(first uint64, n int) error {
	if n != c.requested || n <= 0 {
		return fmt.Errorf("mirror: granted %d timestamps, %d were requested", n, c.requested)
	}
	c.requested = 0
	if c.rb != nil || c.draining {
		for i := range n {
			c.ready.Abort = append(c.ready.Abort, first+uint64(i))
		}
		c.stats.Aborted += uint64(n)
		c.maybePersist()
		c.checkDone()
		return nil
	}
	for i := range n {
		c.dispatch(c.queue[i], first+uint64(i))
	}
	c.queue = slices.Delete(c.queue, 0, n)
	c.commitReady()
	c.maybeRequest()
	c.maybePersist()
	return nil
}

// GrantFailed reports that the timestamp request failed: ingestion stops
// once what is in flight is done.
func (c *Core) GrantFailed(err error) {
	c.requested = 0
	c.stop(fmt.Errorf("timestamps: %w", err))
	c.maybePersist()
}

func (c *Core) dispatch(txn Txn, ts uint64) {
	f := &inflight{txn: txn, ts: ts, pending: len(txn.Ops)}
	c.inflight = append(c.inflight, f)
	c.byTS[ts] = f
	if txn.Invalid != nil {
		f.pending = 1 // never applied: it holds back the commits above it
		c.startRollback(ts, txn.Invalid, false)
		return
	}
	f.pending = 0
	c.send(f, txn.Ops)
}

// send hands a transaction's operations (all, or one part's) to their
// buckets.
func (c *Core) send(f *inflight, ops []change.BucketOps) {
	stable := c.hwm()
	part := f.parts > 0
	for _, b := range ops {
		for i := range b.Ops {
			b.Ops[i].TS = f.ts
		}
		c.ready.Sends = append(c.ready.Sends, Send{Bucket: b.Bucket, TS: f.ts, TxnID: f.txn.ID, Ops: b.Ops, Stable: stable})
		c.sent[b.Bucket] = append(c.sent[b.Bucket], sentOps{ts: f.ts, ops: len(b.Ops), part: part})
		if part {
			c.partOps += len(b.Ops)
		}
		f.pending++
	}
	// Later parts bring their own operations: the first part's need not be
	// kept.
	if f.txn.Open {
		f.txn.Ops = nil
	}
}

// hwm is the smallest timestamp whose fate is not decided: everything below
// is committed or aborted.
func (c *Core) hwm() uint64 {
	if len(c.inflight) > 0 {
		return c.inflight[0].ts
	}
	return c.stats.HWM
}

// Applied reports that a bucket applied everything it was sent up to and
// including through.
func (c *Core) Applied(bucket int, through uint64) error {
	if bucket < 0 || bucket >= c.cfg.Buckets {
		return fmt.Errorf("mirror: bucket %d of %d", bucket, c.cfg.Buckets)
	}
	q := c.sent[bucket]
	i := 0
	for i < len(q) && q[i].ts <= through {
		i++
	}
	c.popSent(bucket, i)
	return nil
}

// AppliedSends reports that a bucket applied its next n sends, in the
// order they were handed out. Unlike Applied it tells the sends of one
// timestamp apart: a transaction proposed in parts sends a bucket more than
// once at its timestamp.
func (c *Core) AppliedSends(bucket, n int) error {
	if bucket < 0 || bucket >= c.cfg.Buckets {
		return fmt.Errorf("mirror: bucket %d of %d", bucket, c.cfg.Buckets)
	}
	if n < 0 || n > len(c.sent[bucket]) {
		return fmt.Errorf("mirror: bucket %d applied %d sends, %d are outstanding", bucket, n, len(c.sent[bucket]))
	}
	c.popSent(bucket, n)
	return nil
}

// popSent marks a bucket's first n outstanding sends applied.
func (c *Core) popSent(bucket, n int) {
	q := c.sent[bucket]
	for _, s := range q[:n] {
		if f := c.byTS[s.ts]; f != nil {
			f.pending--
		}
		if s.part {
			c.partOps -= s.ops
		}
	}
	c.sent[bucket] = slices.Delete(q, 0, n)
	c.commitReady()
}

// Failed reports that a bucket could not apply the transaction at ts; it
// applied everything it was sent below ts. system says the bucket itself
// failed (the index, the buffer), not the transaction's data.
func (c *Core) Failed(bucket int, ts uint64, err error, system bool) error {
	if ts > 0 {
		if aerr := c.Applied(bucket, ts-1); aerr != nil {
			return aerr
		}
	}
	if c.byTS[ts] == nil {
		return fmt.Errorf("mirror: bucket %d failed timestamp %d, which is not in flight: %v", bucket, ts, err)
	}
	c.startRollback(ts, err, system)
	return nil
}

// startRollback makes every bucket undo everything from ts on, unless a
// rollback from lower is under way.
func (c *Core) startRollback(ts uint64, err error, system bool) {
	if c.rb != nil && ts >= c.rb.from {
		return // rolled back anyway
	}
	c.rb = &rollback{from: ts, waiting: map[int]bool{}, err: err, system: system}
	for b := range c.cfg.Buckets {
		c.rb.waiting[b] = true
	}
	// Commits below ts go on; a request in flight will be aborted.
	c.ready.Rollback = ts
}

// RolledBack reports that a bucket undid everything from from on. err is a
// failed undo: then the state is unclean and ingestion stops at once.
func (c *Core) RolledBack(bucket int, from uint64, err error) error {
	if err != nil {
		c.fatal(fmt.Errorf("%w: rollback of bucket %d from %d failed: %w", ErrUnclean, bucket, from, err))
		return nil
	}
	if c.rb == nil || from != c.rb.from {
		return nil // superseded by a rollback from lower
	}
	delete(c.rb.waiting, bucket)
	if len(c.rb.waiting) > 0 {
		return nil
	}
	rb := c.rb
	c.commitReady()
	if len(c.inflight) > 0 && c.inflight[0].ts < rb.from {
		c.fatal(fmt.Errorf("%w: transaction at %d below the rollback at %d is not applied", ErrUnclean, c.inflight[0].ts, rb.from))
		return nil
	}
	failed := c.byTS[rb.from]
	aborted := c.inflight
	c.inflight = nil
	clear(c.byTS)
	for b := range c.sent {
		c.sent[b] = c.sent[b][:0]
	}
	c.partOps = 0
	for _, f := range aborted {
		c.ready.Abort = append(c.ready.Abort, f.ts)
	}
	c.stats.Aborted += uint64(len(aborted))
	c.stats.HWM = max(c.stats.HWM, aborted[len(aborted)-1].ts+1)
	c.rb = nil
	if rb.quiet {
		c.maybePersist()
		c.checkDone()
		return nil
	}
	terr := &TxnError{Source: failed.txn.Source, ID: failed.txn.ID, TS: failed.ts, Positions: failed.txn.Positions, System: rb.system, Err: rb.err}
	if rb.system || c.cfg.Policy == Fail {
		c.stop(terr)
		return nil
	}
	c.ready.DeadLetters = append(c.ready.DeadLetters, Rejected{Txn: failed.txn, TS: failed.ts, Err: terr})
	c.trackers[failed.txn.Source].applyTxn(failed.txn.ID, failed.txn.Positions)
	c.stats.DeadLettered++
	// The transactions above go again, in order, against the state without
	// the one set aside.
	if !c.draining {
		again := make([]Txn, 0, len(aborted)-1+len(c.queue))
		for _, f := range aborted[1:] {
			if f.parts > 0 || f.txn.Open {
				c.stop(fmt.Errorf("transaction %s, proposed in parts, was rolled back behind %s and cannot be proposed again: a restart redoes it from the source", f.txn.ID, failed.txn.ID))
				return nil
			}
			again = append(again, f.txn)
		}
		c.queue = append(again, c.queue...)
	}
	c.checkpointIfAsked()
	c.maybeRequest()
	c.maybePersist()
	c.checkDone()
	return nil
}

// commitReady commits the transactions at the head that every bucket
// applied, below a rollback in progress.
func (c *Core) commitReady() {
	n := 0
	for n < len(c.inflight) {
		f := c.inflight[n]
		if f.pending > 0 || f.txn.Open || c.rb != nil && f.ts >= c.rb.from {
			break
		}
		c.ready.Commit = append(c.ready.Commit, f.ts)
		c.acking[f.ts] = f
		delete(c.byTS, f.ts)
		c.stats.HWM = f.ts + 1
		n++
	}
	if n > 0 {
		c.inflight = slices.Delete(c.inflight, 0, n)
		c.maybeRequest()
	}
}

// Positions is, for every source, the highest message offset of each
// stream that a committed transaction carried (a copy).
func (c *Core) Positions() []map[string]int64 {
	out := make([]map[string]int64, len(c.committed))
	for i, m := range c.committed {
		out[i] = maps.Clone(m)
	}
	return out
}

// SourceMS is the source commit time (ms, 0: unknown) of the transaction
// awaiting the acknowledgement of its commit at ts.
func (c *Core) SourceMS(ts uint64) int64 {
	if f := c.acking[ts]; f != nil {
		return f.txn.SourceMS
	}
	return 0
}

// Committed acknowledges that the transaction service committed the
// timestamps.
func (c *Core) Committed(ts []uint64) error {
	for _, t := range ts {
		f := c.acking[t]
		if f == nil {
			return fmt.Errorf("mirror: commit of %d acknowledged, but none is pending", t)
		}
		delete(c.acking, t)
		c.trackers[f.txn.Source].applyTxn(f.txn.ID, f.txn.Positions)
		c.stats.Committed++
		c.ckpt.commits++
		c.stats.Rows += uint64(f.txn.Rows)
		c.stats.LastCommitTS = max(c.stats.LastCommitTS, t)
		c.stats.LastSourceMS = max(c.stats.LastSourceMS, f.txn.SourceMS)
		redo := c.stats.Redoing
		for _, p := range f.txn.Positions {
			c.stats.CommittedOffset = max(c.stats.CommittedOffset, p.Offset)
			cm := c.committed[f.txn.Source]
			cm[p.Stream] = max(cm[p.Stream], p.Offset)
			if redo && (f.txn.Source >= len(c.cfg.RedoUpTo) || p.Offset > c.cfg.RedoUpTo[f.txn.Source][p.Stream]) {
				redo = false
			}
		}
		if redo {
			c.stats.Redone++
		}
	}
	if c.stats.Redoing {
		c.stats.Redoing = c.redoing()
	}
	c.checkpointIfAsked()
	if n := c.cfg.CheckpointCommits; n > 0 && c.ckpt.commits >= uint64(n) {
		c.startCheckpoint()
	}
	c.maybePersist()
	c.checkDone()
	return nil
}

// redoing reports whether some stream is not yet committed as far as the
// process before had committed it.
func (c *Core) redoing() bool {
	for src, streams := range c.cfg.RedoUpTo {
		for stream, off := range streams {
			if src >= len(c.committed) || c.committed[src][stream] < off {
				if src < len(c.trackers) && c.trackers[src].below(change.Position{Stream: stream, Offset: off}) {
					continue // the checkpoint covers it already
				}
				return true
			}
		}
	}
	return false
}

// Resume is where a stream of a source resumes: every message before it is
// applied and committed (or set aside for good). ok is false for a stream
// the source has not delivered from.
func (c *Core) Resume(source int, stream string) (off int64, ok bool) {
	if source < 0 || source >= len(c.trackers) {
		return 0, false
	}
	st := c.trackers[source].streams[stream]
	if st == nil {
		return 0, false
	}
	return st.resumeAt(), true
}

// CommittedOffsets is how far each stream of each source has been
// committed, by this process or (as Config.RedoUpTo tells) the ones before
// it: a process killed amid its redo must not make the next one forget how
// far the work had got.
func (c *Core) CommittedOffsets() []map[string]int64 {
	out := make([]map[string]int64, len(c.committed))
	for i, m := range c.committed {
		out[i] = maps.Clone(m)
		if i < len(c.cfg.RedoUpTo) {
			for stream, off := range c.cfg.RedoUpTo[i] {
				out[i][stream] = max(out[i][stream], off)
			}
		}
	}
	return out
}

// CommitFailed reports that the transaction service refused a commit: the
// replay state holds writes no one will commit.
func (c *Core) CommitFailed(err error) {
	c.fatal(fmt.Errorf("%w: commit failed: %w", ErrUnclean, err))
}

func (c *Core) checkpointIfAsked() {
	if !c.cfg.CheckpointOnCommit {
		return
	}
	for _, t := range c.trackers {
		t.compact()
	}
	c.ready.Checkpoint = c.Checkpoints()
}

// Tick is the passing of time: lwm is the transaction service's low
// watermark now. Memory GC and index purges below it are decided here,
// and only here.
func (c *Core) Tick(lwm uint64) {
	c.stats.LWM = max(c.stats.LWM, lwm)
	if c.stats.LWM > c.collected {
		c.collected = c.stats.LWM
		c.ready.Collect = c.collected
	}
	c.purgeWait++
	if n := c.cfg.PurgeTicks; n > 0 && c.purgeWait >= n && c.stats.LWM > c.purged {
		c.purged, c.purgeWait = c.stats.LWM, 0
		c.ready.Purge = c.purged
	}
	for _, t := range c.trackers {
		t.compact()
	}
	c.ckpt.ticks++
	// Before the first commit there is no state to capture (HWM 0): a
	// checkpoint then would stop dispatch for good.
	if n := c.cfg.CheckpointTicks; n > 0 && c.ckpt.ticks >= n && (c.ckpt.commits > 0 || c.ckpt.wanted || c.ckpt.handled) && c.stats.HWM > 0 {
		c.startCheckpoint()
	}
	c.maybePersist()
}

// WantCheckpoint says the replay state holds something to persist that no
// commit brought (a storage-GC rewrite waiting to be switched in): the next
// checkpoint is taken on schedule even if nothing committed.
func (c *Core) WantCheckpoint() { c.ckpt.wanted = true }

// startCheckpoint stops dispatch until what is in flight has committed.
func (c *Core) startCheckpoint() {
	if c.ckpt.phase == ckptIdle && !c.closed {
		c.ckpt.phase = ckptQuiescing
	}
}

// maybePersist asks the driver to capture the state once nothing is in
// flight: every transaction up to HWM − 1 is applied and none above.
func (c *Core) maybePersist() {
	if c.ckpt.phase != ckptQuiescing {
		return
	}
	if c.closed { // the stop writes its own final checkpoint
		c.ckpt.phase = ckptIdle
		c.maybeRequest()
		return
	}
	if len(c.inflight) > 0 || c.requested > 0 || c.rb != nil || len(c.acking) > 0 || c.stats.HWM == 0 {
		return
	}
	c.ckpt.phase, c.ckpt.ts = ckptSealing, c.stats.HWM-1
	for _, t := range c.trackers {
		t.compact()
	}
	c.ready.Persist = &Persist{TS: c.ckpt.ts, Sources: c.Checkpoints()}
}

// Sealed reports that the driver captured the state for the checkpoint at
// ts (or could not: err); dispatch goes on while it is written out.
func (c *Core) Sealed(ts uint64, err error) error {
	if c.ckpt.phase != ckptSealing || ts != c.ckpt.ts {
		return fmt.Errorf("mirror: sealed a checkpoint at %d, none was asked for", ts)
	}
	c.ckpt.phase = ckptWriting
	if err != nil {
		c.ckpt.phase = ckptIdle // the next tick tries again
	}
	c.maybeRequest()
	c.checkDone()
	return nil
}

// Persisted reports that the checkpoint at ts is durable (or failed: err,
// and the next one is tried on schedule).
func (c *Core) Persisted(ts uint64, err error) error {
	if c.ckpt.phase != ckptWriting || ts != c.ckpt.ts {
		return fmt.Errorf("mirror: checkpoint at %d persisted, none was being written", ts)
	}
	c.ckpt.phase = ckptIdle
	if err == nil {
		c.ckpt.ticks, c.ckpt.commits, c.ckpt.wanted, c.ckpt.handled = 0, 0, false, false
		c.stats.CheckpointTS = ts
		c.stats.Checkpoints++
	}
	return nil
}

// SourceEnded reports that a source has no more messages; when every
// source ended, the core finishes.
func (c *Core) SourceEnded(source int) error {
	if _, err := c.source(source); err != nil {
		return err
	}
	c.ended[source] = true
	if !slices.Contains(c.ended, false) {
		c.Finish(nil)
	}
	return nil
}

// Finish says no more transactions come: everything proposed is applied
// (or set aside), then Ready.Done comes with err. A source that fails after
// its good transactions finishes this way.
func (c *Core) Finish(err error) {
	if err != nil && c.stopErr == nil {
		c.stopErr = err
	}
	c.closed = true
	c.maybePersist()
	c.checkDone()
}

// Drain stops taking new work: what holds timestamps finishes, queued
// transactions stay unapplied (a restart reads them again), and Ready.Done
// comes once nothing is in flight, with err (nil for a clean stop).
func (c *Core) Drain(err error) {
	if err != nil && c.stopErr == nil {
		c.stopErr = err
	}
	c.closed, c.draining = true, true
	c.queue = nil
	// A transaction still arriving in parts cannot finish: it is rolled
	// back, and the next start reads it again from the source.
	for _, f := range c.inflight {
		if f.txn.Open {
			c.startRollback(f.ts, errUnfinished, false)
			c.rb.quiet = true
			break
		}
	}
	c.maybePersist()
	c.checkDone()
}

// errUnfinished is why a transaction proposed in parts is rolled back when
// ingestion stops before its last part.
var errUnfinished = errors.New("ingestion stopped before the transaction's last part")

// stop drains with an error.
func (c *Core) stop(err error) { c.Drain(err) }

// Fail ends the core at once because its driver cannot go on (an event it
// could not deliver, a record it could not write): what is in flight may be
// half applied, so the replay state is unclean.
func (c *Core) Fail(err error) {
	c.fatal(fmt.Errorf("%w: %w", ErrUnclean, err))
}

// fatal ends at once: what is in flight can neither commit nor be undone.
func (c *Core) fatal(err error) {
	if c.done {
		return
	}
	c.stopErr = err
	c.closed, c.draining = true, true
	c.queue = nil
	c.done = true
	c.ready.Done, c.ready.Err = true, err
}

func (c *Core) checkDone() {
	if c.done || !c.closed || c.requested > 0 || c.rb != nil || len(c.inflight) > 0 || len(c.acking) > 0 || len(c.queue) > 0 ||
		c.ckpt.phase == ckptSealing {
		return
	}
	c.done = true
	c.ready.Done, c.ready.Err = true, c.stopErr
}
