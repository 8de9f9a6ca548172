// Package lake is Retina's system of record: object storage (file://,
// mem:// and s3:// through one blob API) and the columnar file format
// (Parquet with the hidden create-timestamp column).
package lake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// URLs
	_ "gocloud.dev/blob/memblob"  // mem:// URLs
	_ "gocloud.dev/blob/s3blob"   // s3:// URLs
	"gocloud.dev/gcerrors"
)

// Errors callers branch on; every error also names the object key.
var (
	ErrNotFound = errors.New("lake: object not found")
	ErrExists   = errors.New("lake: object already exists")
)

// RetryPolicy bounds retries of transient failures.
type RetryPolicy struct {
	Attempts   int           // tries in all, ≥ 1 (default 6)
	BaseDelay  time.Duration // first backoff, doubled each retry (default 50ms)
	MaxDelay   time.Duration // backoff ceiling (default 2s)
	OpTimeout  time.Duration // one attempt (default 60s)
	FaultCheck func(op, key string) error
}

// withDefaults fills the unset fields.
func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.Attempts <= 0 {
		p.Attempts = 6
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = 50 * time.Millisecond
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = 2 * time.Second
	}
	if p.OpTimeout <= 0 {
		p.OpTimeout = 60 * time.Second
	}
	return p
}

// Backoff is the wait before try attempt+1 after attempt failures: the base
// delay doubled per failure, up to the ceiling. Callers that retry a whole
// job after the store gave up (a write buffer's flush) wait by it too, so
// one policy paces every retry of the lake.
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	p = p.withDefaults()
	d := p.BaseDelay
	for i := 1; i < attempt && d < p.MaxDelay; i++ {
		d *= 2
	}
	return min(d, p.MaxDelay)
}

// Options configure a Store.
type Options struct {
	Retry  RetryPolicy
	Logger *slog.Logger
}

// Store is one bucket of objects, addressed by key.
type Store struct {
	bucket *blob.Bucket
	url    string
	dir    string    // a file:// bucket's directory: range reads go straight to its files
	maps   *mappings // of a file:// bucket's objects (mapped.go)
	retry  RetryPolicy
	log    *slog.Logger
}

// Open opens a bucket URL:
//
//	file:///abs/dir         a local directory (created if missing)
//	mem://                  an in-memory bucket (tests, demos)
//	s3://bucket?region=R&endpoint=http://host:port&use_path_style=true
//	                        S3 or an S3-compatible server; credentials come
//	                        from the usual AWS environment and files. A server
//	                        that sends whole-object checksums with range reads
//	                        needs response_checksum_validation=when_required.
func Open(ctx context.Context, bucketURL string, opts Options) (*Store, error) {
	u, err := url.Parse(bucketURL)
	if err != nil {
		return nil, fmt.Errorf("lake: bad bucket URL %q: %w", bucketURL, err)
	}
	openURL, dir := bucketURL, ""
	if u.Scheme == "file" {
		dir = filepath.Clean(u.Path)
		// Temp files beside the target keep the final rename on one file
		// system; no sidecar metadata files next to the Parquet files.
		q := u.Query()
		for k, v := range map[string]string{"create_dir": "1", "no_tmp_dir": "1", "metadata": "skip"} {
			if !q.Has(k) {
				q.Set(k, v)
			}
		}
		if err := os.MkdirAll(u.Path, 0o755); err != nil {
			return nil, fmt.Errorf("lake: create %s: %w", u.Path, err)
		}
		u.RawQuery = q.Encode()
		openURL = u.String()
	}
	b, err := blob.OpenBucket(ctx, openURL)
	if err != nil {
		return nil, fmt.Errorf("lake: open %s: %w", bucketURL, err)
	}
	r := opts.Retry.withDefaults()
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Store{bucket: b, url: bucketURL, dir: dir, maps: newMappings(defaultMappedObjects), retry: r, log: opts.Logger}, nil
}

