package vgputest

import "runtime"

// Cost is what one call of a function allocated on the heap: the number of
// allocations and their bytes.
type Cost struct {
	Allocs, Bytes uint64
}

// Within reports whether c is at most budget in both allocations and bytes.
func (c Cost) Within(budget Cost) bool {
	return c.Allocs <= budget.Allocs && c.Bytes <= budget.Bytes
}

// Measure calls f once to warm what it uses (pools, lazily built tables),
// then runs times (at least once) in each of three rounds, and returns the
// smallest round's average Cost of a call. Allocations of other goroutines
// of the process count too (the fuzzing engine's, a test's informers); the
// smallest round leaves most of them out. Cost fuzzers call it on every
// input, so that a parser whose work grows with its input beyond what its
// limits allow fails on the input that shows it, without timing anything.
func Measure(runs int, f func()) Cost {
	runs = max(runs, 1)
	f()
	best := Cost{Allocs: ^uint64(0), Bytes: ^uint64(0)}
	var before, after runtime.MemStats
	for range 3 {
		runtime.ReadMemStats(&before)
		for range runs {
			f()
		}
		runtime.ReadMemStats(&after)
		best.Allocs = min(best.Allocs, (after.Mallocs-before.Mallocs)/uint64(runs))
		best.Bytes = min(best.Bytes, (after.TotalAlloc-before.TotalAlloc)/uint64(runs))
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
