package sink

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/scan"
	"github.com/retinadb/retina/internal/txn"
	"github.com/retinadb/retina/internal/types"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// stack is a whole embedded pipeline behind a sink: catalog, index, lake,
// two replayers, transaction service and scanner.
type stack struct {
	cat  *catalog.Catalog
	svc  *txn.Local
	reps []*replay.Replayer
	sc   *scan.Scanner
	dir  string
}

func newStack(t *testing.T) *stack {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	cat, err := catalog.Open(dir + "/catalog")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	idx, err := index.Open(index.Config{Backend: "memory", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	store, err := lake.Open(ctx, "mem://", lake.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := txn.OpenFileStore(dir + "/txn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	svc, err := txn.NewLocal(ctx, fs, txn.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	st := &stack{cat: cat, svc: svc, dir: dir}
	for id := range uint32(2) {
		rp, err := replay.New(replay.Config{ID: id, Catalog: cat, Index: idx, Lake: store, BlockRows: 64, FileBlocks: 8, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rp.Close(context.Background()) })
		st.reps = append(st.reps, rp)
	}
	st.sc = scan.New(store, func(id uint32) (scan.Owner, bool) {
		if int(id) < len(st.reps) {
			return st.reps[id], true
		}
		return nil, false
	}, nil)
	return st
}

func (st *stack) replayers() []Replayer {
	out := make([]Replayer, len(st.reps))
	for i, r := range st.reps {
		out[i] = r
	}
	return out
}

// rows reads a table at the current HWM − 1 as "key → all values" strings.
func (st *stack) rows(t *testing.T, table string) map[string]string {
	t.Helper()
	tb, ok := st.cat.Snapshot().Table(table)
	if !ok {
		t.Fatalf("no table %s", table)
	}
	w, _ := st.svc.Watermarks(context.Background())
	cols := make([]int, len(tb.Schema.Columns))
	for i := range cols {
		cols[i] = i
	}
	out := map[string]string{}
	_, err := st.sc.Scan(context.Background(), scan.Request{Table: tb, Files: st.cat.Snapshot().LiveFiles(tb.ID), Snapshot: w.HWM - 1, Columns: cols}, func(rec arrow.RecordBatch) error {
		defer rec.Release()
		for i := range int(rec.NumRows()) {
			var vals []string
			for c := range cols {
				v, _ := scan.Value(rec.Column(c), i)
				if d, ok := v.(decimal128.Num); ok {
					v = d.ToString(int32(tb.Schema.Columns[c].Type.Scale))
				}
				vals = append(vals, fmt.Sprint(v))
			}
			if _, dup := out[vals[0]]; dup {
				return fmt.Errorf("key %s twice", vals[0])
			}
			out[vals[0]] = strings.Join(vals[1:], "|")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (st *stack) newSink(t *testing.T, src cdc.Source, mod func(*Config)) *Sink {
	t.Helper()
	cfg := Config{Sources: []cdc.Source{src}, Catalog: st.cat, Txn: st.svc, Replayers: st.replayers(), Buckets: 4, Logger: quiet()}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func customerSchema() catalog.Schema {
	return catalog.Schema{Columns: []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "name", Type: types.Of(types.String), Nullable: true},
		{Name: "balance", Type: types.DecimalOf(12, 2), Nullable: true},
		{Name: "updated", Type: types.Of(types.Timestamp), Nullable: true},
	}, PrimaryKey: []string{"id"}}
}

// TestFixturesEndToEnd runs the MySQL and PostgreSQL fixtures through the
// file source, the sink and the replayers.
func TestFixturesEndToEnd(t *testing.T) {
	st := newStack(t)
	ctx := context.Background()
	if _, err := st.cat.CreateTable(ctx, "customer", customerSchema()); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"../cdc/testdata/mysql_tx.jsonl", "../cdc/testdata/postgres_schema.jsonl"} {
		src, err := cdc.OpenFileSource(f, cdc.FileOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s := st.newSink(t, src, nil)
		if err := s.Run(ctx); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		src.Close()
		t.Logf("%s: %+v", f, s.Stats())
	}
	cust := st.rows(t, "customer")
	if len(cust) != 1 || cust["1001"] != "Sally Thomas|12.50|1711929601000000" {
		t.Fatalf("customer: %v", cust)
	}
	orders := st.rows(t, "orders")
	if len(orders) != 1 || !strings.HasPrefix(orders["7"], "100.00|paid|") || !strings.HasSuffix(orders["7"], "|19784") {
		t.Fatalf("orders: %v", orders)
	}
	w, _ := st.svc.Watermarks(ctx)
	if w.HWM != w.Next {
		t.Fatalf("transactions left uncommitted: %+v", w)
	}
}

// --- a synthetic Debezium stream with an oracle ---

type line struct {
	topic      string
	key, value string
}

type gen struct {
	rng     *rand.Rand
	lines   []line
	state   map[int64]int64 // account id → balance
	nextID  int64
	txCount int
}

func newGen(seed uint64) *gen {
	return &gen{rng: rand.New(rand.NewPCG(seed, 1)), state: map[int64]int64{}, nextID: 1}
}

func (g *gen) event(op string, before, after map[string]any, tx string, order int) {
	id := after["id"]
	if after == nil {
		id = before["id"]
	}
	v := map[string]any{
		"before": before, "after": after, "op": op,
		"source":      map[string]any{"connector": "mysql", "db": "bank", "table": "account"},
		"transaction": map[string]any{"id": tx, "total_order": order, "data_collection_order": order},
	}
	vb, _ := json.Marshal(v)
	kb, _ := json.Marshal(map[string]any{"id": id})
	g.lines = append(g.lines, line{"bank.account", string(kb), string(vb)})
}

// txn appends one transaction of 1–4 operations and updates the oracle.
func (g *gen) txn() {
	g.txCount++
	tx := fmt.Sprintf("gtid-%d", g.txCount)
	begin, _ := json.Marshal(map[string]any{"status": "BEGIN", "id": tx})
	g.lines = append(g.lines, line{topic: "bank.transaction", value: string(begin)})
	n := 1 + g.rng.IntN(4)
	for i := 1; i <= n; i++ {
		ids := slices.Sorted(maps.Keys(g.state))
		switch k := g.rng.IntN(10); {
		case k < 4 || len(ids) == 0:
			id := g.nextID
			g.nextID++
			b := int64(g.rng.IntN(1000))
			g.state[id] = b
			g.event("c", nil, map[string]any{"id": id, "owner": fmt.Sprintf("o%d", id), "balance": b}, tx, i)
		case k < 8:
			id := ids[g.rng.IntN(len(ids))]
			old := g.state[id]
			b := int64(g.rng.IntN(1000))
			g.state[id] = b
			g.event("u", map[string]any{"id": id, "owner": fmt.Sprintf("o%d", id), "balance": old}, map[string]any{"id": id, "owner": fmt.Sprintf("o%d", id), "balance": b}, tx, i)
		default:
			id := ids[g.rng.IntN(len(ids))]
			old := g.state[id]
			delete(g.state, id)
			g.event("d", map[string]any{"id": id, "owner": fmt.Sprintf("o%d", id), "balance": old}, nil, tx, i)
		}
	}
	end, _ := json.Marshal(map[string]any{"status": "END", "id": tx, "event_count": n,
		"data_collections": []map[string]any{{"data_collection": "bank.account", "event_count": n}}})
	g.lines = append(g.lines, line{topic: "bank.transaction", value: string(end)})
}

func (g *gen) oracle() map[string]string {
	out := map[string]string{}
	for id, b := range g.state {
		out[fmt.Sprint(id)] = fmt.Sprintf("o%d|%d", id, b)
	}
	return out
}

func accountSchema() catalog.Schema {
	return catalog.Schema{Columns: []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "owner", Type: types.Of(types.String)},
		{Name: "balance", Type: types.Of(types.Int64)},
	}, PrimaryKey: []string{"id"}}
}

// TestExactlyOnceFile crashes the sink at random points, restarts it from
// its last checkpoint with the source rewound to earlier offsets, and
// checks the final state against the oracle.
func TestExactlyOnceFile(t *testing.T) {
	st := newStack(t)
	ctx := context.Background()
	if _, err := st.cat.CreateTable(ctx, "account", accountSchema()); err != nil {
		t.Fatal(err)
	}
	g := newGen(11)
	for range 400 {
		g.txn()
	}
	path := filepath.Join(st.dir, "stream.jsonl")
	f, _ := os.Create(path)
	w := bufio.NewWriter(f)
	for _, l := range g.lines {
		fmt.Fprintf(w, "{\"key\":%s,\"value\":%s}\n", orNull(l.key), l.value)
	}
	w.Flush()
	f.Close()
	cps := FileCheckpoints{Path: filepath.Join(st.dir, "sink.checkpoint")}
	rng := rand.New(rand.NewPCG(5, 5))
	restarts := 0
	for {
		cp, err := cps.Load()
		if err != nil {
			t.Fatal(err)
		}
		// Redeliver from earlier: rewind every stream by up to 200 lines.
		resume := map[string]int64{}
		rewind := rng.IntN(200)
		if len(cp) > 0 {
			for s, off := range cp[0].Resume {
				resume[s] = max(1, off-int64(rewind))
			}
		}
		src, err := cdc.OpenFileSource(path, cdc.FileOptions{Resume: resume})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		crash := &crashing{Source: src, n: rewind + 1 + rng.IntN(300), cancel: cancel}
		s := st.newSink(t, crash, func(c *Config) { c.Checkpoints, c.Start = cps, cp })
		crash.sink = s
		err = s.Run(runCtx)
		cancel()
		src.Close()
		t.Logf("run %d: resume %v rewind %d n %d given %d: %v stats %+v cps %v", restarts, resume, rewind, crash.n, crash.given, err, s.Stats(), s.Checkpoints())
		if err == nil {
			break
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("run %d: %v", restarts, err)
		}
		restarts++
		if restarts > 500 {
			t.Fatal("never finished")
		}
	}
	if got, want := st.rows(t, "account"), g.oracle(); !maps.Equal(got, want) {
		for k, v := range want {
			if got[k] != v {
				t.Logf("key %s: got %q want %q", k, got[k], v)
			}
		}
		for k, v := range got {
			if _, ok := want[k]; !ok {
				t.Logf("key %s: got %q, not in oracle", k, v)
			}
		}
		t.Fatalf("after %d restarts: %d rows, oracle %d", restarts, len(got), len(want))
	}
	t.Logf("%d crashes and restarts; state equals the oracle (%d rows)", restarts, len(g.oracle()))
}

// crashing wraps a real source and stops the sink once it has processed n
// messages: the "crash" points of the exactly-once tests.
// Sources that never end (Kafka) also stop once finished() says the whole
// stream is applied; a source that stays quiet for stallAfter before that
// fails the run with state() instead of waiting forever.
type crashing struct {
	cdc.Source
	n, given int
	sink     *Sink
	cancel   context.CancelFunc
	finished func() bool
	state    func() string
}

const stallAfter = 30 * time.Second

func (c *crashing) Next(ctx context.Context) (cdc.Message, error) {
	if c.given == c.n {
		// The crash point is after the sink took every message given: it
		// must catch up, or the test would crash somewhere else.
		deadline := time.Now().Add(stallAfter)
		for c.sink.Stats().Messages < uint64(c.given) {
			if time.Now().After(deadline) {
				return cdc.Message{}, fmt.Errorf("the sink took %d of the %d messages given in %s: it does not reach the crash point", c.sink.Stats().Messages, c.given, stallAfter)
			}
			time.Sleep(time.Millisecond)
		}
		c.cancel()
		return cdc.Message{}, context.Canceled
	}
	quietSince := time.Now()
	for {
		wait, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		m, err := c.Source.Next(wait)
		cancel()
		if err == nil {
			c.given++
			return m, nil
		}
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return m, err
		}
		if c.finished != nil && c.finished() {
			c.cancel()
			return cdc.Message{}, context.Canceled
		}
		if c.state != nil && time.Since(quietSince) > stallAfter {
			return cdc.Message{}, fmt.Errorf("source quiet for %s after %d messages, stream not finished: sink %+v, %s",
				stallAfter, c.given, c.sink.Stats(), c.state())
		}
	}
}

func orNull(s string) string {
	if s == "" {
		return "null"
	}
	return s
}

// TestExactlyOnceKafka: the same on an in-process Kafka cluster, events and
// transaction metadata on separate topics; every restart joins a fresh
// consumer group, so everything is redelivered from the start.
func TestExactlyOnceKafka(t *testing.T) {
	st := newStack(t)
	ctx := context.Background()
	if _, err := st.cat.CreateTable(ctx, "account", accountSchema()); err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), // listens on 127.0.0.1
		kfake.SeedTopics(1, "bank.account", "bank.transaction"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	g := newGen(21)
	for range 1500 {
		g.txn()
	}
	recs := make([]*kgo.Record, 0, len(g.lines))
	for _, l := range g.lines {
		rec := &kgo.Record{Topic: l.topic, Value: []byte(l.value)}
		if l.key != "" {
			rec.Key = []byte(l.key)
		}
		recs = append(recs, rec)
	}
	produceCtx, stopProduce := context.WithTimeout(ctx, time.Minute)
	err = prod.ProduceSync(produceCtx, recs...).FirstErr()
	stopProduce()
	if err != nil {
		t.Fatal(err)
	}
	cps := FileCheckpoints{Path: filepath.Join(st.dir, "kafka.checkpoint")}
	rng := rand.New(rand.NewPCG(6, 6))
	for run := 0; ; run++ {
		if run > 100 {
			t.Fatal("never finished")
		}
		cp, err := cps.Load()
		if err != nil {
			t.Fatal(err)
		}
		src, err := cdc.OpenKafka(cdc.KafkaOptions{Brokers: cluster.ListenAddrs(), TopicRegex: `^bank\.`, Group: fmt.Sprintf("g%d", run)})
		if err != nil {
			t.Fatal(err)
		}
		// A fresh group reads everything again: crash somewhere past what
		// the checkpoint already covers.
		covered := 0
		if len(cp) > 0 {
			for _, off := range cp[0].Resume {
				covered += int(off)
			}
		}
		runCtx, cancel := context.WithCancel(ctx)
		// Kafka hands out one topic's records in large runs, so a crash
		// point must sometimes lie far enough for END markers to arrive.
		crash := &crashing{Source: src, n: covered + 1 + rng.IntN(len(g.lines)), cancel: cancel, finished: func() bool {
			w, _ := st.svc.Watermarks(ctx)
			return w.HWM == w.Next && w.HWM-1 >= uint64(g.txCount)
		}, state: func() string {
			w, _ := st.svc.Watermarks(ctx)
			return fmt.Sprintf("run %d, watermarks %+v, %d transactions in %d messages, started from %+v", run, w, g.txCount, len(g.lines), cp)
		}}
		s := st.newSink(t, crash, func(c *Config) { c.Checkpoints, c.Start = cps, cp })
		crash.sink = s
		err = s.Run(runCtx)
		cancel()
		src.Close()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("run %d: %v", run, err)
		}
		w, _ := st.svc.Watermarks(ctx)
		if got := st.rows(t, "account"); maps.Equal(got, g.oracle()) && w.HWM == w.Next {
			if run == 0 {
				t.Fatal("the first run finished the stream: no crash was exercised")
			}
			t.Logf("state equals the oracle after %d runs", run+1)
			return
		}
	}
}

func TestBadInputPolicies(t *testing.T) {
	st := newStack(t)
	ctx := context.Background()
	if _, err := st.cat.CreateTable(ctx, "customer", customerSchema()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(st.dir, "bad.jsonl")
	good := `{"op":"c","source":{"table":"customer"},"after":{"id":%d,"name":"x","balance":"BOI=","updated":1}}`
	os.WriteFile(path, []byte(fmt.Sprintf(good, 1)+"\n{\"op\":\"c\",\"source\":{\"table\":\"customer\"},\"after\":{\"id\":\"bad\"}}\n"+fmt.Sprintf(good, 2)+"\n"), 0o644)

	src, _ := cdc.OpenFileSource(path, cdc.FileOptions{})
	err := st.newSink(t, src, nil).Run(ctx)
	src.Close()
	if err == nil || !strings.Contains(err.Error(), "bad.jsonl@2") {
		t.Fatalf("fail policy: %v", err)
	}
	if rows := st.rows(t, "customer"); len(rows) != 1 {
		t.Fatalf("fail policy went past the bad line: %v", rows)
	}

	dead := filepath.Join(st.dir, "dead.jsonl")
	src, _ = cdc.OpenFileSource(path, cdc.FileOptions{Resume: map[string]int64{"file:" + path: 2}})
	s := st.newSink(t, src, func(c *Config) { c.BadInput, c.DeadLetterPath = DeadLetter, dead })
	if err := s.Run(ctx); err != nil {
		t.Fatal(err)
	}
	src.Close()
	if rows := st.rows(t, "customer"); len(rows) != 2 {
		t.Fatalf("dead-letter policy: %v", rows)
	}
	data, _ := os.ReadFile(dead)
	var dl struct {
		Position cdc.Position
		Reason   string
		Value    string
	}
	if err := json.Unmarshal(data, &dl); err != nil || dl.Position.Offset != 2 || !strings.Contains(dl.Reason, "id") || !strings.Contains(dl.Value, `"bad"`) {
		t.Fatalf("dead letter %q: %v", data, err)
	}
}

func TestTruncate(t *testing.T) {
	st := newStack(t)
	ctx := context.Background()
	if _, err := st.cat.CreateTable(ctx, "customer", customerSchema()); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range 50 {
		fmt.Fprintf(&b, `{"op":"c","source":{"table":"customer"},"after":{"id":%d,"name":"x","balance":"BOI=","updated":1}}`+"\n", i)
	}
	b.WriteString(`{"op":"t","source":{"table":"customer"}}` + "\n")
	b.WriteString(`{"op":"c","source":{"table":"customer"},"after":{"id":7,"name":"after","balance":null,"updated":null}}` + "\n")
	path := filepath.Join(st.dir, "trunc.jsonl")
	os.WriteFile(path, []byte(b.String()), 0o644)
	src, _ := cdc.OpenFileSource(path, cdc.FileOptions{})
	if err := st.newSink(t, src, nil).Run(ctx); err != nil {
		t.Fatal(err)
	}
	if rows := st.rows(t, "customer"); len(rows) != 1 || rows["7"] != "after|<nil>|<nil>" {
		t.Fatalf("after truncate: %v", rows)
	}
}