// Retry is the store's retry policy.
func (s *Store) Retry() RetryPolicy { return s.retry }

// LocalDir is the directory of a file:// bucket, where other readers
// (DuckDB's Parquet reader) can open its objects by path; false for any
// other bucket.
func (s *Store) LocalDir() (string, bool) { return s.dir, s.dir != "" }

// LocalPath is the path of object key in a file:// bucket; false for other
// buckets and keys the bucket may not store under their own name.
func (s *Store) LocalPath(key string) (string, bool) { return LocalPath(s.dir, key) }

// LocalPath is the path of object key in the file:// bucket at dir, for
// keys such a bucket stores under their own name (letters, digits, '.',
// '_', '-' and '/' between segments that are not all dots, as every key
// Retina writes); false otherwise.
func LocalPath(dir, key string) (string, bool) {
	if dir == "" || key == "" {
		return "", false
	}
	for _, seg := range strings.Split(key, "/") {
		if strings.Trim(seg, ".") == "" {
			return "", false
		}
		for _, c := range seg {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return "", false
			}
		}
	}
	return filepath.Join(dir, filepath.FromSlash(key)), true
}

// URL is the bucket URL the store was opened with.
func (s *Store) URL() string { return s.url }

// ObjectURI is the absolute URI other engines open object key by:
// file:///dir/key for a file:// bucket, s3://bucket/[prefix]key for S3. An
// in-memory bucket has none (other processes cannot read it), and neither
// has a key a file:// bucket does not store under its own name.
func (s *Store) ObjectURI(key string) (string, bool) {
	u, err := url.Parse(s.url)
	if err != nil {
		return "", false
	}
	switch u.Scheme {
	case "file":
		path, ok := s.LocalPath(key)
		if !ok {
			return "", false
		}
		return (&url.URL{Scheme: "file", Path: filepath.ToSlash(path)}).String(), true
	case "s3":
		return "s3://" + u.Host + "/" + strings.TrimPrefix(u.Query().Get("prefix"), "/") + key, true
	}
	return "", false
}

// Close releases the bucket and unmaps its objects.
func (s *Store) Close() error {
	s.maps.closeAll()
	return s.bucket.Close()
}

// MappedObjects is how many objects of a file:// bucket are mapped for
// reading now.
func (s *Store) MappedObjects() int { return s.maps.len() }

// permanent reports errors that a retry cannot fix.
func permanent(err error) bool {
	switch gcerrors.Code(err) {
	case gcerrors.NotFound, gcerrors.AlreadyExists, gcerrors.FailedPrecondition,
		gcerrors.InvalidArgument, gcerrors.PermissionDenied, gcerrors.Unimplemented, gcerrors.Canceled:
		return true
	}
	return errors.Is(err, context.Canceled) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrExists)
}

// do runs one attempt-able operation with timeouts and backoff.
func (s *Store) do(ctx context.Context, op, key string, attempt func(context.Context) error) error {
	var err error
	for try := 1; ; try++ {
		if s.retry.FaultCheck != nil {
			err = s.retry.FaultCheck(op, key)
		} else {
			err = nil
		}
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, s.retry.OpTimeout)
			err = attempt(actx)
			cancel()
		}
		if err == nil {
			return nil
		}
		err = classify(err)
		if permanent(err) || try >= s.retry.Attempts || ctx.Err() != nil {
			break
		}
		s.log.Warn("lake: retrying", "op", op, "key", key, "attempt", try, "err", err)
		// Full jitter keeps many writers from retrying in step.
		delay := s.retry.Backoff(try)
		select {
		case <-time.After(time.Duration(rand.Int64N(int64(delay))) + delay/2):
		case <-ctx.Done():
			return fmt.Errorf("lake: %s %q: %w (last error: %v)", op, key, ctx.Err(), err)
		}
	}
	return fmt.Errorf("lake: %s %q in %s: %w", op, key, s.url, err)
}

