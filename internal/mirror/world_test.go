package mirror

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/retinadb/retina/internal/change"
)

// A world runs a Core against simulated surroundings, the way the sink
// drives it for real: buckets that apply operations to a versioned
// key-value store (keeping undo records and rolling back), a transaction
// service that grants, commits and aborts timestamps and keeps HWM, and a
// source of transactions that can be re-read after a restart. Scripts and
// the model test drive it with the same commands, and every command checks
// the visible state against an oracle that applies the source's
// transactions one by one.

// srcTxn is one transaction of the source.
type srcTxn struct {
	id  string
	ops []fakeOp
	at  int64 // offset of its first message; it has len(ops)+1 (END)
}

// invalidOp marks a change the sink could not turn into an operation.
const invalidOp change.OpKind = 99

type fakeOp struct {
	kind change.OpKind
	key  int64
	val  int64
}

func (o fakeOp) String() string {
	switch o.kind {
	case invalidOp:
		return "invalid"
	case change.Truncate:
		return "truncate"
	case change.Delete:
		return fmt.Sprintf("delete %d", o.key)
	}
	return fmt.Sprintf("%s %d=%d", o.kind, o.key, o.val)
}

func (t srcTxn) positions() []change.Position {
	ps := make([]change.Position, len(t.ops)+1)
	for i := range ps {
		ps[i] = change.Position{Stream: "s", Offset: t.at + int64(i)}
	}
	return ps
}

type version struct {
	ts   uint64
	val  int64
	dead bool
}

type bucketItem struct {
	send     *Send
	rollback uint64
}

type fakeBucket struct {
	queue     []bucketItem
	failed    bool
	undo      []undoRec
	breakNext bool // the next send fails as a system error
}

type undoRec struct {
	key int64
	ts  uint64
}

type world struct {
	cfg    Config
	core   *Core
	source []srcTxn // what the source holds, in commit order
	cursor int      // next source transaction to deliver
	parts  int      // propose transactions of two or more operations in up to this many parts
	later  []Txn    // parts of the last transaction not proposed yet
	readTo int      // source transactions before it were read (their messages seen)
	ids    map[string]int

	store   map[int64][]version
	buckets []*fakeBucket

	// the transaction service
	next      uint64
	done      map[uint64]bool
	hwm       uint64
	requested int
	pending   []svcOp // commits and aborts, in order
	txnAt     map[uint64]string

	committed    map[string]int  // source txn id → commits the service carried out
	decided      map[string]bool // source txn id → its commit was decided
	deadLettered map[string]bool
	checkpoints  []change.Checkpoint
	finished     bool
	finishErr    error
	out          *strings.Builder

	// Replay checkpoints: the one being written and the last durable one.
	writing, durable *saved
}

// saved is a replay checkpoint of the world: the store as of its timestamp
// and what had been resolved by then.
type saved struct {
	ts           uint64
	sources      []change.Checkpoint
	store        map[int64][]version
	committed    map[string]int
	decided      map[string]bool
	deadLettered map[string]bool
}

type svcOp struct {
	commit bool
	ts     []uint64
}

func newWorld(cfg Config) (*world, error) {
	if len(cfg.Start) == 0 {
		cfg.Start = []change.Checkpoint{{}}
	}
	c, err := New(cfg)
	if err != nil {
		return nil, err
	}
	w := &world{cfg: cfg, core: c, ids: map[string]int{}, store: map[int64][]version{},
		next: 1, done: map[uint64]bool{}, hwm: 1, txnAt: map[uint64]string{},
		committed: map[string]int{}, decided: map[string]bool{}, deadLettered: map[string]bool{}, out: &strings.Builder{}}
	for range cfg.Buckets {
		w.buckets = append(w.buckets, &fakeBucket{})
	}
	return w, nil
}

// event feeds one event to the core, logs it and carries out the Ready.
func (w *world) event(desc string, f func() error) {
	fmt.Fprintf(w.out, "> %s\n", desc)
	if err := f(); err != nil {
		fmt.Fprintf(w.out, "error: %v\n", err)
	}
	w.exec(w.core.Ready())
}

