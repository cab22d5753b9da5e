package e2e

import (
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
	os.Exit(cluster.RunWithGpuslice(m, filepath.Join("..", ".."), func(dir string) { binDir = dir })) // the product module, from test/e2e
}
