package txn

import (
	"context"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdStore keeps the bound under one etcd key and raises it with a
// transaction that compares the stored value, so of several services racing
// on the key exactly one wins each raise.
type EtcdStore struct {
	client *clientv3.Client
	key    string
}

// NewEtcdStore uses key on an existing client; the caller owns the client.
func NewEtcdStore(client *clientv3.Client, key string) *EtcdStore {
	return &EtcdStore{client: client, key: key}
}

// Load returns the stored bound, 0 when the key does not exist.
func (s *EtcdStore) Load(ctx context.Context) (uint64, error) {
	resp, err := s.client.Get(ctx, s.key)
	if err != nil {
		return 0, fmt.Errorf("txn: etcd get %s: %w", s.key, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return s.parse(resp.Kvs[0].Value)
}

func (s *EtcdStore) parse(v []byte) (uint64, error) {
	n, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("txn: etcd key %s holds %q, not a timestamp bound: %w", s.key, v, err)
	}
	return n, nil
}

// Raise compares-and-swaps the bound from prev to next.
func (s *EtcdStore) Raise(ctx context.Context, prev, next uint64) error {
	cmp := clientv3.Compare(clientv3.Value(s.key), "=", strconv.FormatUint(prev, 10))
	if prev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(s.key), "=", 0)
	}
	resp, err := s.client.Txn(ctx).
		If(cmp).
		Then(clientv3.OpPut(s.key, strconv.FormatUint(next, 10))).
		Else(clientv3.OpGet(s.key)).
		Commit()
	if err != nil {
		return fmt.Errorf("txn: etcd raise %s to %d: %w", s.key, next, err)
	}
	if resp.Succeeded {
		return nil
	}
	var current uint64
	if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
		if current, err = s.parse(rr.Kvs[0].Value); err != nil {
			return err
		}
	}
	return &ConflictError{Expected: prev, Current: current}
}