func classify(err error) error {
	switch gcerrors.Code(err) {
	case gcerrors.NotFound:
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case gcerrors.AlreadyExists, gcerrors.FailedPrecondition:
		return fmt.Errorf("%w: %w", ErrExists, err)
	}
	return err
}

// Put writes an object, replacing any with the same key.
func (s *Store) Put(ctx context.Context, key string, data []byte) error {
	return s.do(ctx, "put", key, func(ctx context.Context) error {
		return s.write(ctx, key, data, &blob.WriterOptions{})
	})
}

// PutNew writes an object under a fresh key that nothing reads until the
// writer names it (a file a later commit makes current). In a local bucket
// it is written in place, without the temporary file and rename Put needs
// to replace an object whole, which cost a third of a small object's
// write on this kind of disk; a crash may leave it partly written, named
// by nothing, for the writer's own sweep. Elsewhere it is Put.
func (s *Store) PutNew(ctx context.Context, key string, data []byte) error {
	path, ok := s.LocalPath(key)
	if !ok {
		return s.Put(ctx, key, data)
	}
	return s.do(ctx, "put-new", key, func(ctx context.Context) error {
		defer s.maps.forget(key)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return os.WriteFile(path, data, 0o644)
	})
}

// NewObject streams a new object under a fresh key, as PutNew writes one:
// in place in a local bucket, uploaded as it is written elsewhere. Close
// commits it; Abort drops what was written. It does not retry: a failed
// write fails the whole object.
type NewObject struct {
	key    string
	f      *os.File
	w      *blob.Writer
	cancel context.CancelFunc
	size   int64
	store  *Store
}

// CreateNew starts a new object.
func (s *Store) CreateNew(ctx context.Context, key string) (*NewObject, error) {
	o := &NewObject{key: key, store: s}
	if path, ok := s.LocalPath(key); ok {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, fmt.Errorf("lake: create %q: %w", key, err)
		}
		f, err := os.Create(path)
		if err != nil {
			return nil, fmt.Errorf("lake: create %q: %w", key, err)
		}
		o.f = f
		return o, nil
	}
	ctx, o.cancel = context.WithCancel(ctx)
	w, err := s.bucket.NewWriter(ctx, key, &blob.WriterOptions{})
	if err != nil {
		o.cancel()
		return nil, fmt.Errorf("lake: create %q in %s: %w", key, s.url, classify(err))
	}
	o.w = w
	return o, nil
}

func (o *NewObject) Write(p []byte) (int, error) {
	var n int
	var err error
	if o.f != nil {
		n, err = o.f.Write(p)
	} else {
		n, err = o.w.Write(p)
	}
	o.size += int64(n)
	if err != nil {
		return n, fmt.Errorf("lake: write %q: %w", o.key, err)
	}
	return n, nil
}

// Size is how many bytes were written.
func (o *NewObject) Size() int64 { return o.size }

// Close commits the object.
func (o *NewObject) Close() error {
	defer o.store.maps.forget(o.key)
	var err error
	if o.f != nil {
		err = o.f.Close()
	} else {
		err = o.w.Close()
		o.cancel()
	}
	if err != nil {
		o.Abort()
		return fmt.Errorf("lake: finish %q: %w", o.key, err)
	}
	return nil
}

// Abort drops the object.
func (o *NewObject) Abort() {
	if o.f != nil {
		o.f.Close()
		os.Remove(o.f.Name())
		return
	}
	o.cancel() // a cancelled upload commits nothing
	o.w.Close()
}

// PutIfAbsent writes an object only if the key is free; otherwise it fails
// with an error wrapping ErrExists. All three backends support the check.
func (s *Store) PutIfAbsent(ctx context.Context, key string, data []byte) error {
	return s.do(ctx, "put-if-absent", key, func(ctx context.Context) error {
		return s.write(ctx, key, data, &blob.WriterOptions{IfNotExist: true})
	})
}

