package hybench

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"time"
)

// Config chooses the dataset.
type Config struct {
	SF   float64 // scale factor: 1 is HyBench SF1 (≈7.6M base rows)
	Seed uint64
	// Run names this stream: transaction ids are "<Run>:<n>", so two runs
	// into one sink never share an id.
	Run string
	// Retain keeps the history tables (transfer, checking, loan
	// applications with their loans) at their base size, as a bank with a
	// retention window would: a row added beyond it deletes the table's
	// oldest in the same transaction, and purges go on past the base rows.
	// The data then stops growing, which a long soak needs to show that
	// nothing else does. It costs memory for the retained rows' images.
	Retain bool
}

// TxnStats counts the row changes of one generated transaction.
type TxnStats struct {
	Rows, Updates, Inserts, Deletes int
}

func (s *TxnStats) add(o TxnStats) {
	s.Rows += o.Rows
	s.Updates += o.Updates
	s.Inserts += o.Inserts
	s.Deletes += o.Deletes
}

// Generator produces the base snapshot and then the change stream. It
// keeps the mutable rows (accounts, loan applications) in memory so every
// update carries the exact before image; rows it never updates are
// regenerated from their id when a delete needs them. Not safe for
// concurrent use.
type Generator struct {
	cfg   Config
	sizes Sizes
	base  int64 // wall time of the base data, µs

	saving, checking     []account // by accountID − 1
	transfers, checkings history
	loans                []loanApp // by id − loanFirst
	loanFirst            int64     // id of loans[0]
	pending              []int64   // loan applications under review

	nextLoanTrans int64
	txns          uint64
	total         int64 // saving + checking balances, cents

	rng   *rand.Rand
	tx    txnBuilder
	stats TxnStats
}

type account struct {
	user, balance int64
	blocked       bool
	ts, fresh     int64
}

type loanApp struct {
	applicant, amount int64
	duration          int32
	accepted          bool
	ts, fresh         int64
	// The loan of an accepted application: its id and times (for the
	// delete's before image when a retained application goes).
	trans, transTS, transFresh int64
	pendingAt                  int // index in pending while under review
}

// loan is the application id.
func (g *Generator) loan(id int64) *loanApp { return &g.loans[id-g.loanFirst] }

// New builds the generator's in-memory state for cfg at base time now.
func New(cfg Config, now time.Time) *Generator {
	if cfg.Run == "" {
		cfg.Run = "hybench"
	}
	g := &Generator{cfg: cfg, sizes: SizesFor(cfg.SF), base: now.UnixMicro(),
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed))}
	s := g.sizes
	g.saving = make([]account, s.Accounts)
	g.checking = make([]account, s.Accounts)
	for i := range s.Accounts {
		id := int64(i + 1)
		for t, accts := range [][]account{g.saving, g.checking} {
			r := g.rowRand(2+t, id)
			accts[i] = account{user: id, balance: 100_000 + int64(r.IntN(9_900_000)), blocked: r.IntN(100) == 0,
				ts: g.pastMicros(r), fresh: g.base}
			g.total += accts[i].balance
		}
	}
	g.loans = make([]loanApp, s.LoanApps)
	for i := range s.LoanApps {
		r := g.rowRand(6, int64(i+1))
		l := &g.loans[i]
		*l = loanApp{applicant: 1 + int64(r.IntN(s.Accounts)), amount: 100_000 + int64(r.IntN(50_000_000)),
			duration: durations[r.IntN(len(durations))], accepted: i < s.LoanTrans, ts: g.pastMicros(r), fresh: g.base}
		if l.accepted {
			l.trans, l.transTS, l.transFresh = int64(i+1), l.ts, g.base
		} else {
			l.pendingAt = len(g.pending)
			g.pending = append(g.pending, int64(i+1))
		}
	}
	g.loanFirst, g.nextLoanTrans = 1, int64(s.LoanTrans)+1
	g.transfers = newHistory(Transfer, 4, int64(s.Transfers))
	g.checkings = newHistory(Checking, 5, int64(s.Checkings))
	return g
}

// Sizes is the base dataset's shape.
func (g *Generator) Sizes() Sizes { return g.sizes }

// TotalBalance is what every consistent snapshot sums over both account
// tables, in cents: transfers and moves never change it.
func (g *Generator) TotalBalance() int64 { return g.total }

// Transactions counts the change transactions generated so far.
func (g *Generator) Transactions() uint64 { return g.txns }

// Changes counts the rows changed by the stream so far.
func (g *Generator) Changes() TxnStats { return g.stats }

