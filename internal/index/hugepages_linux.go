package index

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

const hugePage = 2 << 20

// adviseHugePages asks the kernel to back a large slot table with 2 MiB
// pages. A lookup of a random key in a table of hundreds of megabytes
// misses the TLB as well as the cache, and with 4 KiB pages the page walk
// costs about as much as the miss itself; with huge pages the TLB covers
// the table. Where transparent huge pages are "madvise" (a common default)
// the Go heap gets none unless asked. It is advice: an error changes
// nothing but speed.
func adviseHugePages(cells []cell) {
	size := uintptr(len(cells)) * unsafe.Sizeof(cell{})
	if size < 2*hugePage {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(cells)))
	from := (start + hugePage - 1) &^ (hugePage - 1) // whole huge pages inside the table
	to := (start + size) &^ (hugePage - 1)
	if to <= from {
		return
	}
	_ = unix.Madvise(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(cells)), from-start)), to-from), unix.MADV_HUGEPAGE)
}