// write writes one object whole. It sends no Content-MD5: Bucket.WriteAll
// would hash every object twice (once for the header, once to check the
// bytes written against it, from the same slice), a twentieth of a
// write-buffer flush's CPU. S3's client checksums every upload itself
// (CRC32). A write that fails is cancelled before Close, so nothing is
// committed under the key.
func (s *Store) write(ctx context.Context, key string, data []byte, opts *blob.WriterOptions) error {
	defer s.maps.forget(key) // after the new file is in place
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.bucket.NewWriter(ctx, key, opts)
	if err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		cancel()
		w.Close()
		return err
	}
	return w.Close()
}

// Get reads a whole object.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	var data []byte
	err := s.do(ctx, "get", key, func(ctx context.Context) error {
		r, err := s.bucket.NewReader(ctx, key, nil)
		if err != nil {
			return err
		}
		defer r.Close()
		// One buffer of the object's size: reading to EOF into a growing
		// one cost more than the read itself (copies and zeroing).
		buf := make([]byte, r.Size()+1)
		n, err := io.ReadFull(r, buf)
		switch {
		case err == nil:
			return fmt.Errorf("the object grew past its size %d while read", r.Size())
		case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF): // EOF: nothing read
			if int64(n) != r.Size() {
				return fmt.Errorf("read %d bytes of %d", n, r.Size())
			}
			data = buf[:n]
			return nil
		}
		return err
	})
	return data, err
}

// ReadRange reads n bytes at offset off of an object.
func (s *Store) ReadRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	buf := make([]byte, n)
	if err := s.readInto(ctx, key, buf, off, false); err != nil {
		return nil, err
	}
	return buf, nil
}

// readInto reads len(p) bytes at offset off of an object into p; of a
// local object from its mapping if mapped says so.
func (s *Store) readInto(ctx context.Context, key string, p []byte, off int64, mapped bool) error {
	return s.do(ctx, "read-range", key, func(ctx context.Context) error {
		if path, ok := s.LocalPath(key); ok {
			if !mapped {
				// Skips the blob API's reader and its attribute lookups.
				return readLocal(path, p, off)
			}
			mp, err := s.maps.acquire(key, path)
			if err != nil {
				return err
			}
			defer s.maps.release(mp)
			return mp.readAt(p, off)
		}
		r, err := s.bucket.NewRangeReader(ctx, key, off, int64(len(p)), nil)
		if err != nil {
			return err
		}
		defer r.Close()
		if _, err := io.ReadFull(r, p); err != nil {
			return fmt.Errorf("read %d bytes at %d: %w", len(p), off, err)
		}
		return nil
	})
}

// readLocal reads len(p) bytes at off of a file into p.
func readLocal(path string, p []byte, off int64) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	} else if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.ReadAt(p, off); err != nil {
		return fmt.Errorf("read %d bytes at %d: %w", len(p), off, err)
	}
	return nil
}

// mappedSize is the length of an object of a file:// bucket, from its
// mapping (mapped now if it was not).
func (s *Store) mappedSize(ctx context.Context, key, path string) (int64, error) {
	var size int64
	err := s.do(ctx, "stat", key, func(ctx context.Context) error {
		mp, err := s.maps.acquire(key, path)
		if err != nil {
			return err
		}
		size = int64(mp.r.Len())
		s.maps.release(mp)
		return nil
	})
	return size, err
}

// Size returns an object's length in bytes.
func (s *Store) Size(ctx context.Context, key string) (int64, error) {
	var size int64
	err := s.do(ctx, "stat", key, func(ctx context.Context) error {
		if path, ok := s.LocalPath(key); ok {
			fi, err := os.Stat(path)
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%w: %w", ErrNotFound, err)
			} else if err != nil {
				return err
			}
			size = fi.Size()
			return nil
		}
		a, err := s.bucket.Attributes(ctx, key)
		if err != nil {
			return err
		}
		size = a.Size
		return nil
	})
	return size, err
}

