// Package durable replaces small state files so that after a crash either
// the old or the new content is there, never a torn or empty file.
package durable

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// WriteFile replaces path with data: a synced temporary file renamed over
// it (renameio), then the directory synced so the rename itself survives a
// power loss.
func WriteFile(path string, data []byte) error {
	if err := renameio.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("durable: write %s: %w", path, err)
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("durable: write %s: %w", path, err)
	}
	return nil
}

// SyncDir makes the entries of dir (renames, creations) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
