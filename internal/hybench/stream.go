package hybench

import (
	"strconv"
	"time"
)

// RowsPerTxn is the size the generator aims each transaction at; HyBench's
// change transactions average about 10 rows.
const RowsPerTxn = 10

// maxMove caps one transfer, in cents.
const maxMove = 5_000_000

// txnBuilder tracks the transaction being written.
type txnBuilder struct {
	id      string
	tsMS    int64
	now     int64 // µs
	order   int
	tables  []string
	counts  []int
	changes TxnStats
}

func (t *txnBuilder) count(table string) int {
	for i, n := range t.tables {
		if n == table {
			t.counts[i]++
			return t.counts[i]
		}
	}
	t.tables = append(t.tables, table)
	t.counts = append(t.counts, 1)
	return 1
}

// NextTxn appends one change transaction (BEGIN, its row events, END) as
// Debezium JSON lines to dst. now is its commit time: it becomes fresh_ts
// of every row it writes and the source's ts_ms. About 70% of the rows are
// account updates, 25% inserts and 5% deletes; every transaction touches an
// account table first, so the newest fresh_ts of the account tables is the
// newest commit a snapshot includes.
func (g *Generator) NextTxn(dst []byte, now time.Time) ([]byte, TxnStats) {
	g.txns++
	t := &g.tx
	*t = txnBuilder{id: g.cfg.Run + ":" + strconv.FormatUint(g.txns, 10), tsMS: now.UnixMilli(), now: now.UnixMicro(),
		tables: t.tables[:0], counts: t.counts[:0]}
	dst = append(dst, `{"status":"BEGIN","id":"`...)
	dst = append(dst, t.id...)
	dst = append(dst, `","ts_ms":`...)
	dst = strconv.AppendInt(dst, t.tsMS, 10)
	dst = append(dst, ",\"event_count\":null,\"data_collections\":null}\n"...)
	for first := true; t.changes.Rows < RowsPerTxn; first = false {
		dst = g.op(dst, first)
	}
	dst = append(dst, `{"status":"END","id":"`...)
	dst = append(dst, t.id...)
	dst = append(dst, `","ts_ms":`...)
	dst = strconv.AppendInt(dst, t.tsMS, 10)
	dst = append(dst, `,"event_count":`...)
	dst = strconv.AppendInt(dst, int64(t.changes.Rows), 10)
	dst = append(dst, `,"data_collections":[`...)
	for i, name := range t.tables {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"data_collection":"hybench.`...)
		dst = append(dst, name...)
		dst = append(dst, `","event_count":`...)
		dst = strconv.AppendInt(dst, int64(t.counts[i]), 10)
		dst = append(dst, '}')
	}
	dst = append(dst, "]}\n"...)
	g.stats.add(t.changes)
	return dst, t.changes
}

// op appends one business operation. Weights: transfer between saving
// accounts 24%, checking payment 18%, move between a user's saving and
// checking account 30%, loan application 10%, loan approval 4%, history
// purge 14%.
func (g *Generator) op(dst []byte, first bool) []byte {
	p := g.rng.IntN(100)
	if first {
		p = g.rng.IntN(72) // an account operation
	}
	switch {
	case p < 24:
		return g.transfer(dst, &g.transfers, g.saving)
	case p < 42:
		return g.transfer(dst, &g.checkings, g.checking)
	case p < 72:
		return g.move(dst)
	case p < 82:
		return g.loanApply(dst)
	case p < 86:
		return g.loanApprove(dst)
	default:
		return g.purge(dst)
	}
}

