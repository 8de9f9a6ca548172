package txnrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/retinadb/retina/internal/txn"
	"github.com/retinadb/retina/proto/txnpb"
)

// ClientOptions tune the batching client.
type ClientOptions struct {
	// InFlight is how many batch RPCs may be outstanding at once (default 4).
	InFlight int
	// MaxBatch caps the calls in one batch (default 1024).
	MaxBatch int
	// RPCTimeout bounds one batch RPC (default 10s).
	RPCTimeout time.Duration
	Logger     *slog.Logger
}

// Client implements txn.Service over a gRPC connection. Concurrent calls are
// queued and sent together: each of InFlight senders takes whatever calls
// are waiting, up to MaxBatch, as one Batch RPC.
type Client struct {
	rpc   txnpb.TxnClient
	opts  ClientOptions
	calls chan *call
	stop  chan struct{}
	wg    sync.WaitGroup
	// cleanups are the RPCs that undo a group begin or query begin whose
	// caller gave up waiting; Close waits for them.
	cleanups sync.WaitGroup

	mu     sync.RWMutex // enqueues hold it shared; Close takes it exclusively
	closed bool
}

var _ txn.Service = (*Client)(nil)

type callKind uint8

const (
	kindBegin callKind = iota
	kindCommit
	kindAbandon
	kindBeginQuery
	kindEndQuery
)

const (
	callPending int32 = iota
	callDone
	callAbandoned // the caller gave up waiting
)

type call struct {
	kind   callKind
	n      uint32
	ts     []uint64
	handle uint64 // EndQuery's argument, BeginQuery's result

	first, snapshot uint64
	err             error
	state           atomic.Int32
	done            chan struct{}
}

// NewClient starts a batching client on conn; the caller owns conn.
func NewClient(conn grpc.ClientConnInterface, opts ClientOptions) *Client {
	if opts.InFlight <= 0 {
		opts.InFlight = 4
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 1024
	}
	if opts.RPCTimeout <= 0 {
		opts.RPCTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	c := &Client{
		rpc:   txnpb.NewTxnClient(conn),
		opts:  opts,
		calls: make(chan *call, opts.MaxBatch*opts.InFlight),
		stop:  make(chan struct{}),
	}
	for range opts.InFlight {
		c.wg.Go(c.sender)
	}
	return c
}

// Close stops the senders; calls made afterwards fail with txn.ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if !c.closed {
		// Every call enqueued before this point is sent or drained by the
		// senders, which only stop after seeing stop closed.
		c.closed = true
		close(c.stop)
	}
	c.mu.Unlock()
	c.wg.Wait() // no sender is left to start a cleanup
	c.cleanups.Wait()
	return nil
}

func (c *Client) sender() {
	batch := make([]*call, 0, c.opts.MaxBatch)
	for {
		select {
		case first := <-c.calls:
			batch = append(batch[:0], first)
		case <-c.stop:
			c.drainClosed()
			return
		}
	fill:
		for len(batch) < c.opts.MaxBatch {
			select {
			case more := <-c.calls:
				batch = append(batch, more)
			default:
				break fill
			}
		}
		c.send(batch)
	}
}

// drainClosed fails the calls still queued at Close.
func (c *Client) drainClosed() {
	for {
		select {
		case cl := <-c.calls:
			c.complete(cl, func() { cl.err = txn.ErrClosed })
		default:
			return
		}
	}
}

func (c *Client) send(batch []*call) {
	req := &txnpb.BatchRequest{}
	for _, cl := range batch {
		switch cl.kind {
		case kindBegin:
			req.BeginMirror = append(req.BeginMirror, cl.n)
		case kindCommit:
			req.Commit = append(req.Commit, &txnpb.TimestampList{Ts: cl.ts})
		case kindAbandon:
			req.Abandon = append(req.Abandon, &txnpb.TimestampList{Ts: cl.ts})
		case kindBeginQuery:
			req.BeginQuery++
		case kindEndQuery:
			req.EndQuery = append(req.EndQuery, cl.handle)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.RPCTimeout)
	resp, err := c.rpc.Batch(ctx, req)
	cancel()
	if err == nil {
		err = checkShape(req, resp)
	}
	var ib, ic, ia, iq, ie int
	for _, cl := range batch {
		if err != nil {
			c.complete(cl, func() { cl.err = fmt.Errorf("txn rpc: %w", err) })
			continue
		}
		switch cl.kind {
		case kindBegin:
			r := resp.BeginMirror[ib]
			ib++
			c.complete(cl, func() { cl.first, cl.err = r.First, fromStatus(r.Status) })
		case kindCommit:
			st := resp.Commit[ic]
			ic++
			c.complete(cl, func() { cl.err = fromStatus(st) })
		case kindAbandon:
			st := resp.Abandon[ia]
			ia++
			c.complete(cl, func() { cl.err = fromStatus(st) })
		case kindBeginQuery:
			r := resp.BeginQuery[iq]
			iq++
			c.complete(cl, func() { cl.snapshot, cl.handle, cl.err = r.Snapshot, r.Handle, fromStatus(r.Status) })
		case kindEndQuery:
			st := resp.EndQuery[ie]
			ie++
			c.complete(cl, func() { cl.err = fromStatus(st) })
		}
	}
}

func checkShape(req *txnpb.BatchRequest, resp *txnpb.BatchResponse) error {
	if len(resp.BeginMirror) != len(req.BeginMirror) || len(resp.Commit) != len(req.Commit) ||
		len(resp.Abandon) != len(req.Abandon) || len(resp.BeginQuery) != int(req.BeginQuery) ||
		len(resp.EndQuery) != len(req.EndQuery) {
		return fmt.Errorf("batch response does not match its request")
	}
	return nil
}

// complete records a result, or cleans up after a caller that gave up: a
// group begin nobody will commit is abandoned and a query nobody will end is
// ended, so HWM and LWM are not held back by a cancelled call.
func (c *Client) complete(cl *call, set func()) {
	set()
	if cl.state.CompareAndSwap(callPending, callDone) {
		close(cl.done)
		return
	}
	if cl.err != nil {
		return
	}
	switch cl.kind {
	case kindBegin:
		ts := make([]uint64, cl.n)
		for i := range ts {
			ts[i] = cl.first + uint64(i)
		}
		c.cleanups.Go(func() { c.cleanup(&txnpb.BatchRequest{Abandon: []*txnpb.TimestampList{{Ts: ts}}}) })
	case kindBeginQuery:
		c.cleanups.Go(func() { c.cleanup(&txnpb.BatchRequest{EndQuery: []uint64{cl.handle}}) })
	}
}

// cleanup sends its own RPC rather than queueing a call: it runs on behalf
// of a sender and must still go out while Close stops the senders.
func (c *Client) cleanup(req *txnpb.BatchRequest) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.RPCTimeout)
	defer cancel()
	resp, err := c.rpc.Batch(ctx, req)
	if err == nil {
		err = checkShape(req, resp)
	}
	if err == nil {
		for _, st := range append(resp.Abandon, resp.EndQuery...) {
			err = errors.Join(err, fromStatus(st))
		}
	}
	if err != nil {
		c.opts.Logger.Warn("txn client: cleanup after a cancelled call failed", "err", err)
	}
}

