package e2e

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/test/cluster"
)

// TestTearDownLeavesNothing is scenario 6: cluster.Down, reading only the state file as the demo's
// "down" does, leaves no process, no mount (in any mount namespace), no host cgroup and no file.
// Real: every Kubernetes component and gpuslice-device-plugin. Fake: NVML and the container
// runtime.
func TestTearDownLeavesNothing(t *testing.T) {
	requireHost(t)
	cgroupsBefore := kubeCgroups(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, clusterOptions(
		cluster.NodeOptions{Name: "node-a", FakeGPUs: "1xA100-80GB"},
		cluster.NodeOptions{Name: "node-b", FakeGPUs: "1xT4-16GB,1xL4-24GB"},
	))
	if err != nil {
		t.Fatalf("e2e: %v", err)
	}
	dir := c.State.Dir
	procs := append([]*cluster.Process(nil), c.State.Processes...)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			t.Logf("component logs:\n%s", c.LogTails(40))
			_ = c.Stop()
		}
	})

	// The bind mounts exist, but only in the kubelets' own mount namespaces.
	for _, n := range c.Nodes {
		if got := mountsUnder(t, []string{strconv.Itoa(n.Kubelet.PID)}, dir); len(got) < 2 {
			t.Errorf("kubelet of %s: want the /var/lib and /var/log bind mounts from %s, got %v", n.Name, dir, got)
		}
	}
	if got := mountsUnder(t, []string{"self"}, dir); len(got) != 0 {
		t.Errorf("the test's own mount namespace sees cluster mounts: %v", got)
	}

	began := time.Now()
	if err := cluster.Down(c.StatePath()); err != nil {
		t.Fatalf("Down: %v", err)
	}
	stopped = true
	t.Logf("Down stopped %d processes in %v", len(procs), time.Since(began).Round(time.Millisecond))

	for _, p := range procs {
		if !p.Exited() {
			t.Errorf("%s (pid %d) still running after Down", p.Name, p.PID)
		}
	}
	if got := mountsUnder(t, allPIDs(t), dir); len(got) != 0 {
		t.Errorf("mounts of the cluster folder left in some mount namespace: %v", got)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("cluster folder %s still there after Down (stat: %v)", dir, err)
	}
	if _, err := os.Stat("/var/lib/kubelet"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("/var/lib/kubelet exists on the host after Down (stat: %v)", err)
	}
	if after := kubeCgroups(t); len(after) != len(cgroupsBefore) {
		t.Errorf("cgroups named kube* before %v, after %v", cgroupsBefore, after)
	}
}

// mountsUnder returns the mount points, seen by the processes pids ("self" or numbers), whose
// source or target lies under dir.
func mountsUnder(t *testing.T, pids []string, dir string) []string {
	t.Helper()
	var found []string
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join("/proc", pid, "mountinfo"))
		if err != nil {
			continue // the process ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, dir) {
				found = append(found, pid+": "+line)
			}
		}
	}
	return found
}

// allPIDs lists every process now running.
func allPIDs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// kubeCgroups lists the cgroup folders named kube* (kubepods, kubelet) at the top of each cgroup
// hierarchy: a kubelet with cgroupsPerQOS would create them.
func kubeCgroups(t *testing.T) []string {
	t.Helper()
	found, err := filepath.Glob("/sys/fs/cgroup/*/kube*")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("/sys/fs/cgroup/kube*")
	return append(found, more...)
}
