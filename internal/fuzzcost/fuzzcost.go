// Package fuzzcost bounds what handling one fuzz input costs, in heap
// allocations per byte of the input as the Go runtime counts them, never in
// wall-clock time: a bound that holds on a loaded machine as on an idle one,
// and that a parser gone quadratic, or one that allocates per byte it
// skips, breaks.
package fuzzcost

import (
	"runtime"
	"testing"
)

// Allocs returns the heap allocations of one call of f, averaged over runs
// calls after one warm-up call. Unlike testing.AllocsPerRun it leaves
// GOMAXPROCS alone, and it may be called in a fuzz worker (with Go 1.26,
// testing.AllocsPerRun there held the worker after its first inputs, and
// go test -fuzz still said PASS); other goroutines' allocations
// during the calls count too, so a bound on it must leave room for them.
func Allocs(runs int, f func()) float64 {
	f()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(runs)
}

// Runs is how many calls Check averages over: enough to smooth out a
// background allocation, few enough for a fuzzer to keep its pace.
const Runs = 3

// Check fails t when f, which handles one input of n bytes, allocates more
// than base + perByte×n times per call (Allocs over Runs calls); what names
// the call in the failure.
func Check(t testing.TB, what string, n int, base, perByte float64, f func()) {
	t.Helper()
	limit := base + perByte*float64(n)
	if got := Allocs(Runs, f); got > limit {
		t.Fatalf("%s of %d bytes: %.0f allocations, want at most %.0f + %.1f per byte (%.0f)", what, n, got, base, perByte, limit)
	}
}
