// Package progress shows how far a long command has got: which stage runs, how much of it and of
// the whole is done, the time elapsed and an estimate of what is left. On a terminal it keeps
// one line up to date in place; otherwise (CI logs, pipes, files) it writes plain lines, at most
// one per Options.Every, so a log stays short. make cluster (hack/build-cluster.sh, through
// test/cmd/gpuslice-build) and make bench-scale use it; any long harness can.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultEvery  = 10 * time.Second
	DefaultWidth  = 120
	terminalEvery = 200 * time.Millisecond
)

// Options tune a Reporter. Zero fields take defaults.
type Options struct {
	// Terminal says whether w is a terminal (one line redrawn in place). Nil: w is a terminal
	// when it is an *os.File on a character device and TERM is not "dumb".
	Terminal *bool
	// Every is the least time between two plain lines. Default DefaultEvery.
	Every time.Duration
	// Width bounds a terminal line, so that it never wraps. Default: $COLUMNS, else DefaultWidth.
	Width int
	// Now reads the clock. Default time.Now.
	Now func() time.Time
}

// Reporter reports one command's progress to a writer. Its methods are safe for concurrent use.
type Reporter struct {
	mu       sync.Mutex
	w        io.Writer
	prefix   string
	terminal bool
	every    time.Duration
	width    int
	now      func() time.Time

	start, lastLine, stageStart time.Time
	// stage is the running stage: its name, position among stages, its units done and total
	// (0: unknown) and the unit's name.
	stage         string
	index, stages int
	done, total   int
	unit          string
	detail        string
	// last says the next Step ends the stage (Last).
	last bool
	// overallDone and overallTotal count the units of every stage (0 total: unknown).
	overallDone, overallTotal int
	// drawn is the length of the terminal line on screen, 0 when none is.
	drawn int
}

// New returns a Reporter writing to w, each line starting with prefix and ": ".
func New(w io.Writer, prefix string, opts Options) *Reporter {
	r := &Reporter{w: w, prefix: prefix, every: opts.Every, width: opts.Width, now: opts.Now}
	if r.every <= 0 {
		r.every = DefaultEvery
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.width <= 0 {
		if _, err := fmt.Sscan(os.Getenv("COLUMNS"), &r.width); err != nil || r.width <= 20 {
			r.width = DefaultWidth
		}
	}
	if opts.Terminal != nil {
		r.terminal = *opts.Terminal
	} else {
		r.terminal = IsTerminal(w)
	}
	r.start = r.now()
	return r
}

// IsTerminal reports whether w is a terminal: an *os.File on a character device, with TERM not
// "dumb".
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Plan sets the number of stages and the units of all of them together (0: unknown), for the
// overall count and estimate.
func (r *Reporter) Plan(stages, totalUnits int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stages, r.overallTotal = stages, totalUnits
}

// Stage starts the next stage, name, of total units (0: unknown) named unit ("packages",
// "pods"), and shows it at once.
func (r *Reporter) Stage(name string, total int, unit string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.index++
	r.stage, r.total, r.done, r.unit, r.detail, r.last = name, total, 0, unit, "", false
	r.stageStart = r.now()
	r.show(true)
}

// Step counts one unit of the stage done; detail names it (a package, a pod) and is shown. A
// stage whose total was an estimate that proves low grows, keeping one unit still to do.
func (r *Reporter) Step(detail string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done++
	r.overallDone++
	if r.total > 0 && r.done >= r.total && !r.last {
		r.total++
		if r.overallTotal > 0 {
			r.overallTotal++
		}
	}
	r.detail = detail
	r.show(false)
}

// Last marks the next Step as the stage's last, so that it does not grow the stage.
func (r *Reporter) Last() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = true
}

// Detail shows what the stage is doing now without counting a unit.
func (r *Reporter) Detail(detail string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.detail = detail
	r.show(false)
}

// Set sets the units of the stage done so far (for counts read from elsewhere, such as pods
// bound), with a detail to show.
func (r *Reporter) Set(done int, detail string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.overallDone += done - r.done
	r.done = done
	r.detail = detail
	r.show(false)
}

// Printf writes a message line of its own, keeping the progress line below it on a terminal.
func (r *Reporter) Printf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clear()
	fmt.Fprintf(r.w, "%s: %s\n", r.prefix, fmt.Sprintf(format, args...))
	if r.terminal && r.stage != "" {
		r.draw()
	}
}

// Finish ends the report with a last line: the message and the total time.
func (r *Reporter) Finish(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clear()
	fmt.Fprintf(r.w, "%s: %s in %s\n", r.prefix, fmt.Sprintf(format, args...), round(r.now().Sub(r.start)))
	r.stage = ""
}

// show writes the progress: on a terminal at most every terminalEvery unless force, otherwise
// at most every r.every unless force (a stage's start).
func (r *Reporter) show(force bool) {
	now := r.now()
	every := r.every
	if r.terminal {
		every = terminalEvery
	}
	if !force && now.Sub(r.lastLine) < every {
		return
	}
	r.lastLine = now
	if r.terminal {
		r.draw()
		return
	}
	fmt.Fprintf(r.w, "%s: %s\n", r.prefix, r.line(now))
}

// draw rewrites the terminal line.
func (r *Reporter) draw() {
	line := r.prefix + ": " + r.line(r.now())
	if len(line) > r.width-1 {
		line = line[:r.width-4] + "..."
	}
	pad := ""
	if r.drawn > len(line) {
		pad = strings.Repeat(" ", r.drawn-len(line))
	}
	fmt.Fprintf(r.w, "\r%s%s\r%s", line, pad, line)
	r.drawn = len(line)
}

// clear removes the terminal line, so that a plain line can be written.
func (r *Reporter) clear() {
	if r.terminal && r.drawn > 0 {
		fmt.Fprintf(r.w, "\r%s\r", strings.Repeat(" ", r.drawn))
		r.drawn = 0
	}
}

// line is the progress text: "[2/6] kubelet 340/512 packages, 3m12s elapsed, about 1m5s left:
// detail".
func (r *Reporter) line(now time.Time) string {
	var b strings.Builder
	if r.stages > 1 {
		fmt.Fprintf(&b, "[%d/%d] ", r.index, r.stages)
	}
	b.WriteString(r.stage)
	switch {
	case r.total > 0:
		fmt.Fprintf(&b, " %d/%d %s", min(r.done, r.total), r.total, r.unit)
	case r.done > 0:
		fmt.Fprintf(&b, " %d %s", r.done, r.unit)
	}
	elapsed := now.Sub(r.start)
	fmt.Fprintf(&b, ", %s elapsed", round(elapsed))
	if left, ok := r.left(now); ok {
		fmt.Fprintf(&b, ", about %s left", round(left))
	}
	if r.detail != "" {
		b.WriteString(": " + r.detail)
	}
	return b.String()
}

// left estimates the time to finish from the rate so far: of every stage when the overall
// total is known, else of the stage.
func (r *Reporter) left(now time.Time) (time.Duration, bool) {
	estimate := func(done, total int, since time.Time) (time.Duration, bool) {
		if done <= 0 || total <= done {
			return 0, false
		}
		per := now.Sub(since) / time.Duration(done)
		return per * time.Duration(total-done), true
	}
	if r.overallTotal > 0 {
		return estimate(r.overallDone, r.overallTotal, r.start)
	}
	return estimate(r.done, r.total, r.stageStart)
}

// round shortens a duration for people: whole seconds.
func round(d time.Duration) time.Duration {
	return d.Round(time.Second)
}
