// Package cdc is the change model (change events, transaction boundaries,
// source positions) and its sources and decoders: Debezium JSON from
// newline-delimited files or from Kafka topics. PostgreSQL's logical
// replication is the subpackage postgres.
package cdc

import (
	"context"
	"errors"
	"fmt"

	"github.com/retinadb/retina/internal/change"
)

// Position is where a message sits in its source (see change.Position).
type Position = change.Position

// Message is one raw message of a source: a Debezium value (nil for a
// tombstone) and, from Kafka, its key; or, from a source that speaks its
// database's own replication protocol (PostgreSQL), the record it decoded.
type Message struct {
	Pos   Position
	Key   []byte
	Value []byte
	// Record, when set, is the message already decoded: the decoder passes
	// it through with Pos.
	Record *Record
}

// Source yields messages in order within each stream.
type Source interface {
	// Next returns the next message; it blocks until one is available, the
	// source ends (io.EOF) or ctx is done.
	Next(ctx context.Context) (Message, error)
	// Commit tells the source that everything before the given positions
	// is durably applied (Kafka commits offsets; files need not).
	Commit(ctx context.Context, resume map[string]int64) error
	// Close releases the source.
	Close() error
}

// Contiguous is implemented by sources that deliver each transaction's
// records together and in commit order, never interleaved with another's
// (a database's own replication protocol). The sink may then apply a large
// transaction in parts as it arrives, in bounded memory.
type Contiguous interface {
	Contiguous() bool
}

// Op is a Debezium operation.
type Op byte

// Debezium operations.
const (
	OpCreate   Op = 'c'
	OpUpdate   Op = 'u'
	OpDelete   Op = 'd'
	OpRead     Op = 'r' // snapshot
	OpTruncate Op = 't'
	OpMessage  Op = 'm' // logical decoding message: ignored
)

// Kind tells what a decoded record is.
type Kind uint8

// Record kinds.
const (
	Change Kind = iota + 1
	Begin       // transaction BEGIN
	End         // transaction END
	Skip        // nothing to apply: a tombstone or a logical message
)

// Record is one decoded message.
type Record struct {
	Kind Kind
	Pos  Position
	// Change fields.
	Table  string
	Op     Op
	Key    []any // primary key in key-column order, when the message had one
	Before []any // full rows in the table's column order, nil when absent
	After  []any
	// Unchanged lists columns of an update's After that the source did not
	// send (PostgreSQL's unchanged TOAST values): they keep the current
	// version's value.
	Unchanged []int
	// Unmatched lists columns of Before the source does not have (dropped
	// upstream), for a row found by content not to compare them.
	Unmatched []int
	// TxID is the normalised source transaction id ("" without metadata);
	// TotalOrder orders a change within its transaction.
	TxID       string
	TotalOrder int64
	// SourceTSms is when the source wrote the change (source.ts_ms), 0 if
	// unknown.
	SourceTSms int64
	// End fields: events in the transaction, in all and per table.
	EventCount int64
	PerTable   map[string]int64
	// SkipReason says why a Skip record carries nothing.
	SkipReason string
	// Raw is the message itself, when the caller keeps it (the sink does
	// under the dead-letter policy, to write a set-aside transaction whole).
	Raw *Message
}

// ErrDecode is wrapped by every decoding rejection.
var ErrDecode = errors.New("cdc: cannot decode")

// DecodeError names the message a rejection is about.
type DecodeError struct {
	Pos    Position
	Reason string
}

func (e *DecodeError) Error() string { return fmt.Sprintf("cdc: %s: %s", e.Pos, e.Reason) }

func (e *DecodeError) Unwrap() error { return ErrDecode }
