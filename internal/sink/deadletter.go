package sink

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/mirror"
)

// Dead-letter file
//
// One JSON object a line, appended and fsynced before the input it names
// counts as handled. A message that cannot be decoded:
//
//	{"position": {"stream": S, "offset": N}, "reason": "…", "key": …, "value": "…"}
//
// A transaction that cannot be applied, whole, with every message that
// belongs to it (BEGIN and END included) in source order:
//
//	{"transaction": "ID", "source": "URI", "timestamp": TS, "reason": "…",
//	 "positions": [{"stream": S, "offset": N}, …],
//	 "messages": [{"position": …, "key": …, "value": "…"}, …]}
//
// key is the message key when it is JSON, value the message text.

// deadLetters appends records to the dead-letter file; the intakes and the
// driver share it.
type deadLetters struct {
	mu sync.Mutex
	f  *os.File
}

func openDeadLetters(path string) (*deadLetters, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("sink: dead-letter file: %w", err)
	}
	return &deadLetters{f: f}, nil
}

func (d *deadLetters) close() error { return d.f.Close() }

type deadMessage struct {
	Position cdc.Position    `json:"position"`
	Reason   string          `json:"reason,omitempty"`
	Key      json.RawMessage `json:"key,omitempty"`
	Value    string          `json:"value"`
}

type deadTxn struct {
	Transaction string         `json:"transaction"`
	Source      string         `json:"source,omitempty"`
	Timestamp   uint64         `json:"timestamp"`
	Reason      string         `json:"reason"`
	Positions   []cdc.Position `json:"positions"`
	Messages    []deadMessage  `json:"messages"`
}

func messageRecord(m cdc.Message, reason string) deadMessage {
	var key json.RawMessage
	if json.Valid(m.Key) {
		key = m.Key
	}
	return deadMessage{Position: m.Pos, Reason: reason, Key: key, Value: string(m.Value)}
}

// writeMessage records a message that cannot be decoded.
func (d *deadLetters) writeMessage(m cdc.Message, reason error) error {
	return d.write(messageRecord(m, reason.Error()))
}

// writeTxn records a transaction set aside whole.
func (d *deadLetters) writeTxn(source string, r mirror.Rejected) error {
	rec := deadTxn{Transaction: r.Txn.ID, Source: source, Timestamp: r.TS, Reason: r.Err.Error(), Positions: r.Txn.Positions}
	raw, _ := r.Txn.Raw.([]cdc.Message)
	for _, m := range raw {
		rec.Messages = append(rec.Messages, messageRecord(m, ""))
	}
	return d.write(rec)
}

func (d *deadLetters) write(rec any) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("dead-letter record: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("dead-letter write: %w", err)
	}
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("dead-letter sync: %w", err)
	}
	return nil
}
