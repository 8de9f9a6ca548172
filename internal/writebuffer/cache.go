package writebuffer

import (
	"container/list"
	"sync"
	"sync/atomic"

	"github.com/apache/arrow-go/v18/arrow"
)

// BlockCache keeps the decoded records of flushed blocks in memory, up to
// a byte budget shared by every buffer of a node, so scans of a file still
// filling read its newest blocks from memory instead of reading and
// decoding their objects again. It evicts the blocks flushed longest ago
// first: every scan of a file touches all its blocks in order, and
// least-recently-used would evict exactly the block the next scan needs
// first. Safe for concurrent use; its lock is taken after a buffer's.
type BlockCache struct {
	budget int64

	mu    sync.Mutex
	bytes int64
	order *list.List // *cacheEntry, oldest flush first

	hits, misses atomic.Uint64
}

// NewBlockCache makes a cache of up to budget bytes.
func NewBlockCache(budget int64) *BlockCache {
	return &BlockCache{budget: budget, order: list.New()}
}

// CacheStats describe a block cache.
type CacheStats struct {
	Bytes, Budget int64
	Hits, Misses  uint64 // flushed blocks a view found in memory, or not
}

// Stats reports the cache's size and hit counts.
func (c *BlockCache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Bytes: c.bytes, Budget: c.budget, Hits: c.hits.Load(), Misses: c.misses.Load()}
}

// cacheEntry is one flushed block's records while cached.
type cacheEntry struct {
	elem  *list.Element
	bytes int64

	mu   sync.Mutex
	recs []arrow.RecordBatch // nil once evicted
}

// add caches a flushed block's records, taking over the caller's
// references, and evicts the oldest blocks beyond the budget.
func (c *BlockCache) add(recs []arrow.RecordBatch, bytes int64) *cacheEntry {
	e := &cacheEntry{recs: recs, bytes: bytes}
	c.mu.Lock()
	defer c.mu.Unlock()
	e.elem = c.order.PushBack(e)
	c.bytes += bytes
	for c.bytes > c.budget && c.order.Len() > 0 {
		c.dropLocked(c.order.Front().Value.(*cacheEntry))
	}
	return e
}

// remove drops an entry (its block's objects are going).
func (c *BlockCache) remove(e *cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(e)
}

func (c *BlockCache) dropLocked(e *cacheEntry) {
	if e.elem == nil {
		return
	}
	c.order.Remove(e.elem)
	e.elem = nil
	c.bytes -= e.bytes
	e.mu.Lock()
	for _, r := range e.recs {
		r.Release() // views hold their own references
	}
	e.recs = nil
	e.mu.Unlock()
}

// borrow returns the cached records with a reference each for the
// caller, or nil once evicted, counting nothing: the buffer's own
// combination uses it (hits and misses measure scans).
func (c *BlockCache) borrow(e *cacheEntry) []arrow.RecordBatch {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.recs == nil {
		return nil
	}
	out := make([]arrow.RecordBatch, len(e.recs))
	for i, r := range e.recs {
		r.Retain()
		out[i] = r
	}
	return out
}

// retain is borrow for a scan: it counts the hit or miss.
func (c *BlockCache) retain(e *cacheEntry) []arrow.RecordBatch {
	recs := c.borrow(e)
	if recs == nil {
		c.misses.Add(1)
	} else {
		c.hits.Add(1)
	}
	return recs
}
