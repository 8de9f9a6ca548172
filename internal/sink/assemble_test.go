package sink

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
)

type oneTable map[string]*catalog.Table

func (m oneTable) Table(name string) (*catalog.Table, bool) { t, ok := m[name]; return t, ok }

// TestInterleavingsGiveTheSameTransactions: the same transactions, with the
// data topic and the transaction topic merged in different orders (BEGIN
// after the data, END before it, duplicates), come out the same and in the
// same order.
func TestInterleavingsGiveTheSameTransactions(t *testing.T) {
	g := newGen(3)
	for range 60 {
		g.txn()
	}
	tb := &catalog.Table{ID: 1, Name: "account", PrimaryIndexID: 1, Schema: accountSchema()}
	dec := cdc.NewDecoder(oneTable{"account": tb}, quiet(), cdc.DecoderOptions{})
	var data, meta []cdc.Record
	var nd, nm int64
	for _, l := range g.lines {
		pos := cdc.Position{Stream: "kafka:" + l.topic + "/0"}
		if l.topic == "bank.transaction" {
			nm++
			pos.Offset = nm
		} else {
			nd++
			pos.Offset = nd
		}
		r, err := dec.Decode(cdc.Message{Pos: pos, Key: []byte(orNull(l.key)), Value: []byte(l.value)})
		if err != nil {
			t.Fatal(err)
		}
		if l.topic == "bank.transaction" {
			meta = append(meta, r)
		} else {
			data = append(data, r)
		}
	}
	run := func(order []cdc.Record) []string {
		a := newAssembler(100)
		var out []string
		for _, r := range order {
			if err := a.add(r); err != nil {
				t.Fatal(err)
			}
			for _, tx := range a.take() {
				var ps []string
				for _, c := range tx.Changes {
					ps = append(ps, c.Pos.String())
				}
				out = append(out, fmt.Sprint(tx.ID, ps))
			}
		}
		if len(a.open) != 0 {
			t.Fatalf("%d transactions left open", len(a.open))
		}
		return out
	}
	want := run(merge(data, meta, nil))
	if len(want) != 60 {
		t.Fatalf("%d transactions, want 60", len(want))
	}
	rng := rand.New(rand.NewPCG(9, 9))
	orders := map[string][]cdc.Record{
		"metadata first": append(slices.Clone(meta), data...),
		"data first":     append(slices.Clone(data), meta...),
		"random merge":   merge(data, meta, rng),
		"redelivered":    append(merge(data, meta, rng), data[:40]...),
		// Changes out of total_order, and copies of them, before any END.
		"shuffled, metadata last":             append(shuffled(data, rng), meta...),
		"shuffled with copies, metadata last": append(shuffled(append(slices.Clone(data), data[:40]...), rng), meta...),
	}
	for name, order := range orders {
		if got := run(order); !slices.Equal(got, want) {
			t.Fatalf("%s: transactions differ\n got %v\nwant %v", name, got[:min(3, len(got))], want[:3])
		}
	}
}

func shuffled(rs []cdc.Record, rng *rand.Rand) []cdc.Record {
	out := slices.Clone(rs)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// merge interleaves two ordered streams; nil rng alternates strictly.
func merge(a, b []cdc.Record, rng *rand.Rand) []cdc.Record {
	var out []cdc.Record
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		takeA := j >= len(b) || (i < len(a) && (rng == nil && (i+j)%2 == 0 || rng != nil && rng.IntN(2) == 0))
		if takeA {
			out = append(out, a[i])
			i++
		} else {
			out = append(out, b[j])
			j++
		}
	}
	return out
}
