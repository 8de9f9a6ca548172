package hybench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/decimal128"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
)

// oracle applies decoded records to in-memory tables, checking that every
// before image is the row it replaces.
type oracle struct {
	t      *testing.T
	cat    *catalog.Catalog
	rows   map[string]map[string][]any // table → key → row
	tables map[string]*catalog.Table
}

func newOracle(t *testing.T) *oracle {
	cat, err := catalog.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	o := &oracle{t: t, cat: cat, rows: map[string]map[string][]any{}, tables: map[string]*catalog.Table{}}
	for _, tb := range Tables() {
		sc, err := tb.Schema()
		if err != nil {
			t.Fatal(err)
		}
		ct, err := cat.CreateTable(context.Background(), tb.Name, sc)
		if err != nil {
			t.Fatal(err)
		}
		o.tables[tb.Name] = ct
		o.rows[tb.Name] = map[string][]any{}
	}
	return o
}

func (o *oracle) key(table string, row []any) string {
	return fmt.Sprint(row[o.tables[table].Schema.KeyColumns()[0]])
}

func (o *oracle) apply(r cdc.Record) {
	o.t.Helper()
	rows := o.rows[r.Table]
	if r.Before != nil {
		k := o.key(r.Table, r.Before)
		if !reflect.DeepEqual(rows[k], r.Before) {
			o.t.Fatalf("%s %c key %s: before image %v, table has %v", r.Table, r.Op, k, r.Before, rows[k])
		}
		delete(rows, k)
	}
	if r.After != nil {
		k := o.key(r.Table, r.After)
		if _, dup := rows[k]; dup {
			o.t.Fatalf("%s %c: key %s exists", r.Table, r.Op, k)
		}
		rows[k] = r.After
	}
}

func (o *oracle) balance() int64 {
	var sum int64
	for _, table := range []string{SavingAccount, CheckingAccount} {
		col := o.tables[table].Schema.ColumnIndex("balance")
		for _, row := range o.rows[table] {
			sum += int64(row[col].(decimal128.Num).LowBits())
		}
	}
	return sum
}

func (o *oracle) acceptedMinusLoans() int {
	col := o.tables[LoanApps].Schema.ColumnIndex("status")
	n := 0
	for _, row := range o.rows[LoanApps] {
		if row[col] == "accept" {
			n++
		}
	}
	return n - len(o.rows[LoanTrans])
}

