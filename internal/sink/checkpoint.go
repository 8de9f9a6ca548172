package sink

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/durable"
)

// CheckpointStore persists every source's checkpoint.
type CheckpointStore interface {
	Load() ([]change.Checkpoint, error)
	Save([]change.Checkpoint) error
}

// FileCheckpoints keeps the checkpoints in one JSON file, replaced by
// write-to-temp, fsync and rename.
type FileCheckpoints struct{ Path string }

// Load reads the checkpoints; a missing file is none.
func (f FileCheckpoints) Load() ([]change.Checkpoint, error) {
	data, err := os.ReadFile(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sink: read checkpoint: %w", err)
	}
	var cps []change.Checkpoint
	if err := json.Unmarshal(data, &cps); err != nil {
		return nil, fmt.Errorf("sink: checkpoint %s is corrupt: %w", f.Path, err)
	}
	return cps, nil
}

// Save replaces the checkpoints durably.
func (f FileCheckpoints) Save(cps []change.Checkpoint) error {
	data, err := json.Marshal(cps)
	if err != nil {
		return err
	}
	if err := durable.WriteFile(f.Path, data); err != nil {
		return fmt.Errorf("sink: save checkpoint: %w", err)
	}
	return nil
}