func (w *world) exec(r Ready) {
	w.out.WriteString(r.String())
	for _, d := range r.DeadLetters {
		w.deadLettered[d.Txn.ID] = true
	}
	if len(r.Commit) > 0 {
		w.pending = append(w.pending, svcOp{commit: true, ts: r.Commit})
		for _, t := range r.Commit {
			w.decided[w.txnAt[t]] = true
		}
	}
	if len(r.Abort) > 0 {
		w.pending = append(w.pending, svcOp{ts: r.Abort})
	}
	for i := range r.Sends {
		s := r.Sends[i]
		w.txnAt[s.TS] = s.TxnID
		w.buckets[s.Bucket].queue = append(w.buckets[s.Bucket].queue, bucketItem{send: &s})
	}
	if r.Rollback != 0 {
		for _, b := range w.buckets {
			b.queue = append(b.queue, bucketItem{rollback: r.Rollback})
		}
	}
	w.requested += r.Request
	if r.Checkpoint != nil {
		w.checkpoints = r.Checkpoint
	}
	if p := r.Persist; p != nil {
		// Nothing is in flight: the store is the state at p.TS.
		w.writing = w.save(p.TS, p.Sources)
		w.event(fmt.Sprintf("sealed ts=%d", p.TS), func() error { return w.core.Sealed(p.TS, nil) })
	}
	if r.Done {
		w.finished, w.finishErr = true, r.Err
	}
}

// deliver reads the next source transaction and proposes it.
func (w *world) deliver() bool {
	if len(w.later) > 0 { // the next part, after whatever happened since the last
		part := w.later[0]
		w.later = w.later[1:]
		w.event(fmt.Sprintf("propose %s part %d", part.ID, part.Part), func() error { return w.core.Propose(part) })
		return true
	}
	if w.cursor >= len(w.source) || !w.core.CanPropose() {
		return false
	}
	t := w.source[w.cursor]
	w.cursor++
	txn := Txn{ID: t.id, Positions: t.positions(), Rows: len(t.ops)}
	perBucket := map[int][]change.Op{}
	for _, o := range t.ops {
		if o.kind == invalidOp {
			txn.Invalid = errors.New("table gone is not in the catalog")
			continue
		}
		if o.kind == change.Truncate {
			for b := range w.cfg.Buckets {
				perBucket[b] = append(perBucket[b], change.Op{Kind: o.kind})
			}
			continue
		}
		b := int(o.key) % w.cfg.Buckets
		perBucket[b] = append(perBucket[b], change.Op{Kind: o.kind, Key: []any{o.key}, Row: []any{o.key, o.val}})
	}
	for _, b := range slices.Sorted(maps.Keys(perBucket)) {
		txn.Ops = append(txn.Ops, change.BucketOps{Bucket: b, Ops: perBucket[b]})
	}
	if w.readTo < w.cursor {
		w.event(fmt.Sprintf("read %s", posList(txn.Positions)), func() error { return w.core.Read(0, txn.Positions) })
		w.readTo = w.cursor
	}
	if n := min(w.parts, len(t.ops)); n > 1 && txn.Invalid == nil {
		parts := splitTxn(txn, t, n, w.cfg.Buckets)
		w.later = parts[1:]
		w.event(fmt.Sprintf("propose %s part 0", t.id), func() error { return w.core.Propose(parts[0]) })
		return true
	}
	w.event(fmt.Sprintf("propose %s", t.id), func() error { return w.core.Propose(txn) })
	return true
}