// transfer moves money between two accounts of one table and records it
// in h.
func (g *Generator) transfer(dst []byte, h *history, accts []account) []byte {
	a := g.rng.IntN(len(accts))
	b := g.rng.IntN(len(accts))
	amt := g.rng.Int64N(min(accts[a].balance, maxMove) + 1)
	acctTable := SavingAccount
	if h.name == Checking {
		acctTable = CheckingAccount
	}
	dst = g.moveBalance(dst, acctTable, accts, a, -amt)
	dst = g.moveBalance(dst, acctTable, accts, b, amt)
	m := movement{source: int64(a + 1), target: int64(b + 1), amount: amt,
		kind: moveTypes[g.rng.IntN(len(moveTypes))], ts: g.tx.now, fresh: g.tx.now}
	id := h.add(m, g.cfg.Retain)
	dst = g.appendChange(dst, 'c', h.name, nil, func(b []byte) []byte { return appendMovement(b, id, m) })
	if g.cfg.Retain && h.live() > h.base {
		dst = g.deleteOldest(dst, h)
	}
	return dst
}

// move shifts money between one user's saving and checking accounts: the
// sum over both tables stays, each table's sum changes, so only a
// snapshot with the whole transaction sums right.
func (g *Generator) move(dst []byte) []byte {
	x := g.rng.IntN(len(g.saving))
	from, to, fromTable, toTable := g.saving, g.checking, SavingAccount, CheckingAccount
	if g.rng.IntN(2) == 0 {
		from, to, fromTable, toTable = to, from, toTable, fromTable
	}
	amt := g.rng.Int64N(min(from[x].balance, maxMove) + 1)
	dst = g.moveBalance(dst, fromTable, from, x, -amt)
	return g.moveBalance(dst, toTable, to, x, amt)
}

func (g *Generator) moveBalance(dst []byte, table string, accts []account, i int, delta int64) []byte {
	before := accts[i]
	accts[i].balance += delta
	accts[i].ts, accts[i].fresh = g.tx.now, g.tx.now
	after := accts[i]
	id := int64(i + 1)
	return g.appendChange(dst, 'u', table,
		func(b []byte) []byte { return appendAccount(b, id, before) },
		func(b []byte) []byte { return appendAccount(b, id, after) })
}

func (g *Generator) loanApply(dst []byte) []byte {
	l := loanApp{applicant: 1 + int64(g.rng.IntN(len(g.saving))), amount: 100_000 + g.rng.Int64N(50_000_000),
		duration: durations[g.rng.IntN(len(durations))], ts: g.tx.now, fresh: g.tx.now}
	l.pendingAt = len(g.pending)
	g.loans = append(g.loans, l)
	id := g.loanFirst + int64(len(g.loans)) - 1
	g.pending = append(g.pending, id)
	dst = g.appendChange(dst, 'c', LoanApps, nil, func(b []byte) []byte { return appendLoanApp(b, id, l) })
	if g.cfg.Retain && len(g.loans) > g.sizes.LoanApps {
		dst = g.dropOldestLoan(dst)
	}
	return dst
}

// dropOldestLoan deletes the oldest loan application, with its loan if it
// was accepted (the loan invariant holds in every transaction).
func (g *Generator) dropOldestLoan(dst []byte) []byte {
	id, l := g.loanFirst, g.loans[0]
	g.loans[0] = loanApp{}
	g.loans = g.loans[1:]
	g.loanFirst++
	if l.accepted {
		dst = g.appendChange(dst, 'd', LoanTrans, func(b []byte) []byte {
			return appendLoanTrans(b, l.trans, id, l, l.transTS, l.transFresh)
		}, nil)
	} else {
		g.unpend(l.pendingAt)
	}
	return g.appendChange(dst, 'd', LoanApps, func(b []byte) []byte { return appendLoanApp(b, id, l) }, nil)
}

// unpend removes pending[k] (order does not matter).
func (g *Generator) unpend(k int) {
	last := len(g.pending) - 1
	if k != last {
		g.pending[k] = g.pending[last]
		g.loan(g.pending[k]).pendingAt = k
	}
	g.pending = g.pending[:last]
}

