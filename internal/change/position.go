package change

import "fmt"

// Position is where a message sits in its source: an offset within one
// stream (a file, or a Kafka topic partition). Offsets of one stream grow.
type Position struct {
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
}

func (p Position) String() string { return fmt.Sprintf("%s@%d", p.Stream, p.Offset) }
