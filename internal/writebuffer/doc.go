// Package writebuffer holds the newest tuple versions of one table for one
// replayer: an active block of column vectors, immutable blocks awaiting
// flush, and the virtual files they belong to.
//
// A virtual file has a file id registered in the catalog before its first
// row, a fixed capacity, one row group and a visibility structure covering
// that capacity. A row's location (file id, row group 0, offset) is fixed
// when it is appended and never changes: flushed blocks become small lake
// objects (Arrow IPC, lake.WriteBlock: a copy of the block's buffers), and
// when a sealed file's blocks are all flushed they are combined into one
// regular Parquet file under the same file id and the small objects are
// deleted once no reader holds them.
//
// # Shape
//
// One concern a file, all sharing the buffer's state under one mutex that
// is never held across I/O:
//
//	build.go    block building: column vectors in Go memory take the
//	            appended rows in place; readers get Arrow arrays sharing
//	            them; a full block is sealed and queued (no I/O, no locking)
//	files.go    virtual files: the file receiving rows, registration of
//	            the next one (catalog and index writes, made without the
//	            mutex while views and flushes go on), early sealing
//	flush.go    the flush pipeline: workers upload queued blocks in order
//	combine.go  combination of a sealed file's durable blocks into its
//	            regular object, and deletion of the blocks once unread
//	limit.go    the node-wide bound on combinations running at once
//	view.go     read views: a reference-counted picture of some files that
//	            never misses or doubles a row while the rest runs
//	seal.go     checkpoints: which rows every virtual file had, and a wait
//	            until they are durable
//
// # Waiting and retrying
//
// Nothing polls. Every change a waiter may care about (a block sealed or
// durable, a file combined, a retry due, the buffer closed) closes the
// buffer's change channel and replaces it; flush workers, Flush, Seal's
// Wait and appenders held back by unflushed bytes wait on it, with their
// context. A lake operation retries transient failures itself, by the
// lake's RetryPolicy; when the lake gives up, the job (a block's upload, a
// file's combination) is scheduled again after that policy's backoff on a
// timer, while the other blocks go on. A block stays in memory, readable,
// until it is durable, and appends wait once MaxUnflushedBytes are not.
package writebuffer
