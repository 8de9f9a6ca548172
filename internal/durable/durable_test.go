package durable

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

func TestWriteFileReplacesWholly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, content := range []string{"first", "second, longer content", "3"} {
		if err := WriteFile(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read %q, %v; want %q", got, err, content)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "x"), []byte("x")); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

// TestWriteFileFSFailsWhole: a failure at any step of a replacement (create,
// write, sync, close, rename, directory sync), followed by a power loss that
// drops everything not synced, leaves the old content or the new one, never
// a torn, empty or missing file.
func TestWriteFileFSFailsWhole(t *testing.T) {
	for step := int32(0); ; step++ {
		mem := vfs.NewCrashableMem()
		if err := mem.MkdirAll("/d", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := SyncDirFS(mem, "/"); err != nil {
			t.Fatal(err)
		}
		if err := WriteFileFS(mem, "/d/state", []byte("old content")); err != nil {
			t.Fatal(err)
		}
		fsys := errorfs.Wrap(mem, errorfs.OnIndex(step))
		err := WriteFileFS(fsys, "/d/state", []byte("the new content"))
		crashed := mem.CrashClone(vfs.CrashCloneCfg{})
		got, rerr := ReadFileFS(crashed, "/d/state")
		if rerr != nil || string(got) != "old content" && string(got) != "the new content" {
			t.Fatalf("failure at operation %d (%v): after a crash the file reads %q, %v", step, err, got, rerr)
		}
		if err == nil {
			if string(got) != "the new content" {
				t.Fatalf("a replacement that succeeded is gone after a crash: %q", got)
			}
			if step == 0 {
				t.Fatal("no operation failed: the injection did nothing")
			}
			return // every step before this one was failed in turn
		}
	}
}
