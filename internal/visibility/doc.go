// Package visibility keeps the delete timestamps of tuple versions and answers,
// for any query snapshot, which versions of a row group are deleted.
//
// A tuple version at offset o is invisible at snapshot s iff it was deleted
// with a delete timestamp d ≤ s. Create-timestamp filtering is the scan's job,
// not this package's.
//
// # Structure
//
// A row group is split into tiles of a fixed power-of-two size (default 4096).
// Each tile has:
//
//   - a visibility snapshot: an immutable base set (the tuples deleted at or
//     before the base timestamp) plus the base timestamp and the head of the
//     delete-ts chain, published as one atomic pointer;
//   - a delete-ts chain: 64-byte blocks of eight uint64 entries, each entry
//     holding the tuple offset in the high 12 bits and the delete timestamp in
//     the low 52 bits. Writers claim a free slot with a compare-and-swap, so an
//     entry is either absent (zero) or complete; blocks are only ever linked at
//     the tail. Readers never take a lock and never wait;
//   - a duplicate filter: one bit per tuple, set atomically by Delete, so a
//     second delete of the same tuple is rejected in O(1). It only exists
//     while the tile has recent deletes: memory GC retires it once every
//     delete is folded into the base, which is what keeps a collected row
//     group near one bit per tuple or less.
//
// Bitmap(s) copies the base and ORs in every chain entry with a timestamp
// ≤ s. Deletes may arrive out of timestamp order within a tile (several
// buckets of one replayer write to the same file); nothing relies on order.
// Exactness rests on the MVCC rule that a query with snapshot s is admitted
// only after every delete with a timestamp ≤ s has returned.
//
// Collect(lwm) folds the entries with timestamp ≤ lwm into a new base with
// base timestamp lwm, copies the entries above lwm into fresh blocks, links
// them before the current tail block and swaps the snapshot pointer. Old
// snapshots stay valid for readers that hold them. The tail block is never
// unlinked because writers may still be filling it; an idle tile therefore
// keeps at most one block.
//
// The base set is stored densely (one bit per tuple) or, when at most
// tileSize/32 tuples are deleted, as a sorted array of 16-bit offsets, which
// costs less than half the dense form.
//
// # Checkpoint format
//
// A checkpoint is the deleted set of a row group at one timestamp, encoded
// little-endian:
//
//	offset  size  field
//	0       4     magic "RVCP"
//	4       2     format version (1)
//	6       2     reserved, must be 0
//	8       8     timestamp the bitmap is exact for
//	16      8     row count N
//	24      8*W   bitmap words, W = ceil(N/64); bit i of word j is offset 64j+i;
//	              bits at or beyond N must be 0
//	24+8W   4     CRC-32C (Castagnoli) of every preceding byte
//
// Decoding rejects truncated input, trailing bytes, a bad magic, an unknown
// version, non-zero reserved bits, padding bits set and a checksum mismatch.
package visibility
