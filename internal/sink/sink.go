// Package sink turns a CDC stream into exactly-once, commit-ordered mirror
// transactions: it rebuilds source transactions, drops what was applied
// before, allocates timestamps with group begin, shards operations by
// primary-key hash into buckets, sends each bucket's operations to its
// replayer in order, and commits each transaction once all of its
// operations are applied (group commit).
package sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/txn"
	"github.com/retinadb/retina/internal/types"
)

// Policy is what the sink does with a message it cannot decode.
type Policy string

// Bad-input policies.
const (
	// Fail stops the sink, reporting the position and the reason, and does
	// not advance past the message.
	Fail Policy = "fail"
	// DeadLetter appends the raw message and the reason to a file and goes on.
	DeadLetter Policy = "dead-letter"
)

// Replayer applies operations; replay.Replayer implements it.
type Replayer interface {
	Apply(ctx context.Context, ops []replay.Op) error
}

// Catalog is what the sink needs from the catalog.
type Catalog interface {
	Snapshot() *catalog.Snapshot
	CreateTable(ctx context.Context, name string, schema catalog.Schema) (*catalog.Table, error)
}

// Truncator lists the primary keys of a table's rows visible at a snapshot,
// so a truncate can delete them (scan.Scanner does it in the server).
type Truncator interface {
	LiveKeys(ctx context.Context, table *catalog.Table, snapshot uint64) ([][]any, error)
}

// Config configures a sink.
type Config struct {
	Source    cdc.Source
	Catalog   Catalog
	Txn       txn.Service
	Replayers []Replayer
	// Buckets shard operations by primary-key hash; bucket b goes to
	// replayer b mod len(Replayers) (default 16).
	Buckets int
	// SnapshotBatch is the number of snapshot events per mirror
	// transaction (default 4096).
	SnapshotBatch int
	// GroupMax bounds the transactions of one group begin (default 512).
	GroupMax int
	// BadInput is Fail (default) or DeadLetter with DeadLetterPath.
	BadInput       Policy
	DeadLetterPath string
	// Checkpoints, when set, receives a checkpoint after every group commit,
	// for a sink whose replayers keep their state when the sink restarts.
	// Without it, the caller takes Checkpoint() when replay state is durable.
	Checkpoints CheckpointStore
	// Start is where to resume (usually the last persisted checkpoint).
	Start     Checkpoint
	Truncator Truncator
	Logger    *slog.Logger
}

// Stats count the sink's work.
type Stats struct {
	Messages, Transactions, Duplicates, Ops, Skipped, DeadLettered uint64
	LastCommitTS                                                   uint64
	// Committed counts the row changes of committed transactions: they
	// are visible to queries.
	Committed uint64
	// LastSourceMS is the source commit time (ms) of the newest committed
	// transaction that carried one: now minus it is the replay lag.
	LastSourceMS int64
}

// Sink runs the pipeline; Run blocks until the source ends or fails, or ctx
// is cancelled.
type Sink struct {
	cfg     Config
	log     *slog.Logger
	dec     *cdc.Decoder
	track   *tracker
	dead    *os.File
	buckets []chan *bucketWork
	keyType map[uint32][]types.Type // dispatcher only
	fail    func(error)             // reports a pipeline error and stops intake

	messages, transactions, duplicates, ops, skipped, deadLettered, lastTS atomic.Uint64
	lastSourceMS                                                           atomic.Int64
	committed                                                              atomic.Uint64
}

// inflight is one dispatched transaction waiting for its buckets.
type inflight struct {
	tx      Txn
	ts      uint64
	pending atomic.Int32
}

type bucketWork struct {
	ops []replay.Op
	tx  *inflight
}