// Delete removes an object; deleting a missing object is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	err := s.do(ctx, "delete", key, func(ctx context.Context) error {
		defer s.maps.forget(key)
		return s.bucket.Delete(ctx, key)
	})
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// ObjectInfo describes a listed object.
type ObjectInfo struct {
	Key  string
	Size int64
}

// List returns the objects whose keys start with prefix, in key order.
func (s *Store) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	var out []ObjectInfo
	err := s.do(ctx, "list", prefix+"*", func(ctx context.Context) error {
		out = out[:0]
		it := s.bucket.List(&blob.ListOptions{Prefix: prefix})
		for {
			obj, err := it.Next(ctx)
			if errors.Is(err, io.EOF) {
				return nil
			}
			if gcerrors.Code(err) == gcerrors.NotFound {
				// An object went between the walk and its stat (a local
				// upload renames its temporary file): list again.
				return fmt.Errorf("an object vanished during the listing: %s", err.Error())
			}
			if err != nil {
				return err
			}
			if !obj.IsDir && !strings.HasSuffix(obj.Key, ".attrs") {
				out = append(out, ObjectInfo{Key: obj.Key, Size: obj.Size})
			}
		}
	})
	return out, err
}

// ReaderAt returns random access to an object through range reads, for the
// Parquet reader: it fetches the footer first and then only the column
// chunks asked for.
func (s *Store) ReaderAt(ctx context.Context, key string) (*ObjectReader, error) {
	size, err := s.Size(ctx, key)
	if err != nil {
		return nil, err
	}
	return &ObjectReader{ctx: ctx, store: s, key: key, size: size}, nil
}

// MappedReaderAt is ReaderAt for many small reads (point lookups): a local
// object is read where it is mapped (mapped.go), without a system call per
// read. Scans use ReaderAt: their reads are few and large, and the pages a
// mapping touches count as the process's own resident memory.
func (s *Store) MappedReaderAt(ctx context.Context, key string) (*ObjectReader, error) {
	path, ok := s.LocalPath(key)
	if !ok {
		return s.ReaderAt(ctx, key)
	}
	size, err := s.mappedSize(ctx, key, path)
	if err != nil {
		return nil, err
	}
	return &ObjectReader{ctx: ctx, store: s, key: key, size: size, mapped: true}, nil
}

// ObjectReader reads an object by ranges. It implements io.ReaderAt and
// io.ReadSeeker, which is what the Parquet reader needs.
type ObjectReader struct {
	ctx    context.Context
	store  *Store
	key    string
	size   int64
	mapped bool // reads come from the object's mapping (MappedReaderAt)
	pos    int64
	reads  atomic.Int64 // range requests made, for tests and metrics
	bytes  atomic.Int64 // bytes they returned
}

// Size is the object's length.
func (r *ObjectReader) Size() int64 { return r.size }

// Local reports an object of a file:// bucket, where reads cost little.
func (r *ObjectReader) Local() bool { return r.store.dir != "" }

// Reads is how many range requests the reader made.
func (r *ObjectReader) Reads() int { return int(r.reads.Load()) }

// BytesRead is how many bytes those requests returned.
func (r *ObjectReader) BytesRead() int64 { return r.bytes.Load() }

// ReadAt reads len(p) bytes at off. Reads may run in parallel.
func (r *ObjectReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= r.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), r.size-off)
	err := r.store.readInto(r.ctx, r.key, p[:n], off, r.mapped)
	r.reads.Add(1)
	if err != nil {
		return 0, err
	}
	r.bytes.Add(n)
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// Read reads from the current position.
func (r *ObjectReader) Read(p []byte) (int, error) {
	n, err := r.ReadAt(p, r.pos)
	r.pos += int64(n)
	return n, err
}

// Seek moves the position.
func (r *ObjectReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.pos
	case io.SeekEnd:
		offset += r.size
	default:
		return 0, fmt.Errorf("lake: bad whence %d", whence)
	}
	if offset < 0 {
		return 0, fmt.Errorf("lake: seek to %d in %q", offset, r.key)
	}
	r.pos = offset
	return offset, nil
}