// splitTxn cuts a transaction into n parts by operation order, as a driver
// proposing a large transaction while it arrives does; the last part
// carries the END's position.
func splitTxn(txn Txn, t srcTxn, n, buckets int) []Txn {
	parts := make([]Txn, n)
	per := (len(t.ops) + n - 1) / n
	cursor := map[int]int{} // per bucket: operations handed out so far
	for i := range parts {
		from, to := min(i*per, len(t.ops)), min((i+1)*per, len(t.ops))
		p := Txn{ID: txn.ID, Part: i, Open: i < n-1, Rows: to - from, Positions: txn.Positions[from:to]}
		if i == n-1 {
			p.Positions = txn.Positions[from:]
		}
		counts := map[int]int{}
		for _, o := range t.ops[from:to] {
			if o.kind == change.Truncate {
				for b := range buckets {
					counts[b]++
				}
				continue
			}
			counts[int(o.key)%buckets]++
		}
		for _, bo := range txn.Ops {
			if k := counts[bo.Bucket]; k > 0 {
				c := cursor[bo.Bucket]
				p.Ops = append(p.Ops, change.BucketOps{Bucket: bo.Bucket, Ops: bo.Ops[c : c+k]})
				cursor[bo.Bucket] = c + k
			}
		}
		parts[i] = p
	}
	return parts
}

// peek reads the messages of the next transaction not read yet without
// proposing it, as when its END has not arrived.
func (w *world) peek() bool {
	if w.readTo >= len(w.source) {
		return false
	}
	ps := w.source[w.readTo].positions()
	w.readTo++
	w.event(fmt.Sprintf("read %s", posList(ps)), func() error { return w.core.Read(0, ps) })
	return true
}

func posList(ps []change.Position) string {
	if len(ps) == 0 {
		return ""
	}
	return fmt.Sprintf("%s..%d", ps[0], ps[len(ps)-1].Offset)
}

// grant answers the outstanding timestamp request.
func (w *world) grant() bool {
	if w.requested == 0 {
		return false
	}
	n, first := w.requested, w.next
	w.requested = 0
	w.next += uint64(n)
	w.event(fmt.Sprintf("grant first=%d n=%d", first, n), func() error { return w.core.Grant(first, n) })
	return true
}

// step lets bucket b handle one queued item.
func (w *world) step(b int) bool {
	fb := w.buckets[b]
	if len(fb.queue) == 0 {
		return false
	}
	it := fb.queue[0]
	fb.queue = fb.queue[1:]
	if it.send == nil {
		w.undo(fb, it.rollback)
		fb.failed = false
		w.event(fmt.Sprintf("rolled-back b=%d from=%d", b, it.rollback), func() error { return w.core.RolledBack(b, it.rollback, nil) })
		return true
	}
	if fb.failed {
		return true // skipped until the rollback comes
	}
	s := it.send
	if fb.breakNext {
		fb.breakNext, fb.failed = false, true
		err := errors.New("disk full")
		w.event(fmt.Sprintf("failed b=%d ts=%d system err=%q", b, s.TS, err), func() error { return w.core.Failed(b, s.TS, err, true) })
		return true
	}
	for _, op := range s.Ops {
		if err := w.apply(fb, b, s.TS, op); err != nil {
			fb.failed = true
			w.event(fmt.Sprintf("failed b=%d ts=%d err=%q", b, s.TS, err), func() error { return w.core.Failed(b, s.TS, err, false) })
			return true
		}
	}
	w.event(fmt.Sprintf("applied b=%d through=%d", b, s.TS), func() error { return w.core.AppliedSends(b, 1) })
	return true
}

func (w *world) live(key int64, ts uint64) bool {
	vs := w.store[key]
	for i := len(vs) - 1; i >= 0; i-- {
		if vs[i].ts <= ts {
			return !vs[i].dead
		}
	}
	return false
}

func (w *world) put(fb *fakeBucket, key int64, v version) {
	vs := w.store[key]
	if n := len(vs); n > 0 && vs[n-1].ts == v.ts {
		vs[n-1] = v
	} else {
		vs = append(vs, v)
	}
	w.store[key] = vs
	fb.undo = append(fb.undo, undoRec{key, v.ts})
}

