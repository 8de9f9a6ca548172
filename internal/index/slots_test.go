package index

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestSlotTableMatchesMap drives a slot table and a Go map (the oracle)
// with the same random inserts, updates, deletes, purge-like passes that
// update and delete while ranging, and compactions, over a key space small
// enough that tombstones and wrapped probe runs are common; after every
// step the two hold the same entries.
func TestSlotTableMatchesMap(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 3))
			tab := newSlotTable()
			oracle := map[shortKey]slot{}
			keySpace := 1 + rng.IntN(400)
			// Keys of every short length, some the same bytes as others
			// but for trailing zeros (told apart by length alone).
			key := func() shortKey {
				n := rng.IntN(keySpace)
				b := fmt.Appendf(nil, "k%0*d", 1+n%(shortKeyLen-1), n)
				if n%3 == 0 && len(b) < shortKeyLen {
					b = append(b[:len(b)-1], 0)
				}
				k, ok := toShortKey(b)
				if !ok {
					t.Fatal("test key not short")
				}
				return k
			}
			for step := range 3000 {
				switch op := rng.IntN(100); {
				case op < 50:
					k, s := key(), slot{last: version{ts: uint64(step + 1), val: rng.Uint64()}}
					if rng.IntN(2) == 0 { // as an update does: read, then write
						got, ok := tab.getToUpdate(&k)
						want, wantOK := oracle[k]
						if ok != wantOK || got != want {
							t.Fatalf("step %d: getToUpdate %q = %v %v, want %v %v", step, k.bytes(), got, ok, want, wantOK)
						}
					}
					tab.set(&k, s)
					oracle[k] = s
				case op < 80:
					k := key()
					tab.remove(&k)
					delete(oracle, k)
				case op < 97:
					k := key()
					got, ok := tab.get(&k)
					want, wantOK := oracle[k]
					if ok != wantOK || got != want {
						t.Fatalf("step %d: get %q = %v %v, want %v %v", step, k.bytes(), got, ok, want, wantOK)
					}
				case op < 99:
					// A purge: every entry visited once; some updated, some removed.
					seen, before := map[shortKey]bool{}, tab.len()
					for k, s := range tab.all() {
						if seen[*k] {
							t.Fatalf("step %d: %q visited twice", step, k.bytes())
						}
						seen[*k] = true
						switch rng.IntN(3) {
						case 0:
							s.prev = version{ts: 1, val: 1}
							tab.set(k, s)
							oracle[*k] = s
						case 1:
							tab.remove(k)
							delete(oracle, *k)
						}
					}
					if len(seen) != before {
						t.Fatalf("step %d: ranged over %d entries, the table held %d", step, len(seen), before)
					}
				default:
					tab.compact()
				}
				if tab.len() != len(oracle) {
					t.Fatalf("step %d: %d entries, want %d", step, tab.len(), len(oracle))
				}
				if n := len(tab.cells); n > 0 && (tab.live+tab.tombs)*4 > n*3 {
					t.Fatalf("step %d: %d live and %d deleted cells of %d", step, tab.live, tab.tombs, n)
				}
			}
			got := map[shortKey]slot{}
			for k, s := range tab.all() {
				got[*k] = s
			}
			if len(got) != len(oracle) {
				t.Fatalf("ranged over %d entries, want %d", len(got), len(oracle))
			}
			for k, want := range oracle {
				if got[k] != want {
					t.Fatalf("%q = %v, want %v", k.bytes(), got[k], want)
				}
			}
		})
	}
}

// TestCellIsOneCacheLine: the table's lookups miss the cache once because
// a cell is 64 bytes.
func TestCellIsOneCacheLine(t *testing.T) {
	if n := unsafe.Sizeof(cell{}); n != 64 {
		t.Fatalf("a cell is %d bytes, want 64", n)
	}
}

// TestSlotTableCompacts: a table a purge emptied gives its memory back.
func TestSlotTableCompacts(t *testing.T) {
	tab := newSlotTable()
	var keys []shortKey
	for i := range 10_000 {
		k, _ := toShortKey(fmt.Appendf(nil, "key%d", i))
		keys = append(keys, k)
		tab.set(&k, slot{last: version{ts: 1}})
	}
	big := len(tab.cells)
	for _, k := range keys[100:] {
		tab.remove(&k)
	}
	tab.compact()
	if len(tab.cells) >= big/8 {
		t.Fatalf("%d cells for %d entries after compaction (were %d)", len(tab.cells), tab.len(), big)
	}
	for _, k := range keys[:100] {
		if _, ok := tab.get(&k); !ok {
			t.Fatalf("%q lost by compaction", k.bytes())
		}
	}
}
