package app

import (
	"os"
	"runtime/debug"
)

// TuneGC sets the garbage collector to grow the heap to 3× the live data
// (GOGC=200) with a soft limit of gcMemoryLimit (GOMEMLIMIT), unless the
// environment sets either. The relay's live heap is bounded by its windows
// (tens of MB), so the default GOGC=100 spends CPU collecting a small heap
// often; a larger heap costs less CPU for a little more memory. The limit
// keeps that growth, which would take the heap to about three times the
// windows, within about 100 MB of resident memory: near it the collector
// runs sooner instead. The relay binary and the bench's profiling relay
// both call it first thing, so their collectors behave alike.
func TuneGC() {
	if os.Getenv("GOGC") == "" && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetGCPercent(gcPercent)
		debug.SetMemoryLimit(gcMemoryLimit)
	}
}

// gcPercent is the default GOGC.
const gcPercent = 200

// gcMemoryLimit is the default soft limit of the Go runtime's memory.
const gcMemoryLimit = 64 << 20
