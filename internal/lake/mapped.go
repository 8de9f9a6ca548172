package lake

import (
	"container/list"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"

	"golang.org/x/exp/mmap"
)

// Point reads of a file:// bucket's objects (MappedReaderAt) go through
// read-only memory mappings: a range read is a copy out of the page cache,
// not an open, a pread and a close. A point lookup reads a dozen ranges
// from inside a DuckDB callback, where every system call may wait for the
// Go scheduler to hand a processor back (milliseconds on two cores).
//
// An object never changes in place: a write renames a new file over its
// key, and a delete unlinks it, which leaves a mapping of the old file
// whole. The store drops a key's mapping when it writes or deletes the key;
// readers still in it finish on the old object.

// defaultMappedObjects bounds the objects kept mapped; the least recently
// read is unmapped first, once no read is in it.
const defaultMappedObjects = 512

// mappings is the store's set of mapped objects. Safe for concurrent use.
type mappings struct {
	mu    sync.Mutex
	max   int
	order *list.List // of *mapping, most recently read first
	byKey map[string]*list.Element
	// writes counts the keys written or deleted; a mapping made while one
	// was may be of the file before it, and is used once, not kept.
	writes uint64
}

// mapping is one mapped object.
type mapping struct {
	key  string
	r    *mmap.ReaderAt
	refs int // reads in it, plus one while the set keeps it
}

func newMappings(max int) *mappings {
	return &mappings{max: max, order: list.New(), byKey: map[string]*list.Element{}}
}

// acquire returns the mapping of the object at path, mapping it on first
// use; release gives it back.
func (m *mappings) acquire(key, path string) (*mapping, error) {
	m.mu.Lock()
	if el, ok := m.byKey[key]; ok {
		mp := el.Value.(*mapping)
		mp.refs++
		m.order.MoveToFront(el)
		m.mu.Unlock()
		return mp, nil
	}
	writes := m.writes
	m.mu.Unlock()
	r, err := mmap.Open(path) // outside the lock: a few system calls
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
	} else if err != nil {
		return nil, err
	}
	mp := &mapping{key: key, r: r, refs: 1}
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.byKey[key]; ok && m.writes == writes { // mapped meanwhile
		r.Close()
		mp = el.Value.(*mapping)
		mp.refs++
		m.order.MoveToFront(el)
		return mp, nil
	}
	if m.writes != writes {
		return mp, nil // not kept: released after this read
	}
	mp.refs++
	m.byKey[key] = m.order.PushFront(mp)
	for m.order.Len() > m.max {
		m.drop(m.order.Back())
	}
	return mp, nil
}

func (m *mappings) release(mp *mapping) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unref(mp)
}

// forget drops key's mapping once the store has written or deleted the
// key; a mapping being made meanwhile is not kept (writes).
func (m *mappings) forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writes++
	if el, ok := m.byKey[key]; ok {
		m.drop(el)
	}
}

// closeAll drops every mapping; reads still in one finish first.
func (m *mappings) closeAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.order.Len() > 0 {
		m.drop(m.order.Back())
	}
}

// len is how many objects are mapped and kept.
func (m *mappings) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.order.Len()
}

func (m *mappings) drop(el *list.Element) {
	mp := m.order.Remove(el).(*mapping)
	delete(m.byKey, mp.key)
	m.unref(mp)
}

func (m *mappings) unref(mp *mapping) {
	if mp.refs--; mp.refs == 0 {
		mp.r.Close()
	}
}

// readAt copies len(p) bytes at off of a mapped object into p.
func (mp *mapping) readAt(p []byte, off int64) error {
	if n, err := mp.r.ReadAt(p, off); n < len(p) {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read %d bytes at %d of %d: %w", len(p), off, mp.r.Len(), err)
	}
	return nil
}