var (
	durations  = []int32{12, 24, 36, 60}
	genders    = []string{"female", "male"}
	provinces  = []string{"Anhui", "Beijing", "Fujian", "Guangdong", "Hebei", "Hubei", "Jiangsu", "Shanghai", "Sichuan", "Zhejiang"}
	categories = []string{"finance", "manufacturing", "retail", "services", "technology", "transport"}
	moveTypes  = []string{"invest", "purchase", "repay", "salary", "transfer"}
	firstNames = []string{"Ann", "Bo", "Chen", "Dana", "Eli", "Fang", "Gus", "Hui", "Ivy", "Jun", "Kai", "Lin", "Mei", "Ning", "Omar", "Ping"}
	lastNames  = []string{"Chen", "Garcia", "Li", "Liu", "Müller", "Nguyen", "Smith", "Wang", "Zhang", "Zhao"}
)

// rowRand is the deterministic source of one base row's values.
func (g *Generator) rowRand(table int, id int64) *rand.Rand {
	return rand.New(rand.NewPCG(g.cfg.Seed^uint64(table)<<56, uint64(id)))
}

// pastMicros is a time in the year before the base data.
func (g *Generator) pastMicros(r *rand.Rand) int64 {
	return g.base - r.Int64N(365*24*3600*1_000_000)
}

// WriteSnapshot writes the base dataset as Debezium snapshot events (op
// "r", no transaction metadata), table by table.
func (g *Generator) WriteSnapshot(ctx context.Context, w io.Writer) error {
	s := g.sizes
	tsMS := g.base / 1000
	var buf []byte
	emit := func(table string, n int, row func(b []byte, id int64) []byte) error {
		for i := range n {
			buf = g.appendEvent(buf, 'r', table, nil, func(b []byte) []byte { return row(b, int64(i+1)) }, "", 0, 0, tsMS)
			if len(buf) >= 1<<16 || i == n-1 {
				if err := ctx.Err(); err != nil {
					return err
				}
				if _, err := w.Write(buf); err != nil {
					return fmt.Errorf("hybench: write snapshot: %w", err)
				}
				buf = buf[:0]
			}
		}
		return nil
	}
	steps := []struct {
		table string
		n     int
		row   func([]byte, int64) []byte
	}{
		{Company, s.Companies, g.appendCompany},
		{Customer, s.Customers, g.appendCustomer},
		{SavingAccount, s.Accounts, func(b []byte, id int64) []byte { return appendAccount(b, id, g.saving[id-1]) }},
		{CheckingAccount, s.Accounts, func(b []byte, id int64) []byte { return appendAccount(b, id, g.checking[id-1]) }},
		{Transfer, s.Transfers, func(b []byte, id int64) []byte { return g.appendBaseMovement(b, 4, id) }},
		{Checking, s.Checkings, func(b []byte, id int64) []byte { return g.appendBaseMovement(b, 5, id) }},
		{LoanApps, s.LoanApps, func(b []byte, id int64) []byte { return appendLoanApp(b, id, *g.loan(id)) }},
		{LoanTrans, s.LoanTrans, g.appendBaseLoanTrans},
	}
	for _, st := range steps {
		if err := emit(st.table, st.n, st.row); err != nil {
			return err
		}
	}
	return nil
}

func (g *Generator) appendCustomer(b []byte, id int64) []byte {
	r := g.rowRand(0, id)
	b = field(b, "custID", true)
	b = strconv.AppendInt(b, id, 10)
	b = field(b, "companyID", false)
	b = strconv.AppendInt(b, 1+int64(r.IntN(g.sizes.Companies)), 10)
	b = strField(b, "gender", genders[r.IntN(len(genders))])
	b = strField(b, "name", firstNames[r.IntN(len(firstNames))]+" "+lastNames[r.IntN(len(lastNames))])
	b = intField(b, "age", 18+int64(r.IntN(70)))
	b = strField(b, "phone", "1"+strconv.FormatInt(3_000_000_000+r.Int64N(6_000_000_000), 10))
	p := r.IntN(len(provinces))
	b = strField(b, "province", provinces[p])
	b = strField(b, "city", provinces[p]+"-"+strconv.Itoa(1+r.IntN(20)))
	return g.appendCreditFields(b, r, 10_000_000)
}

func (g *Generator) appendCompany(b []byte, id int64) []byte {
	r := g.rowRand(1, id)
	b = field(b, "companyID", true)
	b = strconv.AppendInt(b, id, 10)
	cat := categories[r.IntN(len(categories))]
	b = strField(b, "name", lastNames[r.IntN(len(lastNames))]+" "+cat+" "+strconv.FormatInt(id, 10))
	b = strField(b, "category", cat)
	b = intField(b, "staff_size", 10+int64(r.IntN(10_000)))
	return g.appendCreditFields(b, r, 1_000_000_000)
}

