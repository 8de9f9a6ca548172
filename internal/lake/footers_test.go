package lake

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
)

// TestFootersSkipTheTailRead: a file opened again through the cache makes
// no read for its footer, and reads the same rows.
func TestFootersSkipTheTailRead(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 5))
	rec := randomRecord(rng, testSchema(), 5000, func(i int) int64 { return int64(i + 1) })
	defer rec.Release()
	data, _ := writeFile(t, []arrow.RecordBatch{rec}, WriterOptions{RowGroupRows: 1000})
	s := openTestStore(t, "mem://", RetryPolicy{})
	if err := s.Put(ctx, "t1/f1.parquet", data); err != nil {
		t.Fatal(err)
	}
	c := NewFooters(1 << 20)
	var rows [2]string
	for i := range 2 {
		r, err := s.ReaderAt(ctx, "t1/f1.parquet")
		if err != nil {
			t.Fatal(err)
		}
		f, err := OpenFileCached(r, nil, c, "t1/f1.parquet")
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && r.Reads() != 0 {
			t.Fatalf("the second open made %d reads; the tail is cached", r.Reads())
		}
		got, err := f.ReadRow(ctx, 3217, []int{0, 8, 13})
		if err != nil {
			t.Fatal(err)
		}
		for c := range int(got.NumCols()) {
			rows[i] += got.Column(c).String() + ";"
		}
		got.Release()
		f.Close()
	}
	if rows[0] != rows[1] {
		t.Fatalf("row read through the cached footer differs:\n%s\n%s", rows[0], rows[1])
	}
	if c.Len() != 1 {
		t.Fatalf("the cache holds %d tails, want 1", c.Len())
	}
}

// TestFootersBound: the cache holds at most its bytes, the least recently
// used leaving first, and forgets a tail whose object changed size.
func TestFootersBound(t *testing.T) {
	c := NewFooters(100)
	c.put(&footer{key: "a", size: 1000, tail: make([]byte, 40)})
	c.put(&footer{key: "b", size: 1000, tail: make([]byte, 40)})
	if _, ok := c.get("a", 1000); !ok { // a is now the most recent
		t.Fatal("a was not kept")
	}
	c.put(&footer{key: "c", size: 1000, tail: make([]byte, 40)})
	if _, ok := c.get("b", 1000); ok {
		t.Fatal("b, the least recently used, should have left")
	}
	if _, ok := c.get("a", 1000); !ok {
		t.Fatal("a should have stayed")
	}
	if _, ok := c.get("a", 999); ok {
		t.Fatal("a tail of another size served")
	}
	if _, ok := c.get("a", 1000); ok {
		t.Fatal("a changed size and should be forgotten")
	}
	c.put(&footer{key: "big", size: 1000, tail: make([]byte, 101)})
	if _, ok := c.get("big", 1000); ok || c.used > 100 {
		t.Fatalf("a tail larger than the cache was kept (%d bytes used)", c.used)
	}
}
