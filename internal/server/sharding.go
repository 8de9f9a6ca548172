package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/retinadb/retina/internal/durable"
)

// shardingFile records, in the data directory, how keys are spread over
// buckets and replayers. Both decide which replayer owns a key's versions,
// so the data directory is only valid with the settings that wrote it.
const shardingFile = "sharding.json"

type sharding struct {
	Buckets   int `json:"buckets"`
	Replayers int `json:"replayers"`
}

// checkSharding refuses settings other than the data directory's. It
// reports whether they still need recording (a first start).
func checkSharding(cfg NodeConfig) (record bool, err error) {
	path := filepath.Join(cfg.DataDir, shardingFile)
	want := sharding{Buckets: cfg.Buckets, Replayers: cfg.Replayers}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("server: read %s: %w", path, err)
	}
	var got sharding
	if err := json.Unmarshal(data, &got); err != nil || got.Buckets <= 0 || got.Replayers <= 0 {
		return false, fmt.Errorf("server: %s is corrupt (%s): it says how the data directory's keys are spread over buckets and replayers; restore it, or start over with an empty data directory", path, data)
	}
	if got != want {
		return false, fmt.Errorf("server: the data directory %s was written with --buckets %d --replayers %d, and this start asks for --buckets %d --replayers %d: they decide which replayer owns each row, so they cannot change; start with --buckets %d --replayers %d, or use a new data directory (the sources are then read again from their start)",
			cfg.DataDir, got.Buckets, got.Replayers, want.Buckets, want.Replayers, got.Buckets, got.Replayers)
	}
	return false, nil
}

// recordSharding writes the settings of a first start, once the node is up.
func recordSharding(cfg NodeConfig) error {
	data, _ := json.Marshal(sharding{Buckets: cfg.Buckets, Replayers: cfg.Replayers})
	if err := durable.WriteFile(filepath.Join(cfg.DataDir, shardingFile), data); err != nil {
		return fmt.Errorf("server: record the sharding settings: %w", err)
	}
	return nil
}
