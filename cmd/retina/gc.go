package main

import (
	"os"
	"runtime/debug"
)

// defaultGCPercent trades memory for CPU. Ingestion allocates for every
// change it decodes, and at Go's default of 100 the collector took about a
// fifth of two cores in `retina bench e2e`; at 400 it runs a quarter as often.
// The memory limit below keeps the larger heap target from growing past
// what the machine has.
const defaultGCPercent = 400

// memoryLimitShare is the share of physical memory the Go heap may use
// before the collector runs regardless of GOGC.
const memoryLimitShare = 0.5

// tuneGC sets the collector's defaults for a long-running data process.
// GOGC and GOMEMLIMIT, when set, win.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		if total := physicalMemory(); total > 0 {
			debug.SetMemoryLimit(int64(float64(total) * memoryLimitShare))
		}
	}
}
