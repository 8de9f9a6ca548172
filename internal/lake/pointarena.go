package lake

import (
	"math/bits"
	"sync"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// A point read decodes a page of every projected column to return one
// row: made afresh, its buffers came to about 2 MB a lookup, and fresh heap
// memory costs a page fault per 4 KiB the first time it is touched (a
// third of a lookup's CPU under perf, on a virtual machine). A
// pointArena takes those buffers from pools shared by all point reads and
// gives every one back when its read ends, after the row has been copied
// out (copyRow). Until then Free does nothing, so a buffer the Parquet
// reader frees while a slice of it is still in use stays intact.

const (
	arenaMinClass = 6  // 64 B, Arrow's buffer alignment; power-of-two Go allocations this size and up are aligned to it
	arenaMaxClass = 22 // 4 MiB; larger buffers are made for the read and left to the collector
)

// arenaPools holds free buffers by size class (1<<class bytes). A
// sync.Pool, like fmt's printer pool: it holds no state a caller can
// observe, and the collector empties what goes unused.
var arenaPools [arenaMaxClass + 1]sync.Pool

// pointArena is the allocator of one point read.
type pointArena struct {
	mu   sync.Mutex
	held [][]byte // full-class buffers handed out, returned by release
}

var _ memory.Allocator = (*pointArena)(nil)

// Allocate returns size zeroed bytes, as memory.GoAllocator does.
func (a *pointArena) Allocate(size int) []byte {
	if size <= 0 {
		return []byte{}
	}
	c := max(bits.Len(uint(size-1)), arenaMinClass)
	if c > arenaMaxClass {
		return make([]byte, size)
	}
	var b []byte
	if p, ok := arenaPools[c].Get().(*[]byte); ok {
		b = *p
		clear(b[:size])
	} else {
		b = make([]byte, 1<<c)
	}
	a.mu.Lock()
	a.held = append(a.held, b)
	a.mu.Unlock()
	return b[:size:size] // capacity as asked, as GoAllocator gives: a larger size reallocates
}

// Reallocate returns size bytes beginning with b's contents, the rest
// zeroed.
func (a *pointArena) Reallocate(size int, b []byte) []byte {
	if size <= cap(b) {
		old := len(b)
		b = b[:size]
		if size > old {
			clear(b[old:])
		}
		return b
	}
	nb := a.Allocate(size)
	copy(nb, b)
	return nb
}

// Free does nothing: the read's buffers go back together at release.
func (a *pointArena) Free([]byte) {}

// release returns every buffer the read took to the pools; nothing may
// use them after it.
func (a *pointArena) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, b := range a.held {
		arenaPools[bits.Len(uint(cap(b)-1))].Put(&b)
	}
	a.held = nil
}

// copyRow copies rec's columns into memory of mem, so that rec and the
// arena it was read into can go, under plain fields (plainFields).
func copyRow(rec arrow.RecordBatch, mem memory.Allocator) (arrow.RecordBatch, error) {
	schema := arrow.NewSchema(plainFields(rec.Schema().Fields()), nil)
	return newRecord(schema, rec.NumRows(), func(i int) (arrow.Array, error) {
		return array.Concatenate([]arrow.Array{rec.Column(i)}, mem)
	})
}
