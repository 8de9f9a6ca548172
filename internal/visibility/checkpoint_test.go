package visibility

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestCheckpointRoundTrip(t *testing.T) {
	for _, rows := range []int{0, 1, 63, 64, 65, 4096, 10000} {
		g := mustRowGroup(t, rows)
		rng := rand.New(rand.NewPCG(uint64(rows), 9))
		model := oracle{}
		for i := 0; i < rows/3; i++ {
			off := uint32(rng.IntN(rows))
			if _, done := model[off]; done {
				continue
			}
			ts := uint64(1 + rng.IntN(100))
			if err := g.Delete(off, ts); err != nil {
				t.Fatal(err)
			}
			model[off] = ts
		}
		cp, err := g.Checkpoint(50)
		if err != nil {
			t.Fatal(err)
		}
		data, err := cp.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var back Checkpoint
		if err := back.UnmarshalBinary(data); err != nil {
			t.Fatalf("rows %d: %v", rows, err)
		}
		if back.TS != 50 || back.Rows != rows || !slices.Equal(back.Bitmap, model.bitmap(rows, 50)) {
			t.Fatalf("rows %d: round trip changed the checkpoint", rows)
		}
		// A restored row group answers snapshots ≥ the checkpoint exactly.
		r, err := Restore(back)
		if err != nil {
			t.Fatal(err)
		}
		dst := make([]uint64, r.BitmapWords())
		if err := r.Bitmap(50, dst); err != nil {
			t.Fatal(err)
		}
		if d := diffBitmaps(dst, model.bitmap(rows, 50)); d != "" {
			t.Fatal(d)
		}
		if rows > 0 {
			if err := r.Bitmap(49, dst); !errors.Is(err, ErrSnapshotTooOld) && !allClear(model, 49) {
				t.Fatalf("restored row group answered below its checkpoint: %v", err)
			}
		}
		// Deletes continue above the checkpoint; the old ones stay refused.
		for off, ts := range model {
			if ts <= 50 {
				if err := r.Delete(off, 60); !errors.Is(err, ErrAlreadyDeleted) {
					t.Fatalf("delete of a checkpointed tuple: %v", err)
				}
				break
			}
		}
	}
}

func allClear(m oracle, ts uint64) bool {
	for _, d := range m {
		if d <= ts {
			return false
		}
	}
	return true
}

func encodeRaw(magic string, version, reserved uint16, ts, rows uint64, words []uint64) []byte {
	buf := make([]byte, 24)
	copy(buf, magic)
	binary.LittleEndian.PutUint16(buf[4:], version)
	binary.LittleEndian.PutUint16(buf[6:], reserved)
	binary.LittleEndian.PutUint64(buf[8:], ts)
	binary.LittleEndian.PutUint64(buf[16:], rows)
	for _, w := range words {
		buf = binary.LittleEndian.AppendUint64(buf, w)
	}
	return binary.LittleEndian.AppendUint32(buf, crc32.Checksum(buf, castagnoli))
}

func TestCheckpointRejections(t *testing.T) {
	good := encodeRaw("RVCP", 1, 0, 7, 100, []uint64{5, 1 << 35})
	var cp Checkpoint
	if err := cp.UnmarshalBinary(good); err != nil {
		t.Fatalf("valid input refused: %v", err)
	}
	flipped := slices.Clone(good)
	flipped[30] ^= 1
	cases := map[string][]byte{
		"empty":          nil,
		"short header":   good[:10],
		"truncated body": good[:len(good)-5],
		"missing crc":    good[:len(good)-4],
		"trailing bytes": append(slices.Clone(good), 0),
		"bad magic":      encodeRaw("XVCP", 1, 0, 7, 100, []uint64{5, 0}),
		"bad version":    encodeRaw("RVCP", 2, 0, 7, 100, []uint64{5, 0}),
		"reserved set":   encodeRaw("RVCP", 1, 1, 7, 100, []uint64{5, 0}),
		"bad checksum":   flipped,
		"padding bits":   encodeRaw("RVCP", 1, 0, 7, 100, []uint64{5, 1 << 40}),
		"huge row count": encodeRaw("RVCP", 1, 0, 7, 1<<40, nil),
		"ts ≥ 2^52":      encodeRaw("RVCP", 1, 0, 1<<52, 100, []uint64{5, 0}),
	}
	for name, data := range cases {
		var cp Checkpoint
		err := cp.UnmarshalBinary(data)
		if !errors.Is(err, ErrBadCheckpoint) {
			t.Errorf("%s: got %v, want ErrBadCheckpoint", name, err)
		}
	}
	if _, err := (Checkpoint{Rows: 10, Bitmap: []uint64{1, 2}}).MarshalBinary(); err == nil {
		t.Error("marshal of a checkpoint with the wrong word count succeeded")
	}
}

func FuzzCheckpointDecode(f *testing.F) {
	f.Add(encodeRaw("RVCP", 1, 0, 7, 100, []uint64{5, 1 << 35}))
	f.Add(encodeRaw("RVCP", 1, 0, 0, 0, nil))
	f.Add([]byte("RVCP"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var cp Checkpoint
		if err := cp.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, ErrBadCheckpoint) {
				t.Fatalf("error not wrapping ErrBadCheckpoint: %v", err)
			}
			return
		}
		again, err := cp.MarshalBinary()
		if err != nil || !slices.Equal(again, data) {
			t.Fatalf("accepted input does not re-encode to itself: %v", err)
		}
		if _, err := Restore(cp); err != nil {
			t.Fatalf("accepted checkpoint cannot be restored: %v", err)
		}
	})
}