func decodeAll(t *testing.T, o *oracle, data []byte, each func(cdc.Record)) {
	t.Helper()
	dec := cdc.NewDecoder(o.cat.Snapshot(), slog.New(slog.DiscardHandler), cdc.DecoderOptions{})
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for i := int64(0); sc.Scan(); i++ {
		rec, err := dec.Decode(cdc.Message{Pos: cdc.Position{Stream: "test", Offset: i}, Value: sc.Bytes()})
		if err != nil {
			t.Fatalf("line %d: %v\n%s", i, err, sc.Bytes())
		}
		each(rec)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestSnapshotMatchesSizesAndInvariants(t *testing.T) {
	g := New(Config{SF: 0.002, Seed: 7}, time.Now())
	var buf bytes.Buffer
	if err := g.WriteSnapshot(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	o := newOracle(t)
	decodeAll(t, o, buf.Bytes(), func(r cdc.Record) {
		if r.Kind != cdc.Change || r.Op != cdc.OpRead || r.TxID != "" {
			t.Fatalf("snapshot record %+v", r)
		}
		o.apply(r)
	})
	s := g.Sizes()
	want := map[string]int{Customer: s.Customers, Company: s.Companies, SavingAccount: s.Accounts, CheckingAccount: s.Accounts,
		Transfer: s.Transfers, Checking: s.Checkings, LoanApps: s.LoanApps, LoanTrans: s.LoanTrans}
	total := 0
	for table, n := range want {
		if len(o.rows[table]) != n {
			t.Errorf("%s: %d rows, want %d", table, len(o.rows[table]), n)
		}
		total += n
	}
	if total != s.Total() {
		t.Errorf("Total() = %d, tables hold %d", s.Total(), total)
	}
	if got := o.balance(); got != g.TotalBalance() {
		t.Errorf("base balance %d, generator says %d", got, g.TotalBalance())
	}
	if d := o.acceptedMinusLoans(); d != 0 {
		t.Errorf("accepted applications minus loans = %d", d)
	}
}

// TestStreamKeepsInvariantsPerTransaction replays the stream transaction by
// transaction: before images are exact, END counts match the events, the
// invariants hold after every transaction, and the mix is HyBench's.
func TestStreamKeepsInvariantsPerTransaction(t *testing.T) {
	t.Run("growing", func(t *testing.T) { testStream(t, false) })
	t.Run("retained", func(t *testing.T) { testStream(t, true) })
}

func testStream(t *testing.T, retain bool) {
	g := New(Config{SF: 0.001, Seed: 3, Run: "t1", Retain: retain}, time.Now())
	var base bytes.Buffer
	if err := g.WriteSnapshot(context.Background(), &base); err != nil {
		t.Fatal(err)
	}
	o := newOracle(t)
	decodeAll(t, o, base.Bytes(), o.apply)
	const txns = 3000
	var stream []byte
	now := time.Now()
	var sum TxnStats
	for i := range txns {
		var st TxnStats
		stream, st = g.NextTxn(stream, now.Add(time.Duration(i)*time.Millisecond))
		sum.add(st)
	}
	if sum != g.Changes() {
		t.Fatalf("Changes() %+v, transactions add to %+v", g.Changes(), sum)
	}
	var (
		open     string
		events   int
		perTable = map[string]int64{}
		pending  []cdc.Record
		seen     = map[string]bool{}
		commits  int
	)
	decodeAll(t, o, stream, func(r cdc.Record) {
		switch r.Kind {
		case cdc.Begin:
			if open != "" || seen[r.TxID] {
				t.Fatalf("BEGIN %s inside %q or repeated", r.TxID, open)
			}
			open, events, pending = r.TxID, 0, pending[:0]
			clear(perTable)
			seen[r.TxID] = true
		case cdc.Change:
			if r.TxID != open {
				t.Fatalf("change of %s inside %s", r.TxID, open)
			}
			events++
			perTable[r.Table]++
			if r.TotalOrder != int64(events) {
				t.Fatalf("total_order %d, want %d", r.TotalOrder, events)
			}
			if r.SourceTSms == 0 {
				t.Fatal("change without source.ts_ms")
			}
			pending = append(pending, r)
		case cdc.End:
			if r.EventCount != int64(events) || !reflect.DeepEqual(r.PerTable, perTable) {
				t.Fatalf("END %s: %d events %v, saw %d %v", r.TxID, r.EventCount, r.PerTable, events, perTable)
			}
			if longest := RowsPerTxn + 2 + b2i(retain); events < RowsPerTxn || events > longest {
				t.Fatalf("transaction of %d rows", events)
			}
			if tb := pending[0].Table; tb != SavingAccount && tb != CheckingAccount {
				t.Fatalf("transaction starts on %s, not an account table", tb)
			}
			for _, c := range pending {
				o.apply(c)
			}
			if got := o.balance(); got != g.TotalBalance() {
				t.Fatalf("after %s: balance %d, want %d", r.TxID, got, g.TotalBalance())
			}
			if d := o.acceptedMinusLoans(); d != 0 {
				t.Fatalf("after %s: accepted minus loans = %d", r.TxID, d)
			}
			open = ""
			commits++
		}
	})
	if commits != txns {
		t.Fatalf("%d transactions decoded, want %d", commits, txns)
	}
	pct := func(n int) float64 { return 100 * float64(n) / float64(sum.Rows) }
	if retain {
		// The history tables end at their base size, give or take the
		// purges since the last additions.
		s := g.Sizes()
		for _, h := range []struct {
			table string
			base  int
		}{{Transfer, s.Transfers}, {Checking, s.Checkings}, {LoanApps, s.LoanApps}} {
			if n := len(o.rows[h.table]); n > h.base || n < h.base*9/10 {
				t.Errorf("%s has %d rows, base %d", h.table, n, h.base)
			}
		}
		t.Logf("rows/txn %.2f, updates %.1f%%, inserts %.1f%%, deletes %.1f%%",
			float64(sum.Rows)/txns, pct(sum.Updates), pct(sum.Inserts), pct(sum.Deletes))
		return
	}
	t.Logf("rows/txn %.2f, updates %.1f%%, inserts %.1f%%, deletes %.1f%%",
		float64(sum.Rows)/txns, pct(sum.Updates), pct(sum.Inserts), pct(sum.Deletes))
	if u := pct(sum.Updates); u < 64 || u > 76 {
		t.Errorf("updates %.1f%%, want ≈70%%", u)
	}
	if i := pct(sum.Inserts); i < 20 || i > 30 {
		t.Errorf("inserts %.1f%%, want ≈25%%", i)
	}
	if d := pct(sum.Deletes); d < 2 || d > 8 {
		t.Errorf("deletes %.1f%%, want ≈5%%", d)
	}
}

func TestDecimalEncoding(t *testing.T) {
	for _, v := range []int64{0, 1, 127, 128, 255, 256, -1, -128, -129, 1 << 40, -(1 << 40), 9_999_999_999_999} {
		b := appendDecimal(nil, v)
		raw := make([]byte, 16)
		n, err := base64.StdEncoding.Decode(raw, b[1:len(b)-1])
		if err != nil {
			t.Fatal(err)
		}
		var got int64
		if raw[0]&0x80 != 0 {
			got = -1
		}
		for _, c := range raw[:n] {
			got = got<<8 | int64(c)
		}
		if got != v {
			t.Errorf("%d encodes as %s, decodes to %d", v, b, got)
		}
		if n > 1 && ((raw[0] == 0 && raw[1]&0x80 == 0) || (raw[0] == 0xff && raw[1]&0x80 != 0)) {
			t.Errorf("%d: encoding %x is not minimal", v, raw[:n])
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
