package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// pluginPath is the gpuslice-device-plugin binary TestMain built from the working tree, so that the
// tests never run a stale one; empty when the tests will skip. Written once, before any test runs.
var pluginPath string

// TestMain builds gpuslice-device-plugin from the product module into a temporary folder (seconds
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
		build := exec.Command("go", "build", "-o", dir+"/", "./cmd/gpuslice-device-plugin")
		build.Dir = filepath.Join("..", "..") // the product module, from test/e2e
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: build gpuslice-device-plugin: %v\n", err)
			return 1
		}
		pluginPath = filepath.Join(dir, "gpuslice-device-plugin")
	}
	return m.Run()
}
