package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/retinadb/retina/internal/etcdembed"
	"github.com/retinadb/retina/internal/txn"
	"github.com/retinadb/retina/internal/txn/txnrpc"
)

// TxnConfig sizes the transaction-service benchmark.
type TxnConfig struct {
	Group      int           // timestamps per group begin
	Duration   time.Duration // per throughput figure
	Workers    int           // goroutines for in-process figures; 0 = GOMAXPROCS
	RPCWorkers int           // goroutines calling through the gRPC client
	Reserves   int           // etcd range reservations timed
}

// DefaultTxnConfig finishes in about fifteen seconds.
func DefaultTxnConfig() TxnConfig {
	return TxnConfig{Group: 64, Duration: 3 * time.Second, RPCWorkers: 64, Reserves: 200}
}

// Txn measures group begin+commit and query begin+end in process, begin+
// commit through the batching gRPC client over loopback, and the latency of
// one durable range reservation against embedded etcd.
func Txn(ctx context.Context, r *Report, cfg TxnConfig) error {
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	dir, err := os.MkdirTemp("", "retina-bench-txn-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fs, err := txn.OpenFileStore(dir)
	if err != nil {
		return err
	}
	defer fs.Close()
	quiet := slog.New(slog.DiscardHandler)
	local, err := txn.NewLocal(ctx, fs, txn.Options{Logger: quiet})
	if err != nil {
		return err
	}
	defer local.Close()
	r.Set("group", cfg.Group)

	rate, err := beginCommitRate(ctx, local, cfg.Group, cfg.Workers, cfg.Duration)
	if err != nil {
		return err
	}
	r.Printf("in process: group begin of %d + commit, %d goroutines: %.2f M txn/s", cfg.Group, cfg.Workers, rate/1e6)
	r.Set("inproc_begin_commit_per_sec", math.Round(rate))

	qrate, err := queryRate(ctx, local, cfg.Workers, cfg.Duration)
	if err != nil {
		return err
	}
	r.Printf("in process: BeginQuery + EndQuery, %d goroutines: %.2f M/s", cfg.Workers, qrate/1e6)
	r.Set("inproc_query_begin_end_per_sec", math.Round(qrate))

	grate, err := grpcRate(ctx, local, cfg, quiet)
	if err != nil {
		return err
	}
	r.Printf("gRPC over loopback, batching client: group begin of %d + commit, %d goroutines: %.2f M txn/s", cfg.Group, cfg.RPCWorkers, grate/1e6)
	r.Set("grpc_begin_commit_per_sec", math.Round(grate))

	// A store of its own: the service above still owns the first one.
	fs2, err := txn.OpenFileStore(dir + "/reserve")
	if err != nil {
		return err
	}
	defer fs2.Close()
	fileMS, err := reserveLatency(ctx, fs2, cfg.Reserves)
	if err != nil {
		return err
	}
	r.Printf("file store: one range reservation (write, fsync, rename, dir fsync): %.3f ms", fileMS)
	r.Set("file_reserve_ms", math.Round(fileMS*1000)/1000)

	etcdDir, err := os.MkdirTemp("", "retina-bench-etcd-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(etcdDir)
	etcd, err := etcdembed.Start(ctx, etcdDir)
	if err != nil {
		return err
	}
	defer etcd.Close()
	etcdMS, err := reserveLatency(ctx, txn.NewEtcdStore(etcd.Client(), "/retina/bench/txn"), cfg.Reserves)
	if err != nil {
		return err
	}
	r.Printf("embedded etcd: one range reservation (compare-and-swap txn): %.3f ms", etcdMS)
	r.Set("etcd_reserve_ms", math.Round(etcdMS*1000)/1000)
	return nil
}

// runWorkers runs op in n goroutines (w = 0..n-1) for d and returns how many
// units the ops reported per second.
func runWorkers(ctx context.Context, n int, d time.Duration, op func(ctx context.Context, w int) (int, error)) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var total atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, n)
	start := time.Now()
	for w := range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				units, err := op(ctx, w)
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				total.Add(int64(units))
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return 0, err
	}
	return float64(total.Load()) / el.Seconds(), nil
}

func beginCommitRate(ctx context.Context, svc txn.Service, group, workers int, d time.Duration) (float64, error) {
	return runWorkers(ctx, workers, d, func(ctx context.Context, _ int) (int, error) {
		rg, err := svc.BeginMirror(ctx, group)
		if err != nil {
			return 0, err
		}
		ts := make([]uint64, rg.N)
		for i := range ts {
			ts[i] = rg.First + uint64(i)
		}
		// The commit is not cancelled with the run: a group begun is finished.
		return rg.N, svc.CommitMirror(context.Background(), ts...)
	})
}

func queryRate(ctx context.Context, svc txn.Service, workers int, d time.Duration) (float64, error) {
	return runWorkers(ctx, workers, d, func(ctx context.Context, _ int) (int, error) {
		q, err := svc.BeginQuery(ctx)
		if err != nil {
			return 0, err
		}
		return 1, svc.EndQuery(context.Background(), q.Handle)
	})
}

func grpcRate(ctx context.Context, local *txn.Local, cfg TxnConfig, log *slog.Logger) (float64, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srv := grpc.NewServer()
	txnrpc.Register(srv, local)
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	client := txnrpc.NewClient(conn, txnrpc.ClientOptions{Logger: log})
	defer client.Close()
	return beginCommitRate(ctx, client, cfg.Group, cfg.RPCWorkers, cfg.Duration)
}

// reserveLatency times sequential raises of the reserved bound.
func reserveLatency(ctx context.Context, store txn.Store, n int) (float64, error) {
	cur, err := store.Load(ctx)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	for i := range n {
		next := cur + txn.DefaultReserveSize
		if err := store.Raise(ctx, cur, next); err != nil {
			return 0, fmt.Errorf("reservation %d: %w", i, err)
		}
		cur = next
	}
	return float64(time.Since(start).Microseconds()) / 1000 / float64(n), nil
}