// appendCreditFields writes the columns customers and companies share.
func (g *Generator) appendCreditFields(b []byte, r *rand.Rand, maxLoan int64) []byte {
	b = field(b, "loan_balance", false)
	b = appendDecimal(b, r.Int64N(maxLoan))
	b = intField(b, "saving_credit", int64(r.IntN(5)))
	b = intField(b, "checking_credit", int64(r.IntN(5)))
	b = intField(b, "loan_credit", int64(r.IntN(5)))
	b = boolField(b, "isblocked", r.IntN(100) == 0)
	b = intField(b, "created_date", g.pastMicros(r)/86_400_000_000)
	b = intField(b, "last_update_ts", g.pastMicros(r))
	return intField(b, "fresh_ts", g.base)
}

func appendAccount(b []byte, id int64, a account) []byte {
	b = field(b, "accountID", true)
	b = strconv.AppendInt(b, id, 10)
	b = intField(b, "userID", a.user)
	b = field(b, "balance", false)
	b = appendDecimal(b, a.balance)
	b = boolField(b, "isblocked", a.blocked)
	b = intField(b, "ts", a.ts)
	return intField(b, "fresh_ts", a.fresh)
}

type movement struct {
	source, target, amount int64
	kind                   string
	ts, fresh              int64
}

// baseMovement is base row id of transfer (table 4) or checking (5).
func (g *Generator) baseMovement(table int, id int64) movement {
	r := g.rowRand(table, id)
	n := g.sizes.Accounts
	src := 1 + int64(r.IntN(n))
	dst := 1 + int64(r.IntN(n))
	if table == 5 { // checking pays a company
		dst = int64(g.sizes.Customers) + 1 + int64(r.IntN(g.sizes.Companies))
	}
	return movement{source: src, target: dst, amount: 100 + r.Int64N(2_000_000),
		kind: moveTypes[r.IntN(len(moveTypes))], ts: g.pastMicros(r), fresh: g.base}
}

func (g *Generator) appendBaseMovement(b []byte, table int, id int64) []byte {
	return appendMovement(b, id, g.baseMovement(table, id))
}

func appendMovement(b []byte, id int64, m movement) []byte {
	b = field(b, "id", true)
	b = strconv.AppendInt(b, id, 10)
	b = intField(b, "sourceID", m.source)
	b = intField(b, "targetID", m.target)
	b = field(b, "amount", false)
	b = appendDecimal(b, m.amount)
	b = strField(b, "type", m.kind)
	b = intField(b, "ts", m.ts)
	return intField(b, "fresh_ts", m.fresh)
}

func appendLoanApp(b []byte, id int64, l loanApp) []byte {
	b = field(b, "id", true)
	b = strconv.AppendInt(b, id, 10)
	b = intField(b, "applicantID", l.applicant)
	b = field(b, "amount", false)
	b = appendDecimal(b, l.amount)
	b = intField(b, "duration", int64(l.duration))
	status := "under_review"
	if l.accepted {
		status = "accept"
	}
	b = strField(b, "status", status)
	b = intField(b, "ts", l.ts)
	return intField(b, "fresh_ts", l.fresh)
}

func (g *Generator) appendBaseLoanTrans(b []byte, id int64) []byte {
	l := g.loan(id)
	return appendLoanTrans(b, id, id, *l, l.ts, g.base)
}

func appendLoanTrans(b []byte, id, app int64, l loanApp, ts, fresh int64) []byte {
	b = field(b, "id", true)
	b = strconv.AppendInt(b, id, 10)
	b = intField(b, "applicantID", l.applicant)
	b = intField(b, "appID", app)
	b = field(b, "amount", false)
	b = appendDecimal(b, l.amount)
	b = strField(b, "status", "lent")
	b = intField(b, "ts", ts)
	b = intField(b, "duration", int64(l.duration))
	b = intField(b, "contract_ts", ts)
	b = intField(b, "delinquency", 0)
	return intField(b, "fresh_ts", fresh)
}

// JSON helpers. Every string this package writes is plain ASCII or UTF-8
// without quotes, backslashes or control characters, so quoting is
// appending the bytes between quotes.

func field(b []byte, name string, first bool) []byte {
	if !first {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

func intField(b []byte, name string, v int64) []byte {
	return strconv.AppendInt(field(b, name, false), v, 10)
}

func strField(b []byte, name, v string) []byte {
	b = append(field(b, name, false), '"')
	b = append(b, v...)
	return append(b, '"')
}

func boolField(b []byte, name string, v bool) []byte {
	return strconv.AppendBool(field(b, name, false), v)
}

// appendDecimal writes Debezium's precise decimal encoding: base64 of the
// minimal big-endian two's complement of the unscaled value.
func appendDecimal(b []byte, unscaled int64) []byte {
	var raw [8]byte
	binary.BigEndian.PutUint64(raw[:], uint64(unscaled))
	i := 0
	for i < 7 && ((raw[i] == 0 && raw[i+1]&0x80 == 0) || (raw[i] == 0xff && raw[i+1]&0x80 != 0)) {
		i++
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, raw[i:])
	return append(b, '"')
}
