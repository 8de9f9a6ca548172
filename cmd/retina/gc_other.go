//go:build !linux

package main

// physicalMemory is unknown here: the heap has no limit beyond GOMEMLIMIT.
func physicalMemory() uint64 { return 0 }
