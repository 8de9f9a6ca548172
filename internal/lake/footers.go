package lake

import (
	"container/list"
	"sync"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/metadata"
)

// Footers keeps the tails of Parquet objects (footer and offset indexes,
// as one open reads them) and their parsed footers, bounded in bytes, the
// least recently used leaving first. Objects never change once written, so
// a file opened again, by every point lookup in it, skips the tail read
// and the footer parse. Safe for concurrent use.
type Footers struct {
	mu    sync.Mutex
	max   int64
	used  int64
	order *list.List // of *footer, most recently used first
	byKey map[string]*list.Element
}

// footer is one object's cached tail.
type footer struct {
	key  string
	size int64 // the object's
	tail []byte
	md   *metadata.FileMetaData
}

// NewFooters makes a cache of at most maxBytes of tails.
func NewFooters(maxBytes int64) *Footers {
	return &Footers{max: maxBytes, order: list.New(), byKey: map[string]*list.Element{}}
}

func (c *Footers) get(key string, size int64) (*footer, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok {
		return nil, false
	}
	f := el.Value.(*footer)
	if f.size != size { // not the object cached: forget it
		c.remove(el)
		return nil, false
	}
	c.order.MoveToFront(el)
	return f, true
}

func (c *Footers) put(f *footer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[f.key]; ok {
		c.remove(el)
	}
	if int64(len(f.tail)) > c.max {
		return
	}
	c.byKey[f.key] = c.order.PushFront(f)
	c.used += int64(len(f.tail))
	for c.used > c.max {
		c.remove(c.order.Back())
	}
}

func (c *Footers) remove(el *list.Element) {
	f := c.order.Remove(el).(*footer)
	delete(c.byKey, f.key)
	c.used -= int64(len(f.tail))
}

// Len is how many objects' tails the cache holds.
func (c *Footers) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// OpenFileCached is OpenFile of object key, its tail and footer taken from
// c when it has them and kept there when it does not.
func OpenFileCached(r parquet.ReaderAtSeeker, mem memory.Allocator, c *Footers, key string) (*File, error) {
	tr, err := newTailReader(r)
	if err != nil {
		return nil, err
	}
	if f, ok := c.get(key, tr.size); ok {
		tr.once.Do(func() { tr.tail = f.tail })
		return openTail(tr, mem, file.WithMetadata(f.md))
	}
	pf, err := openTail(tr, mem)
	if err == nil && tr.tail != nil {
		c.put(&footer{key: key, size: tr.size, tail: tr.tail, md: pf.pf.MetaData()})
	}
	return pf, err
}
