package skeena

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/histcheck"
)

// The history tests run random list-append and bank transactions over both
// engines from concurrent workers, record what each committed transaction
// observed, and check the history with histcheck: no snapshot-isolation
// anomaly (and, in serializable mode, no serializability anomaly).

const (
	bankAccounts = 8
	bankInitial  = 1000
	listWindow   = 16  // list keys live at a time (half in each engine)
	listEpoch    = 400 // transactions per window of list keys
)

// workload generates and runs transactions and records the history.
type workload struct {
	s       *Store
	level   histcheck.Level
	txnSeq  atomic.Int64
	valSeq  atomic.Int64
	mu      sync.Mutex
	history []histcheck.Txn
	bankErr atomic.Value // first inconsistent bank total
}

func listTable(k int) string {
	if k%2 == 0 {
		return "m"
	}
	return "d"
}

func acctTable(a int) string {
	if a < bankAccounts/2 {
		return "m"
	}
	return "d"
}

func listKey(k int) string { return "l" + strconv.Itoa(k) }
func acctKey(a int) string { return "acct" + strconv.Itoa(a) }

// Rows: a list is "l:v,v,…"; an account is "b:balance:version".
func parseList(row []byte) []int {
	body := strings.TrimPrefix(string(row), "l:")
	if body == "" {
		return nil
	}
	var out []int
	for _, f := range strings.Split(body, ",") {
		n, _ := strconv.Atoi(f)
		out = append(out, n)
	}
	return out
}

func formatList(l []int) []byte {
	var b strings.Builder
	b.WriteString("l:")
	for i, v := range l {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(v))
	}
	return []byte(b.String())
}

func parseAcct(row []byte) (balance, version int) {
	f := strings.Split(string(row), ":")
	balance, _ = strconv.Atoi(f[1])
	version, _ = strconv.Atoi(f[2])
	return
}

func (w *workload) seed(t testing.TB) {
	tx := w.s.Begin()
	for a := 0; a < bankAccounts; a++ {
		mustPut(t, tx, acctTable(a), acctKey(a), fmt.Sprintf("b:%d:0", bankInitial))
	}
	mustCommit(t, tx)
}

// run executes one random transaction and records it; cross reports
// whether it touched both engines.
func (w *workload) run(ctx context.Context, rng *rand.Rand) (cross bool, err error) {
	id := int(w.txnSeq.Add(1))
	tx := w.s.Begin()
	rec := histcheck.Txn{ID: id}
	switch p := rng.Intn(100); {
	case p < 60:
		err = w.listTxn(ctx, tx, rng, id, &rec)
	case p < 85:
		err = w.transfer(ctx, tx, rng, &rec)
	default:
		err = w.readBank(ctx, tx, &rec)
	}
	cross = tx.memUsed && tx.disk != nil
	if err == nil {
		err = tx.Commit(ctx)
	} else {
		tx.Rollback()
	}
	if err != nil {
		if !engine.Retryable(err) {
			return cross, fmt.Errorf("transaction %d: %w", id, err)
		}
		rec.Status = histcheck.Aborted
	}
	w.mu.Lock()
	w.history = append(w.history, rec)
	w.mu.Unlock()
	return cross, nil
}

func (w *workload) listTxn(ctx context.Context, tx *Tx, rng *rand.Rand, id int, rec *histcheck.Txn) error {
	base := (id / listEpoch) * listWindow
	own := map[int][]int{}
	for n := 2 + rng.Intn(4); n > 0; n-- {
		k := base + rng.Intn(listWindow)
		key := listKey(k)
		row, ok, err := tx.Get(ctx, listTable(k), []byte(key))
		if err != nil {
			return err
		}
		var l []int
		if ok {
			l = parseList(row)
		}
		if rng.Intn(2) == 0 {
			rec.Ops = append(rec.Ops, histcheck.Op{Kind: histcheck.ReadList, Key: key, List: l})
			continue
		}
		v := int(w.valSeq.Add(1))
		rec.Ops = append(rec.Ops, histcheck.Op{Kind: histcheck.Append, Key: key, Value: v})
		own[k] = append(own[k], v)
		if err := tx.Put(ctx, listTable(k), []byte(key), formatList(append(l, v))); err != nil {
			return err
		}
	}
	return nil
}

func (w *workload) transfer(ctx context.Context, tx *Tx, rng *rand.Rand, rec *histcheck.Txn) error {
	a := rng.Intn(bankAccounts / 2)                // memory
	b := bankAccounts/2 + rng.Intn(bankAccounts/2) // storage
	if rng.Intn(4) == 0 {
		b = (a + 1 + rng.Intn(bankAccounts/2-1)) % (bankAccounts / 2) // both memory
	}
	if rng.Intn(2) == 0 {
		a, b = b, a
	}
	amount := 1 + rng.Intn(20)
	var bal [2]int
	var ver [2]int
	for i, acct := range []int{a, b} {
		row, ok, err := tx.Get(ctx, acctTable(acct), []byte(acctKey(acct)))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("account %d missing", acct)
		}
		bal[i], ver[i] = parseAcct(row)
		rec.Ops = append(rec.Ops, histcheck.Op{Kind: histcheck.ReadReg, Key: acctKey(acct), Value: ver[i]})
	}
	for i, acct := range []int{a, b} {
		nb := bal[i] - amount
		if i == 1 {
			nb = bal[i] + amount
		}
		v := int(w.valSeq.Add(1))
		rec.Ops = append(rec.Ops, histcheck.Op{Kind: histcheck.Write, Key: acctKey(acct), Value: v, Prev: ver[i]})
		if err := tx.Put(ctx, acctTable(acct), []byte(acctKey(acct)), []byte(fmt.Sprintf("b:%d:%d", nb, v))); err != nil {
			return err
		}
	}
	return nil
}

