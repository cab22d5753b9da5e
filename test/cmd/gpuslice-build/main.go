// Command gpuslice-build builds Go commands one after another with go build, showing which one
// builds, how many of the packages left to compile are done, the time elapsed and an estimate of
// what is left (package progress: one updating line on a terminal, plain lines otherwise).
// hack/build-cluster.sh builds the local cluster's Kubernetes binaries with it.
//
// Usage: gpuslice-build -o DIR [-ldflags FLAGS] [-tags TAGS] PACKAGE...
//
// It first asks go list which packages are stale (not in the build cache), once for all the
// commands, and counts for each command those it is the first to need, plus one step for its
// link; go build -v then names each package as it compiles it. Output of go build that is not a package name (errors) is
// passed on. The exit status is go build's.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"strings"
	"syscall"

	"github.com/gpuslice/gpuslice/test/harness/progress"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpuslice-build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "folder to write the binaries to (required)")
	ldflags := fs.String("ldflags", "", "go build -ldflags")
	tags := fs.String("tags", "", "go build -tags")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	pkgs := fs.Args()
	if *out == "" || len(pkgs) == 0 {
		fmt.Fprintln(stderr, "gpuslice-build: -o DIR and at least one PACKAGE are required")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	r := progress.New(stdout, "build-cluster", progress.Options{})
	r.Printf("working out which packages need compiling...")
	counts, err := plan(ctx, pkgs, *tags)
	if err != nil {
		r.Printf("cannot count the packages (%v); building without counts", err)
	}
	// Each binary's units: its packages to compile and one for its link, which takes a minute
	// or more for the Kubernetes binaries even when every package is in the build cache.
	total := 0
	for _, pkg := range pkgs {
		total += counts[pkg] + 1
	}
	r.Plan(len(pkgs), total)
	for _, pkg := range pkgs {
		r.Stage(path.Base(pkg), counts[pkg]+1, "steps")
		if err := build(ctx, r, pkg, *out, *ldflags, *tags); err != nil {
			r.Finish("go build %s failed", pkg)
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return exit.ExitCode()
			}
			fmt.Fprintf(stderr, "gpuslice-build: %v\n", err)
			return 1
		}
	}
	r.Finish("built %s", strings.Join(baseNames(pkgs), ", "))
	return 0
}

// plan returns, for each of pkgs, how many stale packages (not in the build cache) it is the
// first of pkgs to need, itself included: what go build compiles for it when they are built in
// order.
func plan(ctx context.Context, pkgs []string, tags string) (map[string]int, error) {
	// One line per package of pkgs, in order: its import path, then its dependencies.
	deps, err := goList(ctx, tags, `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, pkgs)
	if err != nil {
		return nil, err
	}
	if len(deps) != len(pkgs) {
		return nil, fmt.Errorf("go list answered %d packages for %d", len(deps), len(pkgs))
	}
	// A main package is stale when it is not installed, which says nothing of compiling. A
	// package stale only because a dependency is compiles again only if that dependency's
	// export data changes, which go list cannot tell: those are left out, and the count grows
	// when go build compiles one after all (progress.Reporter.Step).
	staleLines, err := goList(ctx, tags, `{{if and .Stale (ne .Name "main") (not (eq (printf "%.17s" .StaleReason) "stale dependency:"))}}{{.ImportPath}}{{end}}`, append([]string{"-deps"}, pkgs...))
	if err != nil {
		return nil, err
	}
	stale := map[string]bool{}
	for _, l := range staleLines {
		stale[l] = true
	}
	counts := map[string]int{}
	counted := map[string]bool{}
	for i, pkg := range pkgs {
		for _, p := range strings.Fields(deps[i]) {
			if stale[p] && !counted[p] {
				counted[p] = true
				counts[pkg]++
			}
		}
	}
	return counts, nil
}

// goList runs go list -e -f format on args and returns its non-empty output lines.
func goList(ctx context.Context, tags, format string, args []string) ([]string, error) {
	a := []string{"list", "-e", "-f", format}
	if tags != "" {
		a = append(a, "-tags", tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(a, args...)...) //nolint:gosec // G204: go list of the packages asked for.
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// build runs go build -v for pkg, counting each package it names as one step of r and showing
// every other line (compiler errors) as a message of r.
func build(ctx context.Context, r *progress.Reporter, pkg, out, ldflags, tags string) error {
	args := []string{"build", "-v", "-o", out + "/"}
	if ldflags != "" {
		args = append(args, "-ldflags", ldflags)
	}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...) //nolint:gosec // G204: go build of the package asked for.
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == pkg || strings.HasSuffix(line, "/"+strings.TrimPrefix(pkg, "./")):
			r.Detail("compiling and linking " + line) // the main package: counted with the link
		case isImportPath(line):
			r.Step(line)
		default:
			r.Printf("%s", line)
		}
	}
	if err := cmd.Wait(); err != nil {
		return err
	}
	r.Last()
	r.Step("linked " + path.Base(pkg))
	return nil
}

// isImportPath reports whether a line of go build -v is a package's import path (rather than
// a compiler message or an error).
func isImportPath(line string) bool {
	return line != "" && !strings.ContainsAny(line, " \t:") && !strings.HasPrefix(line, "#")
}

// baseNames returns the last element of each import path.
func baseNames(pkgs []string) []string {
	out := make([]string, len(pkgs))
	for i, p := range pkgs {
		out[i] = path.Base(p)
	}
	return out
}