func (w *world) apply(fb *fakeBucket, b int, ts uint64, op change.Op) error {
	if op.Kind == change.Truncate {
		for _, k := range slices.Sorted(maps.Keys(w.store)) {
			if int(k)%w.cfg.Buckets == b && w.live(k, ts) {
				w.put(fb, k, version{ts: ts, dead: true})
			}
		}
		return nil
	}
	k := op.Key[0].(int64)
	live := w.live(k, ts)
	switch op.Kind {
	case change.Insert:
		if live {
			return fmt.Errorf("insert of key %d: live", k)
		}
	case change.Update, change.Delete:
		if !live {
			return fmt.Errorf("%s of key %d: no live row", op.Kind, k)
		}
	}
	if op.Kind == change.Delete {
		w.put(fb, k, version{ts: ts, dead: true})
	} else {
		w.put(fb, k, version{ts: ts, val: op.Row[1].(int64)})
	}
	return nil
}

// undo removes the bucket's versions at or above from.
func (w *world) undo(fb *fakeBucket, from uint64) {
	kept := fb.undo[:0]
	for _, u := range fb.undo {
		if u.ts < from {
			kept = append(kept, u)
			continue
		}
		vs := w.store[u.key]
		if i := slices.IndexFunc(vs, func(v version) bool { return v.ts == u.ts }); i >= 0 {
			vs = slices.Delete(vs, i, i+1)
		}
		if len(vs) == 0 {
			delete(w.store, u.key)
		} else {
			w.store[u.key] = vs
		}
	}
	fb.undo = kept
}

// ack lets the transaction service carry out one pending commit or abort.
func (w *world) ack() bool {
	if len(w.pending) == 0 {
		return false
	}
	op := w.pending[0]
	w.pending = w.pending[1:]
	for _, t := range op.ts {
		w.done[t] = true
	}
	for w.done[w.hwm] {
		delete(w.done, w.hwm)
		w.hwm++
	}
	if !op.commit {
		return true
	}
	for _, t := range op.ts {
		w.committed[w.txnAt[t]]++
	}
	w.event(fmt.Sprintf("committed %s", tsList(op.ts)), func() error { return w.core.Committed(op.ts) })
	return true
}

func (w *world) tick() {
	lwm := w.hwm - 1
	w.event(fmt.Sprintf("tick lwm=%d", lwm), func() error { w.core.Tick(lwm); return nil })
}

// run drives everything until nothing moves: deliver, grant, every bucket
// in order, acknowledgements. A run that never settles is a livelock.
func (w *world) run() error {
	for rounds := 0; !w.finished; rounds++ {
		if rounds > 100*(len(w.source)+10) {
			return fmt.Errorf("no end after %d rounds: livelock", rounds)
		}
		moved := w.grant()
		for b := range w.buckets {
			for w.step(b) {
				moved = true
			}
		}
		for w.ack() {
			moved = true
		}
		if !moved && !w.deliver() {
			return nil
		}
	}
	return nil
}

// restart stops the core cleanly, keeps its checkpoint and the store (the
// replay state survives a clean stop) and starts a new core that reads the
// source from rewind transactions before the first one not applied.
func (w *world) restart(rewind int) error {
	if !w.finished {
		w.event("drain", func() error { w.core.Drain(nil); return nil })
		if err := w.run(); err != nil {
			return err
		}
	}
	if !w.finished {
		return errors.New("the core did not finish draining")
	}
	for w.ack() { // aborts the driver hands the service before it returns
	}
	if w.finishErr != nil && errors.Is(w.finishErr, ErrUnclean) {
		return fmt.Errorf("unclean stop: %v", w.finishErr)
	}
	cps := w.core.Checkpoints()
	fmt.Fprintf(w.out, "> restart from %s\n", cps[0])
	cfg := w.cfg
	cfg.Start = cps
	c, err := New(cfg)
	if err != nil {
		return err
	}
	w.core, w.finished, w.finishErr, w.requested = c, false, nil, 0
	w.pending, w.writing = nil, nil
	for _, b := range w.buckets {
		b.queue, b.failed = nil, false
	}
	// A clean stop leaves a checkpoint of everything.
	w.durable = w.save(w.hwm-1, cps)
	w.rewindTo(cps, rewind)
	return nil
}

