package writebuffer

import (
	"bytes"
	"context"
	"time"

	"github.com/apache/arrow-go/v18/arrow"

	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/lake"
)

// The flush pipeline: sealed blocks wait in a queue, in order; workers
// upload them as small lake objects, outside the buffer's lock. An upload
// the lake gave up on (after its own retries) is tried again after the
// lake's backoff, on a timer, without holding up the blocks behind it; the
// block stays in memory, readable, until it is durable.

// block is a sealed run of rows of one virtual file.
type block struct {
	file    *VirtualFile
	first   uint32
	rows    int
	segs    []arrow.RecordBatch // in memory until flushed; nil after
	bytes   int64
	key     string      // object key once durable
	cached  *cacheEntry // its records in the block cache once durable, if any
	flying  bool        // a worker is uploading it
	retryAt time.Time
	fails   int
}

// sealActive turns the active block immutable and queues it for flushing.
// Called with mu held.
func (b *Buffer) sealActive() {
	first, rows, segs := b.build.take()
	if rows == 0 {
		return
	}
	blk := &block{file: b.cur, first: first, rows: rows, segs: segs}
	for _, s := range segs {
		blk.bytes += recordBytes(s)
	}
	b.cur.blocks = append(b.cur.blocks, blk)
	b.queue = append(b.queue, blk)
	b.unflushed += blk.bytes
	b.notify()
}

// flushWorker uploads queued blocks until the buffer closes.
func (b *Buffer) flushWorker() {
	// Each worker encodes into its own buffer, grown once to a block's
	// size: growing a new one for every block cost as much as encoding
	// a column.
	var encoded bytes.Buffer
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.closed {
		blk := b.nextToFlush()
		if blk == nil {
			b.waitChange(nil)
			continue
		}
		blk.flying = true
		b.mu.Unlock()
		key := blockKey(b.cfg.TableID, blk.file.id, blk.first)
		b.cfg.Failpoints.Hit(failpoint.FlushBeforeUpload)
		err := b.upload(&encoded, key, blk.segs)
		if err == nil {
			b.cfg.Failpoints.Hit(failpoint.FlushAfterUpload)
		}
		b.mu.Lock()
		blk.flying = false
		if err != nil {
			blk.fails++
			delay := b.retry.Backoff(blk.fails)
			blk.retryAt = time.Now().Add(delay)
			time.AfterFunc(delay, b.wake)
			b.stats.FlushErrors++
			b.stats.LastFlushError = err.Error()
			b.log.Warn("block flush failed; will retry", "file", blk.file.id, "first", blk.first, "attempt", blk.fails, "retry_in", delay, "err", err)
			continue
		}
		blk.key = key
		if b.cfg.Cache != nil {
			blk.cached = b.cfg.Cache.add(blk.segs, blk.bytes)
		} else {
			for _, s := range blk.segs {
				s.Release() // views hold their own references
			}
		}
		blk.segs = nil
		b.unflushed -= blk.bytes
		b.stats.Flushed++
		b.dequeue(blk)
		b.maybeCombine(blk.file)
		b.notify()
	}
}

// nextToFlush picks the oldest queued block that is due. Called with mu.
func (b *Buffer) nextToFlush() *block {
	now := time.Now()
	for _, blk := range b.queue {
		if !blk.flying && !now.Before(blk.retryAt) {
			return blk
		}
	}
	return nil
}

func (b *Buffer) dequeue(blk *block) {
	for i, x := range b.queue {
		if x == blk {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return
		}
	}
}

// upload writes a block's records as one block object (Arrow IPC, see
// lake.WriteBlock): a copy of its buffers, not a re-encoding; the combined
// file gets Parquet's encodings, zstd and dictionaries.
func (b *Buffer) upload(buf *bytes.Buffer, key string, recs []arrow.RecordBatch) error {
	buf.Reset()
	if err := lake.WriteBlock(buf, recs); err != nil {
		return err
	}
	return b.cfg.Lake.Put(context.Background(), key, buf.Bytes())
}

// Flush seals the active block and waits until every block is durable and
// every full file combined.
func (b *Buffer) Flush(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur != nil {
		b.sealActive()
		b.maybeCombine(b.cur)
	}
	for {
		busy := len(b.queue) > 0
		for _, f := range b.files {
			busy = busy || f.combining
		}
		switch {
		case !busy:
			return nil
		case b.closed:
			return ErrClosed
		}
		if err := b.waitChange(ctx); err != nil {
			return err
		}
	}
}
