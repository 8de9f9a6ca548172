package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/mirror"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/types"
)

// intakeBatch is what one source produced from a run of messages, for the
// driver to feed to the core in order: the messages read, then what each
// became.
type intakeBatch struct {
	source int
	read   []cdc.Position
	items  []intakeItem
}

// intakeItem is one of: a transaction, messages handled without one, the
// end of the source, or the error that stops it.
type intakeItem struct {
	txn     *mirror.Txn
	handled []cdc.Position
	ended   bool
	failed  error
}

// intake reads, decodes and assembles one source.
type intake struct {
	s       *Sink
	source  int
	src     cdc.Source
	log     *slog.Logger
	dec     *cdc.Decoder
	asm     *assembler
	keys    map[*catalog.Table]*tableKey
	keyBuf  []byte // scratch for bucket's key encoding
	keyVals []any
	batches batchPool
	ops     []change.Op // scratch for toTxn: a transaction's operations
	where   []int       // and the bucket of each
	cur     intakeBatch
	// What the start checkpoint says is applied: messages below a stream's
	// resume offset, and the listed transactions. A redelivered copy is
	// handled at once; assembled, part of a transaction could wait forever
	// for the messages before the resume offset.
	resume  map[string]int64
	applied map[string]bool
	// contiguous: the source sends each transaction whole and in commit
	// order, so large ones are proposed in parts (not under the
	// dead-letter policy, which must be able to propose a transaction
	// again whole); open is the one arriving.
	contiguous bool
	open       *partial
}

func newIntake(s *Sink, source int, src cdc.Source, start change.Checkpoint) *intake {
	in := &intake{s: s, source: source, src: src, log: s.log.With("source", source),
		dec: cdc.NewDecoder(tablesOf{s.cfg.Catalog}, s.log, s.cfg.Decoder), asm: newAssembler(s.cfg.SnapshotBatch),
		keys: map[*catalog.Table]*tableKey{}, cur: intakeBatch{source: source},
		resume: start.Resume, applied: map[string]bool{}}
	for _, a := range start.Applied {
		in.applied[a.ID] = true
	}
	if c, ok := src.(cdc.Contiguous); ok && c.Contiguous() && s.cfg.BadInput != DeadLetter {
		in.contiguous = true
	}
	return in
}

// tablesOf resolves names in the catalog's current snapshot.
type tablesOf struct{ c Catalog }

func (t tablesOf) Table(name string) (*catalog.Table, bool) { return t.c.Snapshot().Table(name) }

