// Package fuzzcost bounds what handling one fuzz input costs, in heap
// allocations (and bytes) as the Go runtime counts them, never in
// wall-clock time: a bound that holds on a loaded machine as on an idle one,
// and that a parser gone quadratic, or one that allocates per byte it
// skips, breaks.
package fuzzcost

import (
	"runtime"
	"testing"
)

// Cost is what one call of a function allocated on the heap: the number of
// allocations and their bytes.
type Cost struct {
	Allocs, Bytes uint64
}

// Within reports whether c is at most budget in both allocations and bytes.
func (c Cost) Within(budget Cost) bool {
	return c.Allocs <= budget.Allocs && c.Bytes <= budget.Bytes
}

// Measure returns the heap allocations and bytes of one call of f: after
// one warm-up call, which fills what f uses (pools, lazily built tables),
// it calls f runs times (at least once) in each of three rounds and keeps
// the smallest round's average. Other goroutines' allocations during the
// calls count too (the fuzzing engine's, a test's informers); the smallest
// round leaves most of them out. Unlike testing.AllocsPerRun it leaves
// GOMAXPROCS alone, and it may be called in a fuzz worker (with Go 1.26,
// testing.AllocsPerRun there held the worker after its first inputs, and
// go test -fuzz still said PASS).
func Measure(runs int, f func()) Cost {
	runs = max(runs, 1)
	f()
	best := Cost{Allocs: ^uint64(0), Bytes: ^uint64(0)}
	for range 3 {
		c := MeasureFirst(func() {
			for range runs {
				f()
			}
		})
		best.Allocs = min(best.Allocs, c.Allocs/uint64(runs))
		best.Bytes = min(best.Bytes, c.Bytes/uint64(runs))
	}
	return best
}

// MeasureFirst is the Cost of one call of f, not warmed: for code that
// remembers its answers, whose first call is the one that works.
func MeasureFirst(f func()) Cost {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return Cost{Allocs: after.Mallocs - before.Mallocs, Bytes: after.TotalAlloc - before.TotalAlloc}
}

// Allocs returns the heap allocations of one call of f, averaged over runs
// calls after one warm-up call (Measure).
func Allocs(runs int, f func()) float64 {
	runs = max(runs, 1)
	f()
	return float64(MeasureFirst(func() {
		for range runs {
			f()
		}
	}).Allocs) / float64(runs)
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
