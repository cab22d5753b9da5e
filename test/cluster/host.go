package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// GpusliceCommands are the product binaries a cluster runs, and the operator's CLI the tests run
// against it, under cmd/ of the product module.
var GpusliceCommands = []string{"gpuslice-device-plugin", DRAPluginName, ExtenderName, WebhookName, "gpuslice"}

// HostSupport returns nil when this machine can run a cluster, else why it cannot: not root
// (the kubelet bind-mounts /var/lib and /var/log in its own mount namespace), no unshare(1), or
// the cluster binaries not built.
func HostSupport() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (the kubelet bind-mounts /var/lib and /var/log in its own mount namespace)")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		return fmt.Errorf("needs unshare(1) from util-linux: %w", err)
	}
	_, err := FindBinDir()
	return err
}

// BuildGpuslice builds GpusliceCommands from the product module in moduleDir into outDir, with
// the grpcnotrace tag of the Makefile (make build, make image) and hack/build-cluster.sh, so that tests
// never run stale binaries (seconds with a warm build cache). The compiler's output goes to
// stderr.
func BuildGpuslice(moduleDir, outDir string) error {
	args := []string{"build", "-tags", "grpcnotrace", "-o", outDir + "/"}
	for _, cmd := range GpusliceCommands {
		args = append(args, "./cmd/"+cmd)
	}
	build := exec.Command("go", args...) //nolint:gosec // G204: go build of this repository's own commands
	build.Dir = moduleDir
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build %v: %w", GpusliceCommands, err)
	}
	return nil
}

// RunWithGpuslice is the body of a TestMain for tests that run a cluster of gpuslice's binaries:
// where HostSupport allows, it builds them (BuildGpuslice) from the product module in moduleDir
// into a new temporary folder and hands the folder to use, then runs m and removes the folder.
// It returns m's exit code, or 1 when the folder or the build fails. Where HostSupport does not
// allow, it runs m alone: the tests skip or, with CI=true, fail.
func RunWithGpuslice(m interface{ Run() int }, moduleDir string, use func(binDir string)) int {
	if HostSupport() != nil {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "gpuslice-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "build gpuslice: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := BuildGpuslice(moduleDir, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	use(dir)
	return m.Run()
}
