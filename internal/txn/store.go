package txn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/retinadb/retina/internal/durable"
)

// Store persists the reserved bound: no timestamp at or above it has ever
// been handed out. Raising it is a compare-and-swap so that two services
// sharing one store never both win a range.
type Store interface {
	// Load returns the current bound, 0 when none was ever stored.
	Load(ctx context.Context) (uint64, error)
	// Raise sets the bound to next if it is still prev, durably, before
	// returning. If it is not, it returns a *ConflictError.
	Raise(ctx context.Context, prev, next uint64) error
}

// ErrConflict is wrapped by *ConflictError.
var ErrConflict = errors.New("txn: reserved bound changed by another service")

// ConflictError reports a lost compare-and-swap on the reserved bound.
type ConflictError struct {
	Expected, Current uint64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%v: expected %d, found %d", ErrConflict, e.Expected, e.Current)
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

const (
	fileStoreName  = "txn-reserved"
	fileStoreLock  = "txn.lock"
	fileStoreMagic = "RTXN"
	fileStoreSize  = 4 + 2 + 2 + 8 + 4
)

// FileStore keeps the bound in a small file in the data directory, replaced
// by write-to-temp, fsync, rename and directory fsync, so a crash leaves
// either the old or the new bound. An exclusive lock on the directory keeps a
// second process from using the same file.
type FileStore struct {
	dir  string
	lock *os.File

	mu      sync.Mutex
	current uint64
}

// OpenFileStore opens (creating if needed) the store in dir.
func OpenFileStore(dir string) (*FileStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("txn: create %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, fileStoreLock), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("txn: open lock file: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("txn: %s is in use by another process: %w", dir, err)
	}
	s := &FileStore{dir: dir, lock: lock}
	if s.current, err = s.read(); err != nil {
		lock.Close()
		return nil, err
	}
	return s, nil
}

func (s *FileStore) path() string { return filepath.Join(s.dir, fileStoreName) }

func (s *FileStore) read() (uint64, error) {
	data, err := os.ReadFile(s.path())
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("txn: read %s: %w", s.path(), err)
	}
	return decodeBound(data, s.path())
}

func encodeBound(v uint64) []byte {
	b := make([]byte, 0, fileStoreSize)
	b = append(b, fileStoreMagic...)
	b = binary.LittleEndian.AppendUint16(b, 1) // format version
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint64(b, v)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

func decodeBound(data []byte, name string) (uint64, error) {
	switch {
	case len(data) != fileStoreSize:
		return 0, fmt.Errorf("txn: %s: %d bytes, want %d", name, len(data), fileStoreSize)
	case string(data[:4]) != fileStoreMagic:
		return 0, fmt.Errorf("txn: %s: bad magic %q", name, data[:4])
	case binary.LittleEndian.Uint16(data[4:]) != 1:
		return 0, fmt.Errorf("txn: %s: unsupported version %d", name, binary.LittleEndian.Uint16(data[4:]))
	case crc32.Checksum(data[:16], crc32.MakeTable(crc32.Castagnoli)) != binary.LittleEndian.Uint32(data[16:]):
		return 0, fmt.Errorf("txn: %s: checksum mismatch", name)
	}
	return binary.LittleEndian.Uint64(data[8:]), nil
}

// Load returns the stored bound.
func (s *FileStore) Load(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current, nil
}

// Raise replaces the bound atomically and durably.
func (s *FileStore) Raise(_ context.Context, prev, next uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current != prev {
		return &ConflictError{Expected: prev, Current: s.current}
	}
	if err := durable.WriteFile(s.path(), encodeBound(next)); err != nil {
		return fmt.Errorf("txn: reserve up to %d: %w", next, err)
	}
	s.current = next
	return nil
}

// Close releases the directory lock.
func (s *FileStore) Close() error { return s.lock.Close() }
