//go:build !linux

package index

// adviseHugePages does nothing here: huge-page advice is Linux's.
func adviseHugePages([]cell) {}
