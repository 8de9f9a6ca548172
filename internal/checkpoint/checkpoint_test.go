package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/durable"
)

func manifest(ts uint64, files ...File) *Manifest {
	return &Manifest{TS: ts, Buckets: 16, Replayers: 2, Files: files,
		Sources: []Source{{URI: "file:/in.jsonl", Resume: change.Checkpoint{Resume: map[string]int64{"file:/in.jsonl": int64(ts) * 10}}}}}
}

// freshDir is a crashable in-memory data directory whose creation is
// durable.
func freshDir(t *testing.T) *vfs.MemFS {
	t.Helper()
	mem := vfs.NewCrashableMem()
	if err := mem.MkdirAll("/data", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := durable.SyncDirFS(mem, "/"); err != nil {
		t.Fatal(err)
	}
	return mem
}

// state reads a checkpoint back whole: the manifest and every visibility
// file it names.
func state(t *testing.T, fsys vfs.FS) (*Manifest, map[uint64]string, error) {
	t.Helper()
	s := Open(fsys, "/data")
	m, err := s.Load()
	if err != nil || m == nil {
		return m, nil, err
	}
	vis := map[uint64]string{}
	for _, f := range m.Files {
		data, err := s.Visibility(f)
		if err != nil {
			return m, nil, err
		}
		if data != nil {
			vis[f.ID] = string(data)
		}
	}
	return m, vis, nil
}

func TestWriteLoadRoundTrip(t *testing.T) {
	mem := freshDir(t)
	s := Open(mem, "/data")
	if m, err := s.Load(); m != nil || err != nil {
		t.Fatalf("empty directory: %v, %v", m, err)
	}
	m1 := manifest(10, File{ID: 3, Rows: 5, Capacity: 8}, File{ID: 1, Table: 2, Virtual: true, Rows: 7, Capacity: 64, Replayer: 1})
	if err := s.Write(m1, map[uint64][]byte{1: []byte("deletes of file 1")}); err != nil {
		t.Fatal(err)
	}
	got, vis, err := state(t, mem)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m1) || vis[1] != "deletes of file 1" || len(vis) != 1 {
		t.Fatalf("read back %+v %v, wrote %+v", got, vis, m1)
	}
	if got.Files[0].ID != 1 {
		t.Fatal("files are not sorted by id")
	}
	// A second checkpoint keeps unchanged visibility files, writes changed
	// ones under its own sequence number and removes what nothing names.
	m2 := manifest(20, File{ID: 1, Rows: 7, Capacity: 64}, File{ID: 3, Rows: 5, Capacity: 8})
	if err := s.Write(m2, map[uint64][]byte{1: []byte("deletes of file 1"), 3: []byte("file 3")}); err != nil {
		t.Fatal(err)
	}
	if m2.Seq != 2 || m2.Files[0].Vis != VisName(1, 1) || m2.Files[1].Vis != VisName(3, 2) {
		t.Fatalf("second checkpoint: %+v", m2.Files)
	}
	// Visibility files end with their own CRC-32C; two different ones must
	// still count as different.
	withCRC := func(s string) []byte {
		return append([]byte(s), crcOf(s)...)
	}
	m2b := manifest(25, File{ID: 1, Rows: 7, Capacity: 64})
	if err := s.Write(m2b, map[uint64][]byte{1: withCRC("deleted set A")}); err != nil {
		t.Fatal(err)
	}
	m2c := manifest(26, File{ID: 1, Rows: 7, Capacity: 64})
	if err := s.Write(m2c, map[uint64][]byte{1: withCRC("deleted set B")}); err != nil {
		t.Fatal(err)
	}
	if m2c.Files[0].Vis == m2b.Files[0].Vis {
		t.Fatalf("a changed visibility file kept the old one's name %s", m2c.Files[0].Vis)
	}
	m3 := manifest(30, File{ID: 1, Rows: 7, Capacity: 64})
	if err := s.Write(m3, map[uint64][]byte{1: []byte("more deletes of file 1")}); err != nil {
		t.Fatal(err)
	}
	names, _ := mem.List("/data/visibility")
	if len(names) != 1 || names[0] != VisName(1, 5) {
		t.Fatalf("visibility files left: %v", names)
	}
}

