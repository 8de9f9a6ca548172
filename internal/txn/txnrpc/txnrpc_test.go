package txnrpc

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/retinadb/retina/internal/txn"
	"github.com/retinadb/retina/internal/txn/txntest"
)

// serve starts svc on a loopback gRPC server and returns a client to it.
func serve(t *testing.T, svc txn.Service) *Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	Register(srv, svc)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := NewClient(conn, ClientOptions{Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { c.Close() })
	return c
}

func newLocal(t *testing.T) *txn.Local {
	t.Helper()
	fs, err := txn.OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	s, err := txn.NewLocal(t.Context(), fs, txn.Options{ReserveSize: 1 << 16, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestInvariantsOverGRPC(t *testing.T) {
	txntest.CheckInvariants(t, serve(t, newLocal(t)))
}

func TestErrorsKeepTheirIdentity(t *testing.T) {
	ctx := t.Context()
	c := serve(t, newLocal(t))
	r, err := c.BeginMirror(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CommitMirror(ctx, r.Last()+5); !errors.Is(err, txn.ErrNotAllocated) {
		t.Fatalf("commit of unallocated ts over gRPC: %v", err)
	}
	if err := c.CommitMirror(ctx, r.First, r.Last()); err != nil {
		t.Fatal(err)
	}
	if err := c.CommitMirror(ctx, r.First); !errors.Is(err, txn.ErrAlreadyCommitted) {
		t.Fatalf("double commit over gRPC: %v", err)
	}
	if err := c.EndQuery(ctx, 777); !errors.Is(err, txn.ErrUnknownQuery) {
		t.Fatalf("unknown handle over gRPC: %v", err)
	}
	w, err := c.WaitHWM(ctx, r.Last())
	if err != nil || w.HWM != r.Last()+1 {
		t.Fatalf("WaitHWM: %+v %v", w, err)
	}
}

// slowBegin delays BeginMirror and BeginQuery on the server side so a
// client call can be cancelled while its result is on the way.
type slowBegin struct {
	txn.Service
	delay time.Duration
}

func (s slowBegin) BeginMirror(ctx context.Context, n int) (txn.Range, error) {
	time.Sleep(s.delay)
	return s.Service.BeginMirror(ctx, n)
}

func (s slowBegin) BeginQuery(ctx context.Context) (txn.Query, error) {
	time.Sleep(s.delay)
	return s.Service.BeginQuery(ctx)
}

// TestCancelledCallsDoNotHoldWatermarks: a group begin or query whose caller
// gave up is abandoned or ended by the client, so HWM reaches Next and LWM
// reaches HWM − 1.
func TestCancelledCallsDoNotHoldWatermarks(t *testing.T) {
	local := newLocal(t)
	c := serve(t, slowBegin{Service: local, delay: 50 * time.Millisecond})
	short, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	if _, err := c.BeginMirror(short, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("BeginMirror: %v", err)
	}
	if _, err := c.BeginQuery(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("BeginQuery: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		w, err := local.Watermarks(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if w.Next == 11 && w.HWM == w.Next && w.Running == 0 && w.LWM == w.HWM-1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("watermarks held by cancelled calls: %+v", w)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCloseFinishesCleanups: closing the client right after a call gave up
// still undoes what the server did for it, before Close returns.
func TestCloseFinishesCleanups(t *testing.T) {
	local := newLocal(t)
	c := serve(t, slowBegin{Service: local, delay: 50 * time.Millisecond})
	short, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := c.BeginMirror(short, 10); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("BeginMirror: %v", err)
		}
	})
	wg.Go(func() {
		if _, err := c.BeginQuery(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("BeginQuery: %v", err)
		}
	})
	wg.Wait()
	c.Close() // the batch is still on the server
	w, err := local.Watermarks(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if w.Next != 11 || w.HWM != w.Next || w.Running != 0 || w.LWM != w.HWM-1 {
		t.Fatalf("after Close, cancelled calls still hold watermarks: %+v", w)
	}
}

func TestClosedClient(t *testing.T) {
	c := serve(t, newLocal(t))
	c.Close()
	if _, err := c.BeginMirror(t.Context(), 1); !errors.Is(err, txn.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}