// do queues a call and waits for its result.
func (c *Client) do(ctx context.Context, cl *call) error {
	cl.done = make(chan struct{})
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return txn.ErrClosed
	}
	select {
	case c.calls <- cl:
	case <-ctx.Done():
		c.mu.RUnlock()
		return ctx.Err()
	}
	c.mu.RUnlock()
	select {
	case <-cl.done:
		return cl.err
	case <-ctx.Done():
		if cl.state.CompareAndSwap(callPending, callAbandoned) {
			return ctx.Err()
		}
		<-cl.done // the result arrived at the same moment: use it
		return cl.err
	}
}

// BeginMirror implements txn.Service.
func (c *Client) BeginMirror(ctx context.Context, n int) (txn.Range, error) {
	if n <= 0 || n > 1<<20 {
		return txn.Range{}, fmt.Errorf("%w: group size %d", txn.ErrInvalidArgument, n)
	}
	cl := &call{kind: kindBegin, n: uint32(n)}
	if err := c.do(ctx, cl); err != nil {
		return txn.Range{}, err
	}
	return txn.Range{First: cl.first, N: n}, nil
}

// CommitMirror implements txn.Service. If ctx ends while the call is on the
// wire, the commit may still be applied: retry it, and treat
// txn.ErrAlreadyCommitted on the retry as success.
func (c *Client) CommitMirror(ctx context.Context, ts ...uint64) error {
	if len(ts) == 0 {
		return nil
	}
	return c.do(ctx, &call{kind: kindCommit, ts: ts})
}

// AbandonMirror implements txn.Service.
func (c *Client) AbandonMirror(ctx context.Context, ts ...uint64) error {
	if len(ts) == 0 {
		return nil
	}
	return c.do(ctx, &call{kind: kindAbandon, ts: ts})
}

// BeginQuery implements txn.Service.
func (c *Client) BeginQuery(ctx context.Context) (txn.Query, error) {
	cl := &call{kind: kindBeginQuery}
	if err := c.do(ctx, cl); err != nil {
		return txn.Query{}, err
	}
	return txn.Query{Snapshot: cl.snapshot, Handle: cl.handle}, nil
}

// EndQuery implements txn.Service.
func (c *Client) EndQuery(ctx context.Context, handle uint64) error {
	return c.do(ctx, &call{kind: kindEndQuery, handle: handle})
}

// Watermarks implements txn.Service.
func (c *Client) Watermarks(ctx context.Context) (txn.Watermarks, error) {
	w, err := c.rpc.Watermarks(ctx, &txnpb.WatermarksRequest{})
	if err != nil {
		return txn.Watermarks{}, rpcError(err)
	}
	return fromWatermarks(w), nil
}

// WaitHWM implements txn.Service.
func (c *Client) WaitHWM(ctx context.Context, ts uint64) (txn.Watermarks, error) {
	w, err := c.rpc.WaitHWM(ctx, &txnpb.WaitHWMRequest{Ts: ts})
	if err != nil {
		return txn.Watermarks{}, rpcError(err)
	}
	return fromWatermarks(w), nil
}

// rpcError maps gRPC's deadline and cancellation codes back to the context
// errors they stand for, so callers can test them with errors.Is.
func rpcError(err error) error {
	switch status.Code(err) {
	case codes.DeadlineExceeded:
		return fmt.Errorf("txn rpc: %w", context.DeadlineExceeded)
	case codes.Canceled:
		return fmt.Errorf("txn rpc: %w", context.Canceled)
	}
	return fmt.Errorf("txn rpc: %w", err)
}