// emit hands the batch built so far to the driver.
func (in *intake) emit(ctx context.Context, out chan<- intakeBatch) error {
	if len(in.cur.read) == 0 && len(in.cur.items) == 0 {
		return nil
	}
	select {
	case out <- in.cur:
		in.cur = intakeBatch{source: in.source}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run reads until the source ends, fails or ctx ends.
func (in *intake) run(ctx context.Context, out chan<- intakeBatch) {
	err := in.loop(ctx, out)
	switch {
	case errors.Is(err, io.EOF):
		in.cur.items = append(in.cur.items, intakeItem{ended: true})
	case err != nil && ctx.Err() == nil:
		in.cur.items = append(in.cur.items, intakeItem{failed: err})
	}
	in.emit(ctx, out)
}

func (in *intake) loop(ctx context.Context, out chan<- intakeBatch) error {
	msgs := make(chan cdc.Message, 1024)
	readErr := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(msgs)
		for {
			m, err := in.src.Next(rctx)
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
	batches := in.decodeAhead(rctx, msgs)
	idle := time.NewTicker(20 * time.Millisecond)
	defer idle.Stop()
	lastWarn := time.Now()
	for {
		select {
		case b, ok := <-batches:
			if !ok {
				err := <-readErr
				in.asm.flushSnapshot()
				in.takeAssembled()
				if errors.Is(err, io.EOF) && len(in.asm.open) > 0 {
					in.log.Warn("source ended with incomplete transactions", "open", len(in.asm.open))
				}
				return err
			}
			select {
			case <-b.ready:
			case <-ctx.Done():
				return ctx.Err()
			}
			for i, m := range b.msgs {
				in.s.messages.Add(1)
				in.s.sourceMessages[in.source].Add(1)
				in.cur.read = append(in.cur.read, m.Pos)
				if off, ok := in.resume[m.Pos.Stream]; ok && m.Pos.Offset < off {
					in.handled(m.Pos) // applied before the restart
					continue
				}
				if err := in.decodeOne(ctx, m, b.recs[i], b.errs[i]); err != nil {
					in.takeAssembled() // what came before the failing message is applied
					return err
				}
			}
			in.takeAssembled()
			in.batches.put(b)
			if err := in.emit(ctx, out); err != nil {
				return err
			}
		case <-idle.C:
			in.asm.flushSnapshot() // a quiet stream: release a partial snapshot batch
			in.takeAssembled()
			if err := in.emit(ctx, out); err != nil {
				return err
			}
			if time.Since(lastWarn) > 10*time.Second {
				if msg := in.asm.stuck(10 * time.Second); msg != "" {
					in.log.Warn("waiting for transaction events (is a table or transaction topic not consumed?)", "detail", msg)
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

// batchPool keeps decoded batches for reuse: their records are large, and
// a stream at full speed fills thousands of batches a second.
type batchPool struct{ p sync.Pool }

func (bp *batchPool) get(first cdc.Message) *decodedBatch {
	b, _ := bp.p.Get().(*decodedBatch)
	if b == nil {
		b = &decodedBatch{}
	}
	b.msgs, b.ready = append(b.msgs[:0], first), make(chan struct{})
	return b
}

// put takes back a batch whose records were all assembled (the assembler
// copies them).
func (bp *batchPool) put(b *decodedBatch) {
	clear(b.msgs)
	clear(b.recs)
	clear(b.errs)
	bp.p.Put(b)
}

// maxDecodeBatch bounds a batch; a batch takes only what is already queued,
// so a quiet stream is decoded message by message without waiting.
const maxDecodeBatch = 256

// decodeAhead decodes messages on every core and hands the batches back in
// source order. JSON decoding is the sink's largest cost, and messages
// decode independently; assembly stays sequential. A message that names a
// table created by an earlier one fails here and is decoded again in order
// (decodeOne).
func (in *intake) decodeAhead(ctx context.Context, msgs <-chan cdc.Message) <-chan *decodedBatch {
	workers := runtime.GOMAXPROCS(0)
	ordered := make(chan *decodedBatch, 2*workers)
	work := make(chan *decodedBatch, workers)
	for range workers {
		go func() {
			dec := cdc.NewDecoder(tablesOf{in.s.cfg.Catalog}, in.log, in.s.cfg.Decoder)
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
			b := in.batches.get(m)
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
			b.recs, b.errs = resized(b.recs, len(b.msgs)), resized(b.errs, len(b.msgs))
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
func (in *intake) decodeOne(ctx context.Context, m cdc.Message, rec cdc.Record, err error) error {
	if err != nil {
		if rec, err = in.redecode(ctx, m); err != nil {
			return in.badInput(m, err)
		}
	}
	if rec.Kind == cdc.Skip {
		in.s.skipped.Add(1)
		in.handled(m.Pos)
		return nil
	}
	if rec.TxID != "" && in.applied[rec.TxID] {
		in.handled(m.Pos) // part of a transaction applied before the restart
		return nil
	}
	if in.s.cfg.BadInput == DeadLetter {
		raw := m       // a copy: taking m's address would move every message to the heap
		rec.Raw = &raw // kept to write the whole transaction if it is set aside
	}
	if in.contiguous {
		if took, err := in.inParts(rec); err != nil {
			return fmt.Errorf("sink: %s: %w", m.Pos, err)
		} else if took {
			return nil
		}
	}
	if err := in.asm.add(rec); err != nil {
		return fmt.Errorf("sink: %s: %w", m.Pos, err)
	}
	if dup := in.asm.takeDropped(); len(dup) > 0 {
		in.cur.items = append(in.cur.items, intakeItem{handled: dup})
	}
	return nil
}

// redecode decodes a message that failed ahead of its turn, creating the
// table it names first when the message carries the schema for it.
func (in *intake) redecode(ctx context.Context, m cdc.Message) (cdc.Record, error) {
	rec, err := in.dec.Decode(m)
	var ut *cdc.UnknownTableError
	if !errors.As(err, &ut) {
		return rec, err
	}
	if _, cerr := in.s.cfg.Catalog.CreateTable(ctx, ut.Table, ut.Schema); cerr != nil && !errors.Is(cerr, catalog.ErrExists) {
		return rec, fmt.Errorf("sink: %s: create table %s from the message schema: %w", ut.Pos, ut.Table, cerr)
	} else if cerr == nil {
		in.log.Info("created table from the change-event schema", "table", ut.Table, "columns", len(ut.Schema.Columns))
	}
	return in.dec.Decode(m)
}

func (in *intake) handled(ps ...cdc.Position) {
	in.cur.items = append(in.cur.items, intakeItem{handled: ps})
}

// badInput applies the policy to a message that cannot be decoded.
func (in *intake) badInput(m cdc.Message, err error) error {
	if in.s.cfg.BadInput != DeadLetter {
		return err
	}
	if werr := in.s.dead.writeMessage(m, err); werr != nil {
		return fmt.Errorf("sink: %w, for: %w", werr, err)
	}
	in.s.deadDecoded.Add(1)
	in.log.Warn("message dead-lettered", "position", m.Pos.String(), "reason", err)
	in.handled(m.Pos)
	return nil
}

// takeAssembled turns completed source transactions into proposals.
func (in *intake) takeAssembled() {
	for _, tx := range in.asm.take() {
		t, err := in.toTxn(tx)
		in.asm.recycle(tx.Changes) // the operations hold what replay needs
		if err != nil {
			// A change the catalog cannot place: the transaction is bad input
			// as a whole. Propose it without operations but failing, so the
			// policy applies to it like to any other.
			t = mirror.Txn{Source: in.source, ID: tx.ID, Positions: tx.Positions, Raw: tx.Raw, Invalid: err}
		}
		in.cur.items = append(in.cur.items, intakeItem{txn: &t})
	}
}

// toTxn turns a source transaction into operations per bucket. The
// operations are worked out into scratch space first, then laid out by
// bucket in one allocation.
func (in *intake) toTxn(tx Txn) (mirror.Txn, error) {
	const allBuckets = -1 // a truncate goes to every bucket
	buckets := in.s.cfg.Buckets
	t := mirror.Txn{Source: in.source, ID: tx.ID, Positions: tx.Positions, Rows: len(tx.Changes), Raw: tx.Raw}
	snap := in.s.cfg.Catalog.Snapshot()
	ops, where := in.ops[:0], in.where[:0]
	count := make([]int, buckets)
	for _, c := range tx.Changes {
		t.SourceMS = max(t.SourceMS, c.SourceTSms)
		tb, ok := snap.Table(c.Table)
		if !ok {
			return t, fmt.Errorf("%s: table %s is not in the catalog", c.Pos, c.Table)
		}
		if c.Op == cdc.OpTruncate {
			ops, where = append(ops, change.Op{Table: tb.ID, Kind: change.Truncate}), append(where, allBuckets)
			for b := range count {
				count[b]++
			}
			continue
		}
		from, key := len(ops), in.keyOf(tb)
		var err error
		if ops, err = appendOps(ops, c, tb, key.cols); err != nil {
			return t, fmt.Errorf("%s: %w", c.Pos, err)
		}
		for _, op := range ops[from:] {
			b, err := in.bucket(tb, key, op)
			if err != nil {
				return t, fmt.Errorf("%s: %w", c.Pos, err)
			}
			where = append(where, b)
			count[b]++
		}
	}
	in.ops, in.where = ops, where
	total := 0
	for _, n := range count {
		total += n
	}
	all := make([]change.Op, total)
	start := make([]int, buckets) // where each bucket's run begins in all
	for b, at := 0, 0; b < buckets; b++ {
		start[b], at = at, at+count[b]
	}
	next := slices.Clone(start)
	for i, op := range ops {
		if where[i] == allBuckets {
			for b := range next {
				all[next[b]] = op
				next[b]++
			}
			continue
		}
		all[next[where[i]]] = op
		next[where[i]]++
	}
	clear(ops) // the scratch must not keep rows alive
	for b := range count {
		if count[b] > 0 {
			t.Ops = append(t.Ops, change.BucketOps{Bucket: b, Ops: all[start[b] : start[b]+count[b] : start[b]+count[b]]})
		}
	}
	return t, nil
}

// appendOps maps one change to replay operations, appended to dst; a
// primary-key change becomes a delete of the old key and an insert of the
// new one, and a snapshot read is an upsert (a re-snapshot overwrites the
// row). keys are the table's key column positions.
func appendOps(dst []change.Op, c cdc.Record, t *catalog.Table, keys []int) ([]change.Op, error) {
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
	if t.Schema.GeneratedKey && c.Key == nil && (c.Op == cdc.OpDelete || c.Op == cdc.OpUpdate) {
		// The source does not know the key Retina made up: the row is the
		// one whose other columns equal the before image.
		if c.Before == nil {
			return dst, fmt.Errorf("%s of a row of %s without a key carries no before image to find the row by", opName(c.Op), t.Name)
		}
		if c.Op == cdc.OpDelete {
			return append(dst, change.Op{Table: t.ID, Kind: change.Delete, Before: c.Before, ByContent: true, Unmatched: c.Unmatched}), nil
		}
		if len(c.Unchanged) > 0 {
			return dst, fmt.Errorf("update of a row of %s without a key leaves columns unsent", t.Name)
		}
		return append(dst, change.Op{Table: t.ID, Kind: change.Update, Row: c.After, Before: c.Before, ByContent: true, Unmatched: c.Unmatched}), nil
	}
	switch c.Op {
	case cdc.OpCreate:
		return append(dst, change.Op{Table: t.ID, Kind: change.Insert, Row: c.After}), nil
	case cdc.OpRead:
		return append(dst, change.Op{Table: t.ID, Kind: change.Upsert, Row: c.After}), nil
	case cdc.OpDelete:
		key := c.Key
		if key == nil {
			key = pick(c.Before)
		}
		return append(dst, change.Op{Table: t.ID, Kind: change.Delete, Key: key, Before: c.Before}), nil
	case cdc.OpUpdate:
		newKey := pick(c.After)
		oldKey := c.Key
		if c.Before != nil {
			oldKey = pick(c.Before) // the key in the message is the new one
		}
		if oldKey == nil {
			oldKey = newKey
		}
		if len(c.Unchanged) > 0 {
			// The current version is read in the key's bucket; a moved row's
			// new key may belong to another.
			if !sameKey(oldKey, newKey) {
				return dst, fmt.Errorf("update of %s changes the primary key and leaves columns unsent: the new row cannot be completed", t.Name)
			}
			return append(dst, change.Op{Table: t.ID, Kind: change.Update, Key: newKey, Row: c.After, Before: c.Before, Unchanged: c.Unchanged}), nil
		}
		if !sameKey(oldKey, newKey) {
			return append(dst,
				change.Op{Table: t.ID, Kind: change.Delete, Key: oldKey, Before: c.Before},
				change.Op{Table: t.ID, Kind: change.Insert, Row: c.After},
			), nil
		}
		return append(dst, change.Op{Table: t.ID, Kind: change.Update, Key: newKey, Row: c.After, Before: c.Before}), nil
	}
	return dst, fmt.Errorf("op %c", c.Op)
}

func opName(op cdc.Op) string {
	if op == cdc.OpDelete {
		return "delete"
	}
	return "update"
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

// tableKey is a table's primary key: its column positions and types.
type tableKey struct {
	cols  []int
	types []types.Type
}

// keyOf returns t's primary key, worked out once per table version (a
// schema change makes a new *Table).
func (in *intake) keyOf(t *catalog.Table) *tableKey {
	k, ok := in.keys[t]
	if !ok {
		k = &tableKey{cols: t.Schema.KeyColumns()}
		for _, c := range k.cols {
			k.types = append(k.types, t.Schema.Columns[c].Type)
		}
		if len(in.keys) >= 1024 {
			clear(in.keys)
		}
		in.keys[t] = k
	}
	return k
}

// bucket hashes an operation's primary key.
func (in *intake) bucket(t *catalog.Table, key *tableKey, op change.Op) (int, error) {
	if t.Schema.GeneratedKey {
		return replay.BucketFor(t, nil, in.s.cfg.Buckets), nil
	}
	vals := op.Key
	if op.Kind == change.Insert || op.Kind == change.Upsert || vals == nil {
		vals = in.keyVals[:0]
		for _, k := range key.cols {
			if k >= len(op.Row) {
				return 0, fmt.Errorf("row of %s has %d values", t.Name, len(op.Row))
			}
			vals = append(vals, op.Row[k])
		}
		in.keyVals = vals[:0]
	}
	enc, err := index.AppendKey(in.keyBuf[:0], t.PrimaryIndexID, key.types, vals)
	if err != nil {
		return 0, fmt.Errorf("primary key of %s: %w", t.Name, err)
	}
	in.keyBuf = enc[:0]
	return replay.BucketOf(enc, in.s.cfg.Buckets), nil
}

// resized returns s with length n, reusing its array when it is big enough.
func resized[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}
