package lake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// faultyS3 is an S3-compatible server on 127.0.0.1 whose first failN
// requests answer 503 SlowDown, or every request 403 when deny is set.
type faultyS3 struct {
	failN    atomic.Int64
	deny     atomic.Bool
	requests atomic.Int64
}

// startS3 runs gofakes3 (an in-process S3 implementation) behind a fault
// injecting handler and returns a bucket URL for it.
func startS3(t testing.TB) (string, *faultyS3) {
	t.Helper()
	backend := s3mem.New()
	if err := backend.CreateBucket("lake"); err != nil {
		t.Fatal(err)
	}
	faker := gofakes3.New(backend, gofakes3.WithLogger(gofakes3.DiscardLog()))
	f := &faultyS3{}
	inner := faker.Server()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		if f.deny.Load() {
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `<?xml version="1.0"?><Error><Code>AccessDenied</Code><Message>denied by test</Message></Error>`)
			return
		}
		if f.failN.Add(-1) >= 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `<?xml version="1.0"?><Error><Code>SlowDown</Code><Message>injected</Message></Error>`)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	// gofakes3 sends the whole object's checksum with range reads, which the
	// SDK would reject; real S3 sends none for ranges.
	return fmt.Sprintf("s3://lake?region=us-east-1&endpoint=%s&use_path_style=true&disable_https=true&response_checksum_validation=when_required", srv.URL), f
}

type backendCase struct {
	name string
	url  func(t *testing.T) string
}

func backendCases() []backendCase {
	return []backendCase{
		{"file", func(t *testing.T) string { return "file://" + t.TempDir() + "/lake" }},
		{"mem", func(t *testing.T) string { return "mem://" }},
		{"s3", func(t *testing.T) string { u, _ := startS3(t); return u }},
	}
}

func openTestStore(t *testing.T, url string, retry RetryPolicy) *Store {
	t.Helper()
	if retry.BaseDelay == 0 {
		retry.BaseDelay = time.Millisecond
	}
	s, err := Open(context.Background(), url, Options{Retry: retry, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStoreOperations(t *testing.T) {
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			ctx := context.Background()
			s := openTestStore(t, bc.url(t), RetryPolicy{})
			data := bytes.Repeat([]byte("0123456789"), 1000)
			if err := s.Put(ctx, "t/1/a.parquet", data); err != nil {
				t.Fatal(err)
			}
			got, err := s.Get(ctx, "t/1/a.parquet")
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("get: %d bytes, %v", len(got), err)
			}
			part, err := s.ReadRange(ctx, "t/1/a.parquet", 9985, 10)
			if err != nil || string(part) != "5678901234" {
				t.Fatalf("range read: %q %v", part, err)
			}
			if size, err := s.Size(ctx, "t/1/a.parquet"); err != nil || size != int64(len(data)) {
				t.Fatalf("size: %d %v", size, err)
			}
			if err := s.PutIfAbsent(ctx, "t/1/a.parquet", []byte("x")); !errors.Is(err, ErrExists) {
				t.Fatalf("conditional create over an existing key: %v", err)
			}
			if err := s.PutIfAbsent(ctx, "t/1/b.parquet", []byte("b")); err != nil {
				t.Fatal(err)
			}
			if err := s.Put(ctx, "t/2/c.parquet", []byte("c")); err != nil {
				t.Fatal(err)
			}
			if err := s.Put(ctx, "t/2/empty", nil); err != nil {
				t.Fatal(err)
			}
			if got, err := s.Get(ctx, "t/2/empty"); err != nil || len(got) != 0 {
				t.Fatalf("get of an empty object: %d bytes, %v", len(got), err)
			}
			if got, err := s.Get(ctx, "t/1/b.parquet"); err != nil || string(got) != "b" {
				t.Fatalf("get of a one-byte object: %q, %v", got, err)
			}
			list, err := s.List(ctx, "t/1/")
			if err != nil {
				t.Fatal(err)
			}
			keys := []string{}
			for _, o := range list {
				keys = append(keys, o.Key)
			}
			if !slices.Equal(keys, []string{"t/1/a.parquet", "t/1/b.parquet"}) {
				t.Fatalf("list: %v", keys)
			}
			if err := s.Delete(ctx, "t/1/a.parquet"); err != nil {
				t.Fatal(err)
			}
			_, err = s.Get(ctx, "t/1/a.parquet")
			if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "t/1/a.parquet") {
				t.Fatalf("get after delete: %v", err)
			}
			for op, err := range map[string]error{
				"range read": func() error { _, err := s.ReadRange(ctx, "t/1/a.parquet", 0, 1); return err }(),
				"size":       func() error { _, err := s.Size(ctx, "t/1/a.parquet"); return err }(),
			} {
				if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "t/1/a.parquet") {
					t.Fatalf("%s after delete: %v", op, err)
				}
			}
			if err := s.Delete(ctx, "t/1/a.parquet"); err != nil {
				t.Fatalf("deleting a missing object: %v", err)
			}
			// Random access for the Parquet reader.
			r, err := s.ReaderAt(ctx, "t/1/b.parquet")
			if err != nil || r.Size() != 1 {
				t.Fatalf("reader: %v", err)
			}
		})
	}
}

