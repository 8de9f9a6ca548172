package txn_test

import (
	"log/slog"
	"testing"

	"github.com/retinadb/retina/internal/etcdtest"
	"github.com/retinadb/retina/internal/txn"
	"github.com/retinadb/retina/internal/txn/txntest"
)

func openLocal(t *testing.T, store txn.Store) *txn.Local {
	t.Helper()
	s, err := txn.NewLocal(t.Context(), store, txn.Options{ReserveSize: 4096, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConcurrentInvariantsFileStore(t *testing.T) {
	fs, err := txn.OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	txntest.CheckInvariants(t, openLocal(t, fs))
}

func TestConcurrentInvariantsEtcd(t *testing.T) {
	txntest.CheckInvariants(t, openLocal(t, txn.NewEtcdStore(etcdtest.Start(t), "/retina/txn")))
}
