package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// GpusliceCommands are the product binaries a cluster runs, under cmd/ of the product module.
var GpusliceCommands = []string{"gpuslice-device-plugin", ExtenderName, WebhookName}

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
// the grpcnotrace tag of the Makefile, the Dockerfile and hack/build-cluster.sh, so that tests
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