// TestTransientFailuresAreRetried: file and mem with injected failures
// before attempts; S3 with a server answering 503 to the first requests.
func TestTransientFailuresAreRetried(t *testing.T) {
	for _, bc := range backendCases()[:2] {
		t.Run(bc.name, func(t *testing.T) {
			var fails atomic.Int64
			fails.Store(3)
			transient := errors.New("injected: connection reset")
			s := openTestStore(t, bc.url(t), RetryPolicy{Attempts: 5, FaultCheck: func(op, key string) error {
				if fails.Add(-1) >= 0 {
					return transient
				}
				return nil
			}})
			if err := s.Put(context.Background(), "k", []byte("v")); err != nil {
				t.Fatalf("put through 3 transient failures: %v", err)
			}
			fails.Store(10)
			err := s.Put(context.Background(), "k2", []byte("v"))
			if !errors.Is(err, transient) || !strings.Contains(err.Error(), `"k2"`) {
				t.Fatalf("after exhausting retries: %v", err)
			}
		})
	}
	t.Run("s3", func(t *testing.T) {
		url, faults := startS3(t)
		s := openTestStore(t, url, RetryPolicy{Attempts: 8})
		faults.failN.Store(5)
		if err := s.Put(context.Background(), "k", []byte("v")); err != nil {
			t.Fatalf("put through 5 injected 503s: %v", err)
		}
		if got, err := s.Get(context.Background(), "k"); err != nil || string(got) != "v" {
			t.Fatalf("get: %q %v", got, err)
		}
		if faults.requests.Load() < 7 {
			t.Fatalf("only %d requests: the failures were not retried", faults.requests.Load())
		}
	})
}

func TestPermanentFailureSurfaces(t *testing.T) {
	url, faults := startS3(t)
	s := openTestStore(t, url, RetryPolicy{Attempts: 6})
	faults.deny.Store(true)
	start := faults.requests.Load()
	err := s.Put(context.Background(), "secret/key", []byte("v"))
	if err == nil || !strings.Contains(err.Error(), "secret/key") {
		t.Fatalf("put against a denying server: %v", err)
	}
	// Access denied is not retried by our layer (the SDK may try a few times).
	if n := faults.requests.Load() - start; n > 4 {
		t.Fatalf("a permanent failure was retried %d times", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	faults.deny.Store(false)
	if err := s.Put(ctx, "k", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled put: %v", err)
	}
}

// TestLocalDir: only a file:// bucket names a directory other readers can
// open objects in.
func TestLocalDir(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, "file://"+dir, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, ok := s.LocalDir(); !ok || got != dir {
		t.Fatalf("file:// bucket: LocalDir() = %q, %v; want %q", got, ok, dir)
	}
	m, err := Open(ctx, "mem://", Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got, ok := m.LocalDir(); ok {
		t.Fatalf("mem:// bucket: LocalDir() = %q, true", got)
	}
}

// TestLocalPath: keys that name themselves map into the directory; others
// (escaped by the blob store, or leaving the directory) do not.
func TestLocalPath(t *testing.T) {
	for key, ok := range map[string]bool{
		"t1/f12.parquet": true, "t1/b00000001.arrow": true, "checkpoint/CURRENT": true,
		"": false, "../x": false, "t1/../../x": false, "t1//f": false, "a b": false, "t1/é": false, "/abs": false,
	} {
		path, got := LocalPath("/lake", key)
		if got != ok {
			t.Errorf("LocalPath(%q) = %q, %v; want ok %v", key, path, got, ok)
		}
		if got && path != "/lake/"+key {
			t.Errorf("LocalPath(%q) = %q", key, path)
		}
	}
	if _, ok := LocalPath("", "t1/f1.parquet"); ok {
		t.Error("a bucket without a directory has no local paths")
	}
}
