package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// binDir holds the gpuslice binaries TestMain built from the working tree, so that the tests never
// run stale ones; empty when the tests will skip. Written once, before any test runs.
var binDir string

// gpusliceCommands are the product binaries the cluster runs, and the operator's CLI the tests
// run against it.
var gpusliceCommands = []string{"gpuslice-device-plugin", "gpuslice-scheduler", "gpuslice-webhook", "gpuslice"}

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
		// The tag of the Makefile, the Dockerfile and hack/build-cluster.sh.
		args := []string{"build", "-tags", "grpcnotrace", "-o", dir + "/"}
		for _, cmd := range gpusliceCommands {
			args = append(args, "./cmd/"+cmd)
		}
		build := exec.Command("go", args...)
		build.Dir = filepath.Join("..", "..") // the product module, from test/e2e
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: build %v: %v\n", gpusliceCommands, err)
			return 1
		}
		binDir = dir
	}
	return m.Run()
}