func (w *workload) readBank(ctx context.Context, tx *Tx, rec *histcheck.Txn) error {
	total := 0
	for a := 0; a < bankAccounts; a++ {
		row, ok, err := tx.Get(ctx, acctTable(a), []byte(acctKey(a)))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("account %d missing", a)
		}
		bal, ver := parseAcct(row)
		total += bal
		rec.Ops = append(rec.Ops, histcheck.Op{Kind: histcheck.ReadReg, Key: acctKey(a), Value: ver})
	}
	if total != bankAccounts*bankInitial && w.bankErr.Load() == nil {
		w.bankErr.Store(fmt.Sprintf("transaction %d read a bank total of %d, want %d", rec.ID, total, bankAccounts*bankInitial))
	}
	return nil
}

// finalRead observes every list key and account once more, so the version
// orders are complete.
func (w *workload) finalRead(t testing.TB) {
	ctx := context.Background()
	tx := w.s.Begin()
	rec := histcheck.Txn{ID: int(w.txnSeq.Add(1))}
	last := int(w.txnSeq.Load())/listEpoch*listWindow + listWindow
	for k := 0; k < last; k++ {
		row, ok, err := tx.Get(ctx, listTable(k), []byte(listKey(k)))
		if err != nil {
			t.Fatal(err)
		}
		var l []int
		if ok {
			l = parseList(row)
		}
		rec.Ops = append(rec.Ops, histcheck.Op{Kind: histcheck.ReadList, Key: listKey(k), List: l})
	}
	if err := w.readBank(ctx, tx, &rec); err != nil {
		t.Fatal(err)
	}
	mustCommit(t, tx)
	w.history = append(w.history, rec)
}

func runHistory(t *testing.T, iso engine.Isolation, level histcheck.Level, crossTxns int) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Isolation = iso; o.CheckpointEvery = 200 * time.Millisecond })
	defer s.Close()
	w := &workload{s: s, level: level}
	w.seed(t)
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	// Count cross-engine transactions; single-engine ones run among them.
	var left, crossN atomic.Int64
	left.Store(int64(crossTxns))
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			for left.Load() > 0 {
				cross, err := w.run(context.Background(), rng)
				if err != nil {
					errs <- err
					return
				}
				if cross {
					left.Add(-1)
					crossN.Add(1)
				}
			}
		}(int64(i) + 1)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	w.finalRead(t)
	if msg := w.bankErr.Load(); msg != nil {
		t.Error(msg)
	}
	aborted := 0
	for _, r := range w.history {
		if r.Status == histcheck.Aborted {
			aborted++
		}
	}
	anomalies := histcheck.Check(w.history, level)
	for i, a := range anomalies {
		if i == 10 {
			t.Errorf("… and %d more", len(anomalies)-10)
			break
		}
		t.Error(a)
	}
	t.Logf("%d transactions, %d of them cross-engine, %d aborted; %d anomalies", len(w.history), crossN.Load(), aborted, len(anomalies))
}

func historySize() int {
	if testing.Short() {
		return 5_000
	}
	return 100_000
}

func TestHistorySnapshotIsolation(t *testing.T) {
	runHistory(t, engine.SnapshotIsolation, histcheck.SnapshotIsolation, historySize())
}

func TestHistorySerializable(t *testing.T) {
	runHistory(t, engine.Serializable, histcheck.Serializable, historySize())
}

// The checker is only as good as what it can catch: without the registry
// the same workload must show anomalies.
func TestHistoryWithoutCSRFindsAnomalies(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.DisableCSR = true })
	defer s.Close()
	w := &workload{s: s, level: histcheck.SnapshotIsolation}
	w.seed(t)
	for round := 0; round < 20; round++ {
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func(seed int64) {
				defer wg.Done()
				rng := rand.New(rand.NewSource(seed))
				for j := 0; j < 250; j++ {
					if _, err := w.run(context.Background(), rng); err != nil {
						t.Error(err)
						return
					}
				}
			}(int64(round*8 + i + 1))
		}
		wg.Wait()
		if a := histcheck.Check(w.history, histcheck.SnapshotIsolation); len(a) > 0 || w.bankErr.Load() != nil {
			t.Logf("after %d transactions: %d anomalies (first: %v), bank: %v", len(w.history), len(a), a, w.bankErr.Load())
			return
		}
	}
	t.Fatal("40000 transactions without the registry showed no anomaly; the checker or the workload misses cross-engine read skew")
}
