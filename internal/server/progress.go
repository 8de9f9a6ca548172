package server

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// progressFile records, every second, how far each source is committed. It
// is written without fsync (a power cut may lose it; a kill -9 does not):
// it only tells the next start how much of what it redoes the last process
// had applied, for the redo metrics and log.
const progressFile = "progress.json"

type progressRecord struct {
	Sources []progressSource `json:"sources"`
}

type progressSource struct {
	URI       string           `json:"uri"`
	Committed map[string]int64 `json:"committed"`
}

// readProgress returns, per configured source, how far the last process
// committed it (nil where unknown).
func readProgress(dataDir string, uris []string) []map[string]int64 {
	data, err := os.ReadFile(filepath.Join(dataDir, progressFile))
	if err != nil {
		return nil
	}
	var rec progressRecord
	if json.Unmarshal(data, &rec) != nil {
		return nil
	}
	out := make([]map[string]int64, len(uris))
	for i, uri := range uris {
		if i < len(rec.Sources) && rec.Sources[i].URI == uri {
			out[i] = rec.Sources[i].Committed
		}
	}
	return out
}

// progressWriter keeps the progress file, best effort.
func progressWriter(dataDir string, uris []string) func([]map[string]int64) {
	path := filepath.Join(dataDir, progressFile)
	return func(committed []map[string]int64) {
		rec := progressRecord{}
		for i, uri := range uris {
			ps := progressSource{URI: uri}
			if i < len(committed) {
				ps.Committed = committed[i]
			}
			rec.Sources = append(rec.Sources, ps)
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return
		}
		if os.WriteFile(path+".tmp", data, 0o644) == nil {
			os.Rename(path+".tmp", path)
		}
	}
}
