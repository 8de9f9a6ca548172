// Package txnrpc serves a txn.Service over gRPC and provides the client that
// implements txn.Service on top of it, coalescing concurrent calls into
// batches.
package txnrpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"

	"github.com/retinadb/retina/internal/txn"
	"github.com/retinadb/retina/proto/txnpb"
)

// Register serves svc on s.
func Register(s *grpc.Server, svc txn.Service) {
	txnpb.RegisterTxnServer(s, &server{svc: svc})
}

type server struct {
	txnpb.UnimplementedTxnServer
	svc txn.Service
}

func (s *server) Batch(ctx context.Context, req *txnpb.BatchRequest) (*txnpb.BatchResponse, error) {
	resp := &txnpb.BatchResponse{
		BeginMirror: make([]*txnpb.BeginResult, len(req.BeginMirror)),
		Commit:      make([]*txnpb.Status, len(req.Commit)),
		Abandon:     make([]*txnpb.Status, len(req.Abandon)),
		BeginQuery:  make([]*txnpb.QueryResult, req.BeginQuery),
		EndQuery:    make([]*txnpb.Status, len(req.EndQuery)),
	}
	// Commits first: they can only move HWM forward for the queries below.
	for i, l := range req.Commit {
		resp.Commit[i] = toStatus(s.svc.CommitMirror(ctx, l.Ts...))
	}
	for i, l := range req.Abandon {
		resp.Abandon[i] = toStatus(s.svc.AbandonMirror(ctx, l.Ts...))
	}
	for i, n := range req.BeginMirror {
		r, err := s.svc.BeginMirror(ctx, int(n))
		resp.BeginMirror[i] = &txnpb.BeginResult{First: r.First, Status: toStatus(err)}
	}
	for i := range resp.BeginQuery {
		q, err := s.svc.BeginQuery(ctx)
		resp.BeginQuery[i] = &txnpb.QueryResult{Snapshot: q.Snapshot, Handle: q.Handle, Status: toStatus(err)}
	}
	for i, h := range req.EndQuery {
		resp.EndQuery[i] = toStatus(s.svc.EndQuery(ctx, h))
	}
	return resp, nil
}

func (s *server) Watermarks(ctx context.Context, _ *txnpb.WatermarksRequest) (*txnpb.WatermarksResponse, error) {
	w, err := s.svc.Watermarks(ctx)
	if err != nil {
		return nil, err
	}
	return toWatermarks(w), nil
}

func (s *server) WaitHWM(ctx context.Context, req *txnpb.WaitHWMRequest) (*txnpb.WatermarksResponse, error) {
	w, err := s.svc.WaitHWM(ctx, req.Ts)
	if err != nil {
		return nil, err
	}
	return toWatermarks(w), nil
}

func toWatermarks(w txn.Watermarks) *txnpb.WatermarksResponse {
	return &txnpb.WatermarksResponse{Hwm: w.HWM, Lwm: w.LWM, Next: w.Next, Running: uint32(w.Running)}
}

func fromWatermarks(w *txnpb.WatermarksResponse) txn.Watermarks {
	return txn.Watermarks{HWM: w.Hwm, LWM: w.Lwm, Next: w.Next, Running: int(w.Running)}
}

// codes pairs each sentinel error with its wire code.
var wireCodes = []struct {
	err  error
	code txnpb.Code
}{
	{txn.ErrNotAllocated, txnpb.Code_NOT_ALLOCATED},
	{txn.ErrAlreadyCommitted, txnpb.Code_ALREADY_COMMITTED},
	{txn.ErrUnknownQuery, txnpb.Code_UNKNOWN_QUERY},
	{txn.ErrInvalidArgument, txnpb.Code_INVALID_ARGUMENT},
	{txn.ErrExhausted, txnpb.Code_EXHAUSTED},
	{txn.ErrClosed, txnpb.Code_CLOSED},
	{txn.ErrFenced, txnpb.Code_FENCED},
}

func toStatus(err error) *txnpb.Status {
	if err == nil {
		return nil
	}
	for _, c := range wireCodes {
		if errors.Is(err, c.err) {
			return &txnpb.Status{Code: c.code, Message: err.Error()}
		}
	}
	return &txnpb.Status{Code: txnpb.Code_INTERNAL, Message: err.Error()}
}

// remoteError keeps the server's message and unwraps to the sentinel, so
// errors.Is works the same in process and over gRPC.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

func fromStatus(st *txnpb.Status) error {
	if st == nil || st.Code == txnpb.Code_OK {
		return nil
	}
	for _, c := range wireCodes {
		if c.code == st.Code {
			return &remoteError{msg: st.Message, sentinel: c.err}
		}
	}
	return fmt.Errorf("txn server: %s", st.Message)
}