// New validates the configuration.
func New(cfg Config) (*Sink, error) {
	if cfg.Source == nil || cfg.Catalog == nil || cfg.Txn == nil || len(cfg.Replayers) == 0 {
		return nil, fmt.Errorf("sink: source, catalog, transaction service and replayers are required")
	}
	if cfg.Buckets <= 0 {
		cfg.Buckets = 16
	}
	if cfg.SnapshotBatch <= 0 {
		cfg.SnapshotBatch = 4096
	}
	if cfg.GroupMax <= 0 {
		cfg.GroupMax = 512
	}
	if cfg.BadInput == "" {
		cfg.BadInput = Fail
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Sink{cfg: cfg, log: cfg.Logger.With("component", "sink"), track: newTracker(cfg.Start),
		keyType: map[uint32][]types.Type{}}
	switch cfg.BadInput {
	case Fail:
	case DeadLetter:
		if cfg.DeadLetterPath == "" {
			return nil, fmt.Errorf("sink: the dead-letter policy needs a file")
		}
		f, err := os.OpenFile(cfg.DeadLetterPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, fmt.Errorf("sink: dead-letter file: %w", err)
		}
		s.dead = f
	default:
		return nil, fmt.Errorf("sink: unknown bad-input policy %q (fail or dead-letter)", cfg.BadInput)
	}
	s.dec = cdc.NewDecoder(tablesOf{cfg.Catalog}, s.log)
	return s, nil
}

// tablesOf resolves names in the catalog's current snapshot.
type tablesOf struct{ c Catalog }

func (t tablesOf) Table(name string) (*catalog.Table, bool) { return t.c.Snapshot().Table(name) }

// Stats returns the counters.
func (s *Sink) Stats() Stats {
	return Stats{
		Messages: s.messages.Load(), Transactions: s.transactions.Load(), Duplicates: s.duplicates.Load(),
		Ops: s.ops.Load(), Skipped: s.skipped.Load(), DeadLettered: s.deadLettered.Load(), LastCommitTS: s.lastTS.Load(),
		LastSourceMS: s.lastSourceMS.Load(), Committed: s.committed.Load(),
	}
}

// Checkpoint is the resume point covering every committed transaction.
func (s *Sink) Checkpoint() Checkpoint { return s.track.checkpoint() }

// Run consumes the source until it ends (io.EOF: returns nil after every
// transaction is committed), fails, or ctx is cancelled (returns ctx's
// error after in-flight transactions are committed).
func (s *Sink) Run(ctx context.Context) error {
	if s.dead != nil {
		defer s.dead.Close()
	}
	txns := make(chan []Txn, 64) // back-pressure between intake and dispatch
	done := make(chan *inflight, 4096)
	var wg sync.WaitGroup
	s.buckets = make([]chan *bucketWork, s.cfg.Buckets)
	errc := make(chan error, s.cfg.Buckets+3)
	// In-flight work finishes even when ctx ends; intake stops at once.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	intakeCtx, stopIntake := context.WithCancel(ctx)
	defer stopIntake()
	s.fail = func(err error) {
		errc <- err
		stopIntake()
	}
	for b := range s.buckets {
		s.buckets[b] = make(chan *bucketWork, 256)
		r := s.cfg.Replayers[b%len(s.cfg.Replayers)]
		wg.Go(func() { s.bucketLoop(work, r, s.buckets[b], done) })
	}
	var cwg sync.WaitGroup
	cwg.Go(func() { s.commitLoop(work, done) })

	intakeErr := make(chan error, 1)
	go func() { intakeErr <- s.intake(intakeCtx, txns) }()
	dispErr := s.dispatch(work, txns)
	if dispErr != nil {
		stopIntake()
		for range txns { // let intake finish
		}
	}
	for _, ch := range s.buckets {
		close(ch)
	}
	wg.Wait()
	close(done)
	cwg.Wait()
	close(errc)
	ierr := <-intakeErr
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	errs = append(errs, dispErr)
	switch {
	case ierr == nil || errors.Is(ierr, io.EOF):
	case errors.Is(ierr, context.Canceled) && ctx.Err() == nil && len(errs) > 0:
		// intake was stopped because of an error reported above
	default:
		errs = append(errs, ierr)
	}
	return errors.Join(errs...)
}

// intake reads, decodes and assembles; completed transactions go to out.
func (s *Sink) intake(ctx context.Context, out chan<- []Txn) error {
	defer close(out)
	asm := newAssembler(s.cfg.SnapshotBatch)
	msgs := make(chan cdc.Message, 1024)
	readErr := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(msgs)
		for {
			m, err := s.cfg.Source.Next(rctx)
			if err != nil {
				readErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-rctx.Done():
				readErr <- rctx.Err()
				return
			}
		}
	}()
	batches := s.decodeAhead(rctx, msgs)
	idle := time.NewTicker(20 * time.Millisecond)
	defer idle.Stop()
	emit := func() error {
		if ready := asm.take(); len(ready) > 0 {
			select {
			case out <- ready:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	lastWarn := time.Now()
	for {
		select {
		case b, ok := <-batches:
			if !ok {
				err := <-readErr
				asm.flushSnapshot()
				if eerr := emit(); eerr != nil && errors.Is(err, io.EOF) {
					return eerr
				}
				if errors.Is(err, io.EOF) && len(asm.open) > 0 {
					s.log.Warn("source ended with incomplete transactions", "open", len(asm.open))
				}
				return err
			}
			select {
			case <-b.ready:
			case <-ctx.Done():
				return ctx.Err()
			}
			for i, m := range b.msgs {
				s.messages.Add(1)
				s.track.seen(m.Pos)
				if err := s.decodeOne(ctx, asm, m, b.recs[i], b.errs[i]); err != nil {
					// What came before the failing message is applied.
					return errors.Join(err, emit())
				}
			}
			if err := emit(); err != nil {
				return err
			}
		case <-idle.C:
			asm.flushSnapshot() // a quiet stream: release a partial snapshot batch
			if err := emit(); err != nil {
				return err
			}
			if time.Since(lastWarn) > 10*time.Second {
				if msg := asm.stuck(10 * time.Second); msg != "" {
					s.log.Warn("waiting for transaction events (is a table or transaction topic not consumed?)", "detail", msg)
					lastWarn = time.Now()
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// decodedBatch is a run of consecutive messages decoded by one worker;
// ready closes when recs and errs are filled.
type decodedBatch struct {
	msgs  []cdc.Message
	recs  []cdc.Record
	errs  []error
	ready chan struct{}
}

// maxDecodeBatch bounds a batch; a batch takes only what is already queued,
// so a quiet stream is decoded message by message without waiting.
const maxDecodeBatch = 256

// decodeAhead decodes messages on every core and hands the batches back in
// source order. JSON decoding is the sink's largest cost, and messages
// decode independently; assembly stays sequential. A message that names a
// table created by an earlier one fails here and is decoded again in order
// (decodeOne).
func (s *Sink) decodeAhead(ctx context.Context, msgs <-chan cdc.Message) <-chan *decodedBatch {
	workers := runtime.GOMAXPROCS(0)
	ordered := make(chan *decodedBatch, 2*workers)
	work := make(chan *decodedBatch, workers)
	for range workers {
		go func() {
			dec := cdc.NewDecoder(tablesOf{s.cfg.Catalog}, s.log)
			for b := range work {
				for i, m := range b.msgs {
					b.recs[i], b.errs[i] = dec.Decode(m)
				}
				close(b.ready)
			}
		}()
	}
	go func() {
		defer close(ordered)
		defer close(work)
		for m := range msgs {
			b := &decodedBatch{msgs: []cdc.Message{m}, ready: make(chan struct{})}
		fill:
			for len(b.msgs) < maxDecodeBatch {
				select {
				case m, ok := <-msgs:
					if !ok {
						break fill
					}
					b.msgs = append(b.msgs, m)
				default:
					break fill
				}
			}
			b.recs, b.errs = make([]cdc.Record, len(b.msgs)), make([]error, len(b.msgs))
			select {
			case ordered <- b:
			case <-ctx.Done():
				return
			}
			work <- b // workers always drain work, so this cannot stall for good
		}
	}()
	return ordered
}

// decodeOne assembles a message decoded ahead. A message that failed is
// decoded again first: it may name a table an earlier message created.
func (s *Sink) decodeOne(ctx context.Context, asm *assembler, m cdc.Message, rec cdc.Record, err error) error {
	if err != nil {
		rec, err = s.dec.Decode(m)
	}
	var ut *cdc.UnknownTableError
	if errors.As(err, &ut) {
		if _, cerr := s.cfg.Catalog.CreateTable(ctx, ut.Table, ut.Schema); cerr != nil && !errors.Is(cerr, catalog.ErrExists) {
			err = fmt.Errorf("sink: %s: create table %s from the message schema: %w", ut.Pos, ut.Table, cerr)
		} else {
			if cerr == nil {
				s.log.Info("created table from the change-event schema", "table", ut.Table, "columns", len(ut.Schema.Columns))
			}
			rec, err = s.dec.Decode(m)
		}
	}
	if err != nil {
		return s.badInput(m, err)
	}
	if rec.Kind == cdc.Skip {
		s.skipped.Add(1)
		s.track.done([]cdc.Position{m.Pos})
		return nil
	}
	if err := asm.add(rec); err != nil {
		return fmt.Errorf("sink: %s: %w", m.Pos, err)
	}
	if dup := asm.takeDropped(); len(dup) > 0 {
		s.duplicates.Add(uint64(len(dup)))
		s.track.done(dup)
	}
	return nil
}

func (s *Sink) badInput(m cdc.Message, err error) error {
	if s.cfg.BadInput != DeadLetter {
		return err
	}
	line, _ := json.Marshal(struct {
		Position cdc.Position    `json:"position"`
		Reason   string          `json:"reason"`
		Key      json.RawMessage `json:"key,omitempty"`
		Value    string          `json:"value"`
	}{m.Pos, err.Error(), rawOrNil(m.Key), string(m.Value)})
	if _, werr := s.dead.Write(append(line, '\n')); werr != nil {
		return fmt.Errorf("sink: dead-letter write failed (%v) for: %w", werr, err)
	}
	if werr := s.dead.Sync(); werr != nil {
		return fmt.Errorf("sink: dead-letter sync failed (%v) for: %w", werr, err)
	}
	s.deadLettered.Add(1)
	s.log.Warn("message dead-lettered", "position", m.Pos.String(), "reason", err)
	s.track.done([]cdc.Position{m.Pos})
	return nil
}

func rawOrNil(b []byte) json.RawMessage {
	if json.Valid(b) {
		return b
	}
	return nil
}

// dispatch allocates timestamps for groups of transactions and hands their
// operations to the buckets, in commit order.
func (s *Sink) dispatch(ctx context.Context, in <-chan []Txn) error {
	var queue []Txn
	for {
		if len(queue) == 0 {
			batch, ok := <-in
			if !ok {
				return nil
			}
			queue = batch
		}
	more: // take whatever else is ready, up to GroupMax
		for len(queue) < s.cfg.GroupMax {
			select {
			case batch, ok := <-in:
				if !ok {
					break more
				}
				queue = append(queue, batch...)
			default:
				break more
			}
		}
		var group []Txn
		for _, tx := range queue[:min(len(queue), s.cfg.GroupMax)] {
			if s.track.duplicate(tx) {
				s.duplicates.Add(1)
				s.track.done(tx.Positions)
				continue
			}
			group = append(group, tx)
		}
		queue = queue[min(len(queue), s.cfg.GroupMax):]
		if len(group) == 0 {
			continue
		}
		rg, err := s.cfg.Txn.BeginMirror(ctx, len(group))
		if err != nil {
			return fmt.Errorf("sink: group begin: %w", err)
		}
		for i, tx := range group {
			ts := rg.First + uint64(i)
			if err := s.send(ctx, tx, ts); err != nil {
				// Nothing of this or later transactions was sent: give their
				// timestamps back so HWM can pass them.
				rest := make([]uint64, 0, len(group)-i)
				for j := i; j < len(group); j++ {
					rest = append(rest, rg.First+uint64(j))
				}
				if aerr := s.cfg.Txn.AbandonMirror(context.WithoutCancel(ctx), rest...); aerr != nil {
					s.log.Error("abandoning unsent timestamps failed", "err", aerr)
				}
				return err
			}
		}
	}
}

// send turns a transaction into bucketed operations and queues them.
func (s *Sink) send(ctx context.Context, tx Txn, ts uint64) error {
	snap := s.cfg.Catalog.Snapshot()
	perBucket := map[int][]replay.Op{}
	for _, c := range tx.Changes {
		t, ok := snap.Table(c.Table)
		if !ok {
			return fmt.Errorf("sink: %s: table %s disappeared from the catalog", c.Pos, c.Table)
		}
		ops, err := s.toOps(ctx, c, t, ts)
		if err != nil {
			return err
		}
		for _, op := range ops {
			b, err := s.bucket(t, op)
			if err != nil {
				return fmt.Errorf("sink: %s: %w", c.Pos, err)
			}
			perBucket[b] = append(perBucket[b], op)
		}
	}
	f := &inflight{tx: tx, ts: ts}
	s.transactions.Add(1)
	if len(perBucket) == 0 { // nothing to apply: commit right away
		f.pending.Store(1)
		perBucket[0] = nil
	} else {
		f.pending.Store(int32(len(perBucket)))
	}
	for b, ops := range perBucket {
		s.ops.Add(uint64(len(ops)))
		s.buckets[b] <- &bucketWork{ops: ops, tx: f}
	}
	return nil
}

// toOps maps one change to replay operations; a primary-key change becomes
// a delete of the old key and an insert of the new one.
func (s *Sink) toOps(ctx context.Context, c cdc.Record, t *catalog.Table, ts uint64) ([]replay.Op, error) {
	keys := t.Schema.KeyColumns()
	pick := func(row []any) []any {
		if row == nil {
			return nil
		}
		out := make([]any, len(keys))
		for i, k := range keys {
			out[i] = row[k]
		}
		return out
	}
	switch c.Op {
	case cdc.OpCreate, cdc.OpRead:
		return []replay.Op{{TS: ts, Table: t.ID, Kind: replay.Insert, Row: c.After}}, nil
	case cdc.OpDelete:
		key := c.Key
		if key == nil {
			key = pick(c.Before)
		}
		return []replay.Op{{TS: ts, Table: t.ID, Kind: replay.Delete, Key: key, Before: c.Before}}, nil
	case cdc.OpUpdate:
		newKey := pick(c.After)
		oldKey := c.Key
		if c.Before != nil {
			oldKey = pick(c.Before) // the key in the message is the new one
		}
		if oldKey == nil {
			oldKey = newKey
		}
		if !sameKey(oldKey, newKey) {
			return []replay.Op{
				{TS: ts, Table: t.ID, Kind: replay.Delete, Key: oldKey, Before: c.Before},
				{TS: ts, Table: t.ID, Kind: replay.Insert, Row: c.After},
			}, nil
		}
		return []replay.Op{{TS: ts, Table: t.ID, Kind: replay.Update, Key: newKey, Row: c.After, Before: c.Before}}, nil
	case cdc.OpTruncate:
		if s.cfg.Truncator == nil {
			return nil, fmt.Errorf("sink: %s: truncate of %s needs a truncator", c.Pos, t.Name)
		}
		// Every earlier transaction must be visible before the live rows
		// are listed: wait for HWM to reach this one.
		if ts > 1 {
			if _, err := s.cfg.Txn.WaitHWM(ctx, ts-1); err != nil {
				return nil, err
			}
		}
		live, err := s.cfg.Truncator.LiveKeys(ctx, t, ts-1)
		if err != nil {
			return nil, fmt.Errorf("sink: %s: truncate %s: %w", c.Pos, t.Name, err)
		}
		ops := make([]replay.Op, len(live))
		for i, k := range live {
			ops[i] = replay.Op{TS: ts, Table: t.ID, Kind: replay.Delete, Key: k}
		}
		return ops, nil
	}
	return nil, fmt.Errorf("sink: %s: op %c", c.Pos, c.Op)
}

func sameKey(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if ab, ok := a[i].([]byte); ok {
			bb, ok := b[i].([]byte)
			if !ok || !bytes.Equal(ab, bb) {
				return false
			}
			continue
		}
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// bucket hashes an operation's primary key.
func (s *Sink) bucket(t *catalog.Table, op replay.Op) (int, error) {
	vals := op.Key
	if op.Kind == replay.Insert || vals == nil {
		keys := t.Schema.KeyColumns()
		vals = make([]any, len(keys))
		for i, k := range keys {
			if k >= len(op.Row) {
				return 0, fmt.Errorf("row of %s has %d values", t.Name, len(op.Row))
			}
			vals[i] = op.Row[k]
		}
	}
	kt := s.keyType[t.ID]
	if kt == nil {
		for _, k := range t.Schema.KeyColumns() {
			kt = append(kt, t.Schema.Columns[k].Type)
		}
		s.keyType[t.ID] = kt
	}
	enc, err := index.AppendKey(nil, t.PrimaryIndexID, kt, vals)
	if err != nil {
		return 0, fmt.Errorf("primary key of %s: %w", t.Name, err)
	}
	// A fixed hash: a key must land in the same bucket (and replayer, which
	// owns the versions it wrote) after a restart.
	return int(crc32.Checksum(enc, castagnoli) % uint32(s.cfg.Buckets)), nil
}

// bucketLoop applies one bucket's operations in order, merging what is
// queued into one Apply call.
func (s *Sink) bucketLoop(ctx context.Context, r Replayer, in <-chan *bucketWork, done chan<- *inflight) {
	failed := false
	for w := range in {
		batch := []*bucketWork{w}
	more:
		for len(batch) < 64 {
			select {
			case x, ok := <-in:
				if !ok {
					break more
				}
				batch = append(batch, x)
			default:
				break more
			}
		}
		if failed {
			continue // drain: the pipeline is stopping
		}
		var ops []replay.Op
		for _, x := range batch {
			ops = append(ops, x.ops...)
		}
		if len(ops) > 0 {
			if err := r.Apply(ctx, ops); err != nil {
				s.fail(fmt.Errorf("sink: apply: %w", err))
				failed = true
				continue
			}
		}
		for _, x := range batch {
			if x.tx.pending.Add(-1) == 0 {
				done <- x.tx
			}
		}
	}
}

// commitLoop commits applied transactions in groups and checkpoints.
func (s *Sink) commitLoop(ctx context.Context, done <-chan *inflight) {
	for f := range done {
		group := []*inflight{f}
	more:
		for len(group) < 4096 {
			select {
			case x, ok := <-done:
				if !ok {
					break more
				}
				group = append(group, x)
			default:
				break more
			}
		}
		ts := make([]uint64, len(group))
		for i, g := range group {
			ts[i] = g.ts
		}
		if err := s.cfg.Txn.CommitMirror(ctx, ts...); err != nil {
			s.fail(fmt.Errorf("sink: group commit: %w", err))
			for range done { // drain so the buckets can finish
			}
			return
		}
		top, rows, newest := uint64(0), 0, s.lastSourceMS.Load()
		for _, g := range group {
			s.track.applyTxn(g.tx)
			top = max(top, g.ts)
			rows += len(g.tx.Changes)
			for _, c := range g.tx.Changes {
				newest = max(newest, c.SourceTSms)
			}
		}
		s.lastSourceMS.Store(newest)
		s.committed.Add(uint64(rows))
		if top > s.lastTS.Load() {
			s.lastTS.Store(top)
		}
		if s.cfg.Checkpoints != nil {
			cp := s.track.checkpoint()
			if err := s.cfg.Checkpoints.Save(cp); err != nil {
				s.fail(err)
				for range done {
				}
				return
			}
			if err := s.cfg.Source.Commit(ctx, cp.Resume); err != nil {
				s.log.Warn("source offset commit failed; it will be retried", "err", err)
			}
		}
	}
}