// save copies the world's replay state for a checkpoint.
func (w *world) save(ts uint64, sources []change.Checkpoint) *saved {
	st := make(map[int64][]version, len(w.store))
	for k, vs := range w.store {
		st[k] = slices.Clone(vs)
	}
	return &saved{ts: ts, sources: sources, store: st, committed: maps.Clone(w.committed),
		decided: maps.Clone(w.decided), deadLettered: maps.Clone(w.deadLettered)}
}

// persisted finishes writing the checkpoint under way.
func (w *world) persisted() {
	if w.writing == nil {
		return
	}
	cp := w.writing
	w.writing = nil
	w.event(fmt.Sprintf("persisted ts=%d", cp.ts), func() error {
		if err := w.core.Persisted(cp.ts, nil); err != nil {
			return err
		}
		w.durable = cp
		return nil
	})
}

// crash kills the process: everything not in the last durable checkpoint
// is gone, the transaction service starts above every old timestamp, and a
// new core reads the source from the checkpoint (rewind transactions
// earlier, as a redelivery would).
func (w *world) crash(rewind int) error {
	cp := w.durable
	if cp == nil {
		cp = &saved{store: map[int64][]version{}, committed: map[string]int{}, decided: map[string]bool{}, deadLettered: map[string]bool{}}
	}
	w.store = make(map[int64][]version, len(cp.store))
	for k, vs := range cp.store {
		w.store[k] = slices.Clone(vs)
	}
	w.committed, w.decided, w.deadLettered = maps.Clone(cp.committed), maps.Clone(cp.decided), maps.Clone(cp.deadLettered)
	w.hwm, w.done, w.pending, w.requested, w.writing = w.next, map[uint64]bool{}, nil, 0, nil
	for _, b := range w.buckets {
		b.queue, b.failed, b.undo = nil, false, nil
	}
	cfg := w.cfg
	cfg.Start = cp.sources
	cfg.RedoUpTo = w.core.CommittedOffsets()
	if len(cfg.Start) == 0 {
		cfg.Start = []change.Checkpoint{{}}
	}
	c, err := New(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(w.out, "> crash: restart from the checkpoint at %d\n", cp.ts)
	w.core, w.finished, w.finishErr = c, false, nil
	w.rewindTo(cp.sources, rewind)
	return nil
}

// rewindTo points the source at the first transaction a checkpoint does
// not cover, rewind transactions earlier.
func (w *world) rewindTo(sources []change.Checkpoint, rewind int) {
	resume := int64(0)
	if len(sources) > 0 {
		resume = sources[0].Resume["s"]
	}
	w.cursor = 0
	for w.cursor < len(w.source) && w.source[w.cursor].at+int64(len(w.source[w.cursor].ops)) < resume {
		w.cursor++
	}
	w.cursor = max(0, w.cursor-rewind)
	w.readTo = w.cursor
	w.later = nil // a transaction cut short is read again whole
}

// visible is the state at snapshot HWM − 1.
func (w *world) visible() map[int64]int64 {
	out := map[int64]int64{}
	for k, vs := range w.store {
		for i := len(vs) - 1; i >= 0; i-- {
			if vs[i].ts < w.hwm {
				if !vs[i].dead {
					out[k] = vs[i].val
				}
				break
			}
		}
	}
	return out
}

// oracle applies the source's transactions one by one up to the first one
// not yet resolved (committed or set aside), as the policy says.
func (w *world) oracle() (state map[int64]int64, resolved int, failedAt string) {
	state = map[int64]int64{}
	for i, t := range w.source {
		if w.committed[t.id] == 0 && !w.deadLettered[t.id] {
			return state, i, failedAt
		}
		next, ok := applySource(state, t)
		if ok {
			state = next
		} else if failedAt == "" {
			failedAt = t.id
		}
	}
	return state, len(w.source), failedAt
}

func hasKey(m map[int64]int64, k int64) bool { _, ok := m[k]; return ok }

// applySource applies a source transaction's operations to a copy of
// state; ok is false when one of them cannot be applied.
func applySource(state map[int64]int64, t srcTxn) (next map[int64]int64, ok bool) {
	next, ok = maps.Clone(state), true
	for _, o := range t.ops {
		switch {
		case o.kind == change.Truncate:
			clear(next)
		case o.kind == invalidOp, o.kind == change.Insert && hasKey(next, o.key),
			(o.kind == change.Update || o.kind == change.Delete) && !hasKey(next, o.key):
			ok = false
		case o.kind == change.Delete:
			delete(next, o.key)
		default:
			next[o.key] = o.val
		}
	}
	return next, ok
}

// check compares the world with the oracle; it returns what is wrong.
func (w *world) check() error {
	for id, n := range w.committed {
		if n > 1 {
			return fmt.Errorf("transaction %s committed %d times", id, n)
		}
		if w.deadLettered[id] {
			return fmt.Errorf("transaction %s committed and set aside", id)
		}
	}
	want, resolved, failedAt := w.oracle()
	// A transaction the oracle says cannot be applied is never committed,
	// and under the fail policy nothing after it is either.
	for i, t := range w.source {
		if w.committed[t.id] == 0 {
			continue
		}
		if !w.appliesAfter(i, w.isCommitted) {
			return fmt.Errorf("transaction %s cannot be applied but committed", t.id)
		}
		if w.cfg.Policy == Fail && failedAt != "" && i > w.ids[failedAt] {
			return fmt.Errorf("transaction %s committed after %s failed under the fail policy", t.id, failedAt)
		}
	}
	for i, t := range w.source {
		if !w.deadLettered[t.id] {
			continue
		}
		if w.cfg.Policy == Fail {
			return fmt.Errorf("transaction %s set aside under the fail policy", t.id)
		}
		if w.appliesAfter(i, func(id string) bool { return w.decided[id] }) {
			return fmt.Errorf("transaction %s set aside, but it applies", t.id)
		}
	}
	if got := w.visible(); !maps.Equal(got, want) {
		return fmt.Errorf("visible at %d: %v, oracle after %d source transactions: %v", w.hwm-1, got, resolved, want)
	}
	return nil
}

func (w *world) isCommitted(id string) bool { return w.committed[id] > 0 }

// appliesAfter reports whether source transaction i applies to the state
// that the transactions before it for which in holds leave.
func (w *world) appliesAfter(i int, in func(id string) bool) bool {
	state := map[int64]int64{}
	for j := 0; j <= i; j++ {
		t := w.source[j]
		if j < i && !in(t.id) {
			continue
		}
		next, ok := applySource(state, t)
		if j == i {
			return ok
		}
		state = next
	}
	return true
}

// parseOp reads "insert 1=10", "update 1=11", "upsert 1=12", "delete 1",
// "truncate".
func parseOp(line string) (fakeOp, error) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return fakeOp{}, errors.New("empty op")
	}
	kinds := map[string]change.OpKind{"invalid": invalidOp, "insert": change.Insert, "update": change.Update, "upsert": change.Upsert,
		"delete": change.Delete, "truncate": change.Truncate}
	k, ok := kinds[f[0]]
	if !ok {
		return fakeOp{}, fmt.Errorf("unknown op %q", f[0])
	}
	op := fakeOp{kind: k}
	if k == change.Truncate || k == invalidOp {
		return op, nil
	}
	if len(f) != 2 {
		return op, fmt.Errorf("op %q: want KIND KEY[=VALUE]", line)
	}
	ks, vs, hasVal := strings.Cut(f[1], "=")
	var err error
	if op.key, err = strconv.ParseInt(ks, 10, 64); err != nil || op.key < 0 {
		return op, fmt.Errorf("op %q: bad key", line)
	}
	if k != change.Delete {
		if !hasVal {
			return op, fmt.Errorf("op %q: needs a value", line)
		}
		if op.val, err = strconv.ParseInt(vs, 10, 64); err != nil {
			return op, fmt.Errorf("op %q: bad value", line)
		}
	}
	return op, nil
}
