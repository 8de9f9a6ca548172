package bench

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/sink"
	"github.com/retinadb/retina/internal/txn"
)

// SinkConfig sizes the sink benchmark.
type SinkConfig struct {
	DecodeEvents int // events decoded for decode_events_per_sec
	SinkRows     int // rows streamed file → sink → replayer
	TxnRows      int // rows per source transaction
	Seed         uint64
}

// DefaultSinkConfig decodes 1M events and streams 500K rows.
func DefaultSinkConfig() SinkConfig {
	return SinkConfig{DecodeEvents: 1_000_000, SinkRows: 500_000, TxnRows: 10, Seed: 1}
}

// debeziumTransfer writes one schemaless Debezium create event of the
// transfer table, as a MySQL connector with transaction metadata would.
func debeziumTransfer(b []byte, rng *rand.Rand, id int64, tx string, order int) []byte {
	unscaled := big.NewInt(rng.Int64N(10_000_000)).Bytes()
	if len(unscaled) == 0 || unscaled[0]&0x80 != 0 {
		unscaled = append([]byte{0}, unscaled...) // keep it positive
	}
	b = append(b, `{"before":null,"after":{"id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"source_id":`...)
	b = strconv.AppendInt(b, rng.Int64N(1_000_000), 10)
	b = append(b, `,"target_id":`...)
	b = strconv.AppendInt(b, rng.Int64N(1_000_000), 10)
	b = append(b, `,"amount":"`...)
	b = base64.StdEncoding.AppendEncode(b, unscaled)
	b = append(b, `","type":"`...)
	b = append(b, transferKinds[rng.IntN(len(transferKinds))]...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, 1_700_000_000_000_000+id*1000, 10)
	b = append(b, `,"note":null,"flagged":false,"day":`...)
	b = strconv.AppendInt(b, 19700+id%365, 10)
	b = append(b, `,"fee":`...)
	b = strconv.AppendFloat(b, math.Round(rng.Float64()*500)/100, 'f', -1, 64)
	b = append(b, `},"source":{"version":"2.7.0.Final","connector":"mysql","name":"bench","ts_ms":1700000000000,"db":"hybench","table":"transfer","server_id":1,"file":"mysql-bin.000001","pos":4},"op":"c","ts_ms":1700000000000,"transaction":{"id":"`...)
	b = append(b, tx...)
	b = append(b, `","total_order":`...)
	b = strconv.AppendInt(b, int64(order), 10)
	b = append(b, `,"data_collection_order":`...)
	b = strconv.AppendInt(b, int64(order), 10)
	return append(b, `}}`...)
}

// Sink measures Debezium decoding and the whole file → sink → replayer path.
func Sink(ctx context.Context, r *Report, cfg SinkConfig) error {
	dir, store, cat, closeAll, err := benchLake(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	_, err = cat.CreateTable(ctx, "transfer", catalog.Schema{Columns: transferColumns(), PrimaryKey: []string{"id"}})
	if err != nil {
		return err
	}
	quiet := slog.New(slog.DiscardHandler)

	// Decoding: every core decodes its share of pre-built messages.
	rng := rand.New(rand.NewPCG(cfg.Seed, 8))
	msgs := make([][]byte, 1<<14)
	for i := range msgs {
		msgs[i] = debeziumTransfer(nil, rng, int64(i), "gtid:1", i+1)
	}
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	errs := make([]error, workers)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			d := cdc.NewDecoder(cat.Snapshot(), quiet, cdc.DecoderOptions{})
			for i := w; i < cfg.DecodeEvents; i += workers {
				if _, err := d.Decode(cdc.Message{Pos: cdc.Position{Stream: "bench", Offset: int64(i)}, Value: msgs[i%len(msgs)]}); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	drate := float64(cfg.DecodeEvents) / time.Since(start).Seconds()
	r.Printf("decode: %d Debezium JSON events (10-column transfer rows, ~%d bytes), %d goroutines: %.2f M events/s",
		cfg.DecodeEvents, len(msgs[0]), workers, drate/1e6)
	r.Set("decode_events_per_sec", math.Round(drate))

	// The pipeline: a file of transactions through the real sink.
	path := dir + "/stream.jsonl"
	if err := writeTransferStream(path, rng, cfg); err != nil {
		return err
	}
	idx, err := index.Open(index.Config{Backend: "memory", Logger: quiet})
	if err != nil {
		return err
	}
	defer idx.Close()
	fs, err := txn.OpenFileStore(dir + "/txn")
	if err != nil {
		return err
	}
	defer fs.Close()
	svc, err := txn.NewLocal(ctx, fs, txn.Options{Logger: quiet})
	if err != nil {
		return err
	}
	defer svc.Close()
	rp, err := replay.New(replay.Config{ID: 0, Catalog: cat, Index: idx, Lake: store, Logger: quiet})
	if err != nil {
		return err
	}
	defer rp.Close(context.Background())
	src, err := cdc.OpenFileSource(path, cdc.FileOptions{})
	if err != nil {
		return err
	}
	defer src.Close()
	s, err := sink.New(sink.Config{Sources: []cdc.Source{src}, Catalog: cat, Txn: svc, Replayers: []sink.Replayer{rp}, Logger: quiet})
	if err != nil {
		return err
	}
	start = time.Now()
	if err := s.Run(ctx); err != nil {
		return err
	}
	srate := float64(cfg.SinkRows) / time.Since(start).Seconds()
	st := s.Stats()
	w, _ := svc.Watermarks(ctx)
	r.Printf("sink: %d rows in %d transactions, file → decode → assemble → group begin → replay (memory index) → group commit: %.0fK rows/s (HWM %d)",
		cfg.SinkRows, st.Transactions, srate/1e3, w.HWM)
	r.Set("sink_rows_per_sec", math.Round(srate))
	if got := rp.Stats().Inserts; got != uint64(cfg.SinkRows) {
		return fmt.Errorf("replayed %d rows of %d", got, cfg.SinkRows)
	}
	return nil
}

func writeTransferStream(path string, rng *rand.Rand, cfg SinkConfig) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var b []byte
	for id := 0; id < cfg.SinkRows; {
		tx := "bench:" + strconv.Itoa(id)
		n := min(cfg.TxnRows, cfg.SinkRows-id)
		fmt.Fprintf(w, `{"status":"BEGIN","id":"%s","event_count":null,"data_collections":null}`+"\n", tx)
		for o := 1; o <= n; o++ {
			b = debeziumTransfer(b[:0], rng, int64(id), tx, o)
			w.Write(b)
			w.WriteByte('\n')
			id++
		}
		fmt.Fprintf(w, `{"status":"END","id":"%s","event_count":%d,"data_collections":[{"data_collection":"hybench.transfer","event_count":%d}]}`+"\n", tx, n, n)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
