// Package durable replaces small state files so that after a crash either
// the old or the new content is there, never a torn or empty file. It writes
// through a vfs.FS (Pebble's file-system interface): vfs.Default on disk,
// and in tests an in-memory file system that can lose what was not synced,
// wrapped to fail chosen operations (vfs/errorfs).
package durable

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// WriteFile replaces path with data on the local disk; see WriteFileFS.
func WriteFile(path string, data []byte) error { return WriteFileFS(vfs.Default, path, data) }

// WriteFileFS replaces path with data: a temporary file beside it, written
// and synced, renamed over it, then the directory synced so the rename
// itself survives a power loss. A failure at any step leaves the old file.
func WriteFileFS(fsys vfs.FS, path string, data []byte) error {
	tmp := path + ".tmp"
	if err := writeSynced(fsys, tmp, data); err != nil {
		fsys.Remove(tmp)
		return fmt.Errorf("durable: write %s: %w", path, err)
	}
	if err := fsys.Rename(tmp, path); err != nil {
		fsys.Remove(tmp)
		return fmt.Errorf("durable: write %s: %w", path, err)
	}
	if err := SyncDirFS(fsys, fsys.PathDir(path)); err != nil {
		return fmt.Errorf("durable: write %s: %w", path, err)
	}
	return nil
}

// CreateFS writes a new file that nothing names yet (a later rename or a
// record elsewhere makes it count): written, synced and closed. The caller
// syncs its directory once, after writing all of them.
func CreateFS(fsys vfs.FS, path string, data []byte) error {
	if err := writeSynced(fsys, path, data); err != nil {
		fsys.Remove(path)
		return fmt.Errorf("durable: write %s: %w", path, err)
	}
	return nil
}

func writeSynced(fsys vfs.FS, path string, data []byte) error {
	f, err := fsys.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadFileFS reads a whole file; a missing one is fs.ErrNotExist.
func ReadFileFS(fsys vfs.FS, path string) ([]byte, error) {
	f, err := fsys.Open(path)
	if err != nil {
		if oserror(err) {
			return nil, fmt.Errorf("%s: %w", path, fs.ErrNotExist)
		}
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

func oserror(err error) bool { return errors.Is(err, fs.ErrNotExist) || os.IsNotExist(err) }

// SyncDir makes the entries of dir (renames, creations) durable.
func SyncDir(dir string) error { return SyncDirFS(vfs.Default, dir) }

// SyncDirFS is SyncDir on a file system.
func SyncDirFS(fsys vfs.FS, dir string) error {
	d, err := fsys.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