// TestFailureAtEveryStepLeavesACheckpoint fails each file-system operation
// of a checkpoint write in turn, then loses everything not synced, as a
// power cut would: the directory always holds the previous checkpoint or
// the new one, whole, with every visibility file it names.
func TestFailureAtEveryStepLeavesACheckpoint(t *testing.T) {
	old := manifest(10, File{ID: 1, Rows: 7, Capacity: 64}, File{ID: 2, Rows: 3, Capacity: 8})
	oldVis := map[uint64][]byte{1: []byte("one"), 2: []byte("two")}
	next := manifest(20, File{ID: 1, Rows: 7, Capacity: 64}, File{ID: 2, Rows: 4, Capacity: 8}, File{ID: 5, Rows: 1, Capacity: 8})
	nextVis := map[uint64][]byte{1: []byte("one"), 2: []byte("two, changed"), 5: []byte("five")}
	for step := int32(0); ; step++ {
		mem := freshDir(t)
		s := Open(mem, "/data")
		if err := s.Write(cloneManifest(old), oldVis); err != nil {
			t.Fatal(err)
		}
		s.fs = errorfs.Wrap(mem, errorfs.OnIndex(step))
		werr := s.Write(cloneManifest(next), nextVis)
		got, vis, err := state(t, mem.CrashClone(vfs.CrashCloneCfg{}))
		if err != nil || got == nil {
			t.Fatalf("failure at operation %d (%v): after a crash: %v, %v", step, werr, got, err)
		}
		want, wantVis := old, oldVis
		if got.TS == next.TS {
			want, wantVis = next, nextVis
		} else if werr == nil {
			t.Fatalf("operation %d: the write succeeded but a crash went back to the old checkpoint", step)
		}
		if !sameFiles(got, want) || len(vis) != len(wantVis) {
			t.Fatalf("failure at operation %d: read %+v with %d visibility files", step, got.Files, len(vis))
		}
		for id, b := range wantVis {
			if vis[id] != string(b) {
				t.Fatalf("failure at operation %d: visibility of file %d is %q, want %q", step, id, vis[id], b)
			}
		}
		if werr == nil {
			if step == 0 {
				t.Fatal("no operation failed: the injection did nothing")
			}
			t.Logf("a checkpoint write is %d file-system operations; each failed in turn", step)
			return
		}
		if !errors.Is(werr, errorfs.ErrInjected) {
			t.Fatalf("operation %d: %v", step, werr)
		}
	}
}

func crcOf(s string) []byte {
	return binary.BigEndian.AppendUint32(nil, crc32.Checksum([]byte(s), crc32.MakeTable(crc32.Castagnoli)))
}

func cloneManifest(m *Manifest) *Manifest {
	c := *m
	c.Files = append([]File(nil), m.Files...)
	return &c
}

func sameFiles(a, b *Manifest) bool {
	if a.TS != b.TS || len(a.Files) != len(b.Files) {
		return false
	}
	for i := range a.Files {
		x, y := a.Files[i], b.Files[i]
		if x.ID != y.ID || x.Rows != y.Rows || x.Capacity != y.Capacity {
			return false
		}
	}
	return true
}

// TestCorruptManifestIsRefused: every byte flipped, a truncation at every
// length, and inconsistent values are refused with the file named; none is
// read as a checkpoint.
func TestCorruptManifestIsRefused(t *testing.T) {
	good, err := Encode(manifest(10, File{ID: 1, Rows: 2, Capacity: 8}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(good); err != nil {
		t.Fatal(err)
	}
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x20
		if _, err := Decode(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	for n := range len(good) {
		if _, err := Decode(good[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	for name, m := range map[string]*Manifest{
		"no buckets":          {Replayers: 1},
		"rows over capacity":  manifest(1, File{ID: 1, Rows: 9, Capacity: 8}),
		"file listed twice":   manifest(1, File{ID: 1}, File{ID: 1}),
		"unknown replayer":    manifest(1, File{ID: 1, Replayer: 7}),
		"path in a vis name":  manifest(1, File{ID: 1, Vis: "../1-1.vis", VisSum: strings.Repeat("0", 64)}),
		"vis without its sum": manifest(1, File{ID: 1, Vis: "1-1.vis"}),
		"source without uri":  {Buckets: 1, Replayers: 1, Sources: []Source{{}}},
		"timestamp too large": {Buckets: 1, Replayers: 1, TS: 1 << 60},
	} {
		data, _ := Encode(m)
		if _, err := Decode(data); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	mem := freshDir(t)
	bad := bytes.Clone(good)
	bad[len(bad)-1] ^= 1
	if err := durable.WriteFileFS(mem, "/data/checkpoint", bad); err != nil {
		t.Fatal(err)
	}
	_, err = Open(mem, "/data").Load()
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "/data/checkpoint") || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("corrupt manifest: %v", err)
	}
	// A visibility file that does not match the manifest is refused too.
	s := Open(mem, "/data")
	if err := s.Write(manifest(11, File{ID: 1, Capacity: 8}), map[uint64][]byte{1: []byte("deletes")}); err != nil {
		t.Fatal(err)
	}
	if err := durable.WriteFileFS(mem, s.VisPath(VisName(1, 1)), []byte("deleted")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := state(t, mem); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), VisName(1, 1)) {
		t.Fatalf("altered visibility file: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	good, _ := Encode(manifest(10, File{ID: 1, Rows: 2, Capacity: 8, Vis: "1-1.vis", VisSum: strings.Repeat("ab", 32)}))
	f.Add(good)
	f.Add(good[:20])
	f.Add([]byte("RTCP"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("an error that does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		// Whatever decodes, encodes and decodes to the same.
		again, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := Decode(again)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("%v, %v", err, fmt.Sprint(m2))
		}
	})
}
