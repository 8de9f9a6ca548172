// Package etcdtest starts a real single-member etcd server inside a test
// process, on 127.0.0.1 random ports and a temporary directory.
package etcdtest

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/retinadb/retina/internal/etcdembed"
)

// Start runs an embedded etcd for the test and returns a client to it. Both
// are closed when the test ends.
func Start(t testing.TB) *clientv3.Client {
	t.Helper()
	s, err := etcdembed.Start(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s.Client()
}
