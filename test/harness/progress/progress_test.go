package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time       { return c.t }
func (c *fakeClock) step(d time.Duration) { c.t = c.t.Add(d) }
func boolPtr(b bool) *bool                { return &b }
func newClock() *fakeClock                { return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

// TestPlainLines checks the non-terminal form: a line at each stage's start, at most one per
// Every in between, the estimate from the overall rate, and a last line.
func TestPlainLines(t *testing.T) {
	var out bytes.Buffer
	clk := newClock()
	r := New(&out, "build-cluster", Options{Terminal: boolPtr(false), Every: 10 * time.Second, Now: clk.now})
	r.Plan(2, 40)
	r.Stage("kube-apiserver", 30, "packages")
	for i := range 30 {
		clk.step(time.Second)
		if i == 29 {
			r.Last()
		}
		r.Step("pkg" + string(rune('a'+i%26)))
	}
	r.Stage("kubelet", 10, "packages")
	clk.step(5 * time.Second)
	r.Step("k8s.io/kubernetes/pkg/kubelet")
	r.Finish("built 2 binaries")
	want := []string{
		"build-cluster: [1/2] kube-apiserver 0/30 packages, 0s elapsed",
		"build-cluster: [1/2] kube-apiserver 10/30 packages, 10s elapsed, about 30s left: pkgj",
		"build-cluster: [1/2] kube-apiserver 20/30 packages, 20s elapsed, about 20s left: pkgt",
		"build-cluster: [1/2] kube-apiserver 30/30 packages, 30s elapsed, about 10s left: pkgd",
		"build-cluster: [2/2] kubelet 0/10 packages, 30s elapsed, about 10s left",
		"build-cluster: built 2 binaries in 35s",
	}
	if diff := cmp.Diff(want, strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
}

// TestTerminalLine checks the terminal form: one line rewritten in place with carriage
// returns, no newline until a message or the end, and never wider than Width.
func TestTerminalLine(t *testing.T) {
	var out bytes.Buffer
	clk := newClock()
	r := New(&out, "bench-scale", Options{Terminal: boolPtr(true), Width: 70, Now: clk.now})
	r.Stage("phase gpu", 100, "pods")
	clk.step(time.Second)
	r.Set(50, "")
	r.Printf("phase gpu: 100 pods created")
	clk.step(time.Second)
	r.Set(100, strings.Repeat("x", 80))
	r.Finish("done")
	got := out.String()
	if n := strings.Count(got, "\n"); n != 2 {
		t.Errorf("%d newlines, want 2 (the message and the end):\n%q", n, got)
	}
	for _, frame := range strings.Split(strings.ReplaceAll(got, "\n", "\r"), "\r") {
		if len(frame) >= 70 {
			t.Errorf("a line of %d characters, wider than 69: %q", len(frame), frame)
		}
	}
	for _, want := range []string{"\rbench-scale: phase gpu 50/100 pods, 1s elapsed, about 1s left", "bench-scale: phase gpu: 100 pods created\n", "bench-scale: done in 2s\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%q", want, got)
		}
	}
}

func TestIsTerminal(t *testing.T) {
	if IsTerminal(&bytes.Buffer{}) {
		t.Error("a buffer counts as a terminal")
	}
}

// TestStageGrows checks that a stage whose estimate proves low grows, one unit ahead, until its
// last step.
func TestStageGrows(t *testing.T) {
	var out bytes.Buffer
	clk := newClock()
	r := New(&out, "b", Options{Terminal: boolPtr(false), Every: time.Nanosecond, Now: clk.now})
	r.Stage("kubelet", 2, "steps")
	for range 3 {
		clk.step(time.Second)
		r.Step("p")
	}
	r.Last()
	clk.step(time.Second)
	r.Step("linked")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"b: kubelet 0/2 steps, 0s elapsed", "b: kubelet 1/2 steps, 1s elapsed, about 1s left: p", "b: kubelet 2/3 steps, 2s elapsed, about 1s left: p",
		"b: kubelet 3/4 steps, 3s elapsed, about 1s left: p", "b: kubelet 4/4 steps, 4s elapsed: linked"}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
}