// loanApprove accepts an application and lends: the application's status
// and the loan row change together (the loan invariant).
func (g *Generator) loanApprove(dst []byte) []byte {
	if len(g.pending) == 0 {
		return g.loanApply(dst)
	}
	k := g.rng.IntN(len(g.pending))
	app := g.pending[k]
	g.unpend(k)
	l := g.loan(app)
	before := *l
	id := g.nextLoanTrans
	g.nextLoanTrans++
	l.accepted = true
	l.ts, l.fresh = g.tx.now, g.tx.now
	l.trans, l.transTS, l.transFresh = id, g.tx.now, g.tx.now
	after := *l
	dst = g.appendChange(dst, 'u', LoanApps,
		func(b []byte) []byte { return appendLoanApp(b, app, before) },
		func(b []byte) []byte { return appendLoanApp(b, app, after) })
	return g.appendChange(dst, 'c', LoanTrans, nil, func(b []byte) []byte {
		return appendLoanTrans(b, id, app, after, g.tx.now, g.tx.now)
	})
}

// purge deletes the oldest transfer, or, once those are gone (or in a
// tenth of the cases when history is retained: the tables' size ratio),
// the oldest checking payment. Without retained history only base rows are
// purged; then purges become loan applications.
func (g *Generator) purge(dst []byte) []byte {
	first, second := &g.transfers, &g.checkings
	if g.cfg.Retain && g.rng.IntN(g.sizes.Transfers+g.sizes.Checkings) < g.sizes.Checkings {
		first, second = second, first
	}
	for _, h := range []*history{first, second} {
		if h.purgeable(g.cfg.Retain) {
			return g.deleteOldest(dst, h)
		}
	}
	return g.loanApply(dst)
}

// appendChange appends one row event of the current transaction.
func (g *Generator) appendChange(dst []byte, op byte, table string, before, after func([]byte) []byte) []byte {
	t := &g.tx
	t.order++
	dcOrder := t.count(table)
	t.changes.Rows++
	switch op {
	case 'c':
		t.changes.Inserts++
	case 'u':
		t.changes.Updates++
	case 'd':
		t.changes.Deletes++
	}
	return g.appendEvent(dst, op, table, before, after, t.id, t.order, dcOrder, t.tsMS)
}

// appendEvent appends one Debezium change event line; txID "" means no
// transaction metadata (snapshot events).
func (g *Generator) appendEvent(dst []byte, op byte, table string, before, after func([]byte) []byte, txID string, order, dcOrder int, tsMS int64) []byte {
	image := func(name string, row func([]byte) []byte) {
		dst = append(dst, '"')
		dst = append(dst, name...)
		dst = append(dst, `":`...)
		if row == nil {
			dst = append(dst, "null"...)
			return
		}
		dst = append(dst, '{')
		dst = row(dst)
		dst = append(dst, '}')
	}
	dst = append(dst, '{')
	image("before", before)
	dst = append(dst, ',')
	image("after", after)
	dst = append(dst, `,"source":{"version":"2.7.0.Final","connector":"mysql","name":"hybench","ts_ms":`...)
	dst = strconv.AppendInt(dst, tsMS, 10)
	if txID == "" {
		dst = append(dst, `,"snapshot":"true"`...)
	} else {
		dst = append(dst, `,"snapshot":"false"`...)
	}
	dst = append(dst, `,"db":"hybench","table":"`...)
	dst = append(dst, table...)
	dst = append(dst, `"},"op":"`...)
	dst = append(dst, op)
	dst = append(dst, `","ts_ms":`...)
	dst = strconv.AppendInt(dst, tsMS, 10)
	if txID != "" {
		dst = append(dst, `,"transaction":{"id":"`...)
		dst = append(dst, txID...)
		dst = append(dst, `","total_order":`...)
		dst = strconv.AppendInt(dst, int64(order), 10)
		dst = append(dst, `,"data_collection_order":`...)
		dst = strconv.AppendInt(dst, int64(dcOrder), 10)
		dst = append(dst, '}')
	}
	return append(dst, "}\n"...)
}
