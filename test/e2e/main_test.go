package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuslice/gpuslice/test/cluster"
)

// binDir holds the gpuslice binaries TestMain built from the working tree, so that the tests never
// run stale ones; empty when the tests will skip. Written once, before any test runs.
var binDir string

// TestMain builds the gpuslice binaries from the product module into a temporary folder (seconds
// with a warm build cache), runs the tests and removes the folder.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

// run is TestMain's body, so that deferred clean-up runs before os.Exit.
func run(m *testing.M) int {
	if os.Geteuid() == 0 {
		dir, err := os.MkdirTemp("", "gpuslice-e2e-bin-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		if err := cluster.BuildGpuslice(filepath.Join("..", ".."), dir); err != nil { // the product module, from test/e2e
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return 1
		}
		binDir = dir
	}
	return m.Run()
}
