package cdc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestKafkaNextKeepsRecordsOfACutShortPoll polls with deadlines so short
// that they expire while a fetch is being handed over (half of the polls
// certainly so): every record must still arrive exactly once, in offset
// order per partition. Records come in batches, each produced only after a
// poll found nothing and was cut short.
func TestKafkaNextKeepsRecordsOfACutShortPoll(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), // listens on 127.0.0.1
		kfake.SeedTopics(2, "db.orders", "db.transaction"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a lost record shows as a stall
	defer cancel()
	src, err := OpenKafka(KafkaOptions{Brokers: cluster.ListenAddrs(), TopicRegex: `^db\.`, Group: "cut-short"})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	const batches, perTopic = 20, 150
	rng := rand.New(rand.NewPCG(1, 2))
	next := map[string]int64{} // stream → next expected offset
	got, cutShort := 0, 0
	for batch := range batches {
		var recs []*kgo.Record
		for i := range perTopic {
			for _, topic := range []string{"db.orders", "db.transaction"} {
				recs = append(recs, &kgo.Record{Topic: topic, Value: fmt.Appendf(nil, `{"batch":%d,"n":%d}`, batch, i)})
			}
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		want := got + len(recs)
		for got < want {
			if ctx.Err() != nil {
				t.Fatalf("received %d of %d records before the deadline (%d polls cut short)", got, want, cutShort)
			}
			var poll context.Context = &expiresDuringPoll{Context: ctx}
			stop := func() {}
			if rng.IntN(2) == 0 {
				poll, stop = context.WithTimeout(ctx, time.Duration(rng.IntN(2000))*time.Microsecond)
			}
			m, err := src.Next(poll)
			stop()
			if errors.Is(err, context.DeadlineExceeded) {
				cutShort++
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := next[m.Pos.Stream]; m.Pos.Offset != want {
				t.Fatalf("%s: offset %d, want %d (a record was lost or repeated)", m.Pos.Stream, m.Pos.Offset, want)
			}
			next[m.Pos.Stream]++
			got++
		}
		// Everything produced is in: this poll waits in the fetch until
		// its deadline, and the next batch must still arrive after it.
		poll, stop := context.WithTimeout(ctx, time.Millisecond)
		m, err := src.Next(poll)
		stop()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("after all %d records, a poll returned %+v, %v; want it cut short", got, m.Pos, err)
		}
		cutShort++
	}
	if len(next) != 4 {
		t.Fatalf("records came from %d partitions, want 4", len(next))
	}
	t.Logf("%d records, %d polls cut short", got, cutShort)
}

// expiresDuringPoll is a context whose deadline passes while it is in use:
// it is live when first asked, expired from then on, however quickly the
// poll returns. (Done stays the parent's: the poll still waits for data.)
type expiresDuringPoll struct {
	context.Context
	asked bool
}

func (c *expiresDuringPoll) Err() error {
	if !c.asked {
		c.asked = true
		return c.Context.Err()
	}
	return context.DeadlineExceeded
}

// TestKafkaOptionsRejected: a source without brokers or topics, or with a
// bad regex, is refused up front.
func TestKafkaOptionsRejected(t *testing.T) {
	for _, opts := range []KafkaOptions{
		{Topics: []string{"a"}},
		{Brokers: []string{"127.0.0.1:1"}},
		{Brokers: []string{"127.0.0.1:1"}, TopicRegex: "("},
	} {
		if _, err := OpenKafka(opts); err == nil {
			t.Errorf("%+v: accepted", opts)
		}
	}
}

// TestKafkaResumesAtCheckpointOffsets: a restart reads each partition from
// the replay checkpoint's offset, not from where the consumer group's
// committed offsets say (they can lag the checkpoint, or come from an older
// run); a partition the checkpoint does not know starts from the group's.
func TestKafkaResumesAtCheckpointOffsets(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "db.orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var recs []*kgo.Record
	for i := range 100 {
		for p := range int32(2) {
			recs = append(recs, &kgo.Record{Topic: "db.orders", Partition: p, Value: fmt.Appendf(nil, `{"n":%d}`, i)})
		}
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	p0, p1 := KafkaStream("db.orders", 0), KafkaStream("db.orders", 1)
	// An earlier run of the group committed 10 and 20.
	first, err := OpenKafka(KafkaOptions{Brokers: cluster.ListenAddrs(), Topics: []string{"db.orders"}, Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Next(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(ctx, map[string]int64{p0: 10, p1: 20}); err != nil {
		t.Fatal(err)
	}
	first.Close()
	src, err := OpenKafka(KafkaOptions{Brokers: cluster.ListenAddrs(), Topics: []string{"db.orders"}, Group: "g",
		Resume: map[string]int64{p0: 57}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	firstOff := map[string]int64{}
	for len(firstOff) < 2 {
		m, err := src.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, seen := firstOff[m.Pos.Stream]; !seen {
			firstOff[m.Pos.Stream] = m.Pos.Offset
		}
	}
	if firstOff[p0] != 57 || firstOff[p1] != 20 {
		t.Fatalf("started at %v, want %s at 57 (checkpoint) and %s at 20 (group)", firstOff, p0, p1)
	}
}
