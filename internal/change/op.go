package change

import "fmt"

// OpKind is what an operation does.
type OpKind uint8

// Operation kinds.
const (
	// Insert adds a row; its key must not be live.
	Insert OpKind = iota + 1
	// Delete removes the row of Key; it must be live.
	Delete
	// Update replaces the row of Key (or of Row's key) with Row; the old
	// key must be live.
	Update
	// Upsert puts Row whether its key is live or not (a snapshot read).
	Upsert
	// Truncate deletes every live row of the table in the batch's bucket.
	Truncate
)

func (k OpKind) String() string {
	switch k {
	case Insert:
		return "insert"
	case Delete:
		return "delete"
	case Update:
		return "update"
	case Upsert:
		return "upsert"
	case Truncate:
		return "truncate"
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// Op is one row change of a mirror transaction.
type Op struct {
	TS    uint64
	Table uint32
	Kind  OpKind
	// Key is the primary key of the row deleted or updated (the old key for
	// an update that changes it). When nil it is taken from Before, or from
	// Row for an update.
	Key []any
	// Row is the after image in column order (insert, update).
	Row []any
	// Before is the before image; needed only for tables with secondary
	// indexes, to remove the old version's entries.
	Before []any
	// Unchanged lists the columns of an update whose value the source did
	// not send (PostgreSQL's unchanged TOAST values): they keep the value of
	// the row's current version.
	Unchanged []int
	// ByContent says the source does not know the row's key (a table with
	// catalog.Schema.GeneratedKey): the delete or update is of a live row
	// whose columns other than the key equal Before, the one with the
	// smallest key when several do. Key is then ignored, and the key
	// columns of Row are the found row's.
	ByContent bool
	// Unmatched lists columns a ByContent operation does not compare: the
	// source no longer has them (dropped upstream).
	Unmatched []int
}

// BucketOps are a transaction's operations in one bucket.
type BucketOps struct {
	Bucket int
	Ops    []Op
}
