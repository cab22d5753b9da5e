package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/node/nvidia"
)

// GPUProcess is a compute process on a fake GPU: in a container of a pod, or on the host when
// Pod is nil.
type GPUProcess struct {
	// Pod is the pod the process runs in, with its status as the kubelet reported it (the
	// container's ID); nil for a process outside Kubernetes.
	Pod *corev1.Pod
	// Container is the name of the pod's container.
	Container string
	// MemoryMiB is the GPU memory the process holds.
	MemoryMiB int64
}

// hostProcessCgroup is the cgroup of a process outside Kubernetes.
const hostProcessCgroup = "0::/system.slice/gpu-job.service\n"

// SetGPUProcesses makes procs the compute processes of the node's fake GPU at index, with the
// utilisation, as the driver would report them while they run: it writes each process's
// /proc/<pid>/cgroup under ProcDir (a kubelet cgroupfs path naming the pod's UID and the
// container's ID, as runc leaves it), then an activity file into FaultsDir, and waits until the
// plugin has applied it. The plugin then counts each process's memory as its container's (or as
// unattributed, for a host process). It replaces what ran on the GPU before; no procs leaves it
// idle. It fails for a container that has no ID yet (not started) and when the plugin rejects
// the file. Not with a chart.
func (n *Node) SetGPUProcesses(ctx context.Context, index, utilizationPercent int, procs ...GPUProcess) error {
	if n.c.chart != nil {
		return errors.New("SetGPUProcesses: not with a chart (its plugin reads the host's /proc)")
	}
	activity := nvidia.FakeActivity{UtilizationPercent: utilizationPercent}
	for i, p := range procs {
		// PIDs of their own per GPU, far above the host's: the files are all the plugin reads.
		pid := 4_000_000 + index*1000 + i
		cgroup := hostProcessCgroup
		if p.Pod != nil {
			id := ""
			for _, st := range p.Pod.Status.ContainerStatuses {
				if st.Name == p.Container {
					_, id, _ = strings.Cut(st.ContainerID, "://")
				}
			}
			if id == "" {
				return fmt.Errorf("SetGPUProcesses: %s/%s container %s has no container ID in its status (not started?)", p.Pod.Namespace, p.Pod.Name, p.Container)
			}
			cgroup = fmt.Sprintf("0::/kubepods/besteffort/pod%s/%s\n", p.Pod.UID, id)
		}
		dir := filepath.Join(n.ProcDir(), strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("SetGPUProcesses: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o600); err != nil {
			return fmt.Errorf("SetGPUProcesses: %w", err)
		}
		activity.Processes = append(activity.Processes, nvidia.FakeProcess{PID: pid, MemoryMiB: p.MemoryMiB})
	}
	path, err := nvidia.WriteFakeFault(n.FaultsDir(), nvidia.FakeFault{GPU: index, Activity: &activity})
	if err != nil {
		return err
	}
	return n.c.waitFor(ctx, fmt.Sprintf("%s's plugin applying %s", n.Name, filepath.Base(path)), []*Process{n.Plugin}, func(context.Context) (bool, error) {
		if _, err := os.Stat(path + nvidia.RejectedSuffix); err == nil {
			return false, fmt.Errorf("%s's plugin rejected the activity file (see its log)", n.Name)
		}
		_, err := os.Stat(path)
		return errors.Is(err, fs.ErrNotExist), nil
	})
}

// pluginHealthPort returns the port of a --health-address in args, or a free one when there is
// none.
func pluginHealthPort(args []string) (int, error) {
	for _, a := range args {
		if addr, ok := strings.CutPrefix(a, "--health-address="); ok {
			p, err := strconv.Atoi(addr[strings.LastIndexByte(addr, ':')+1:])
			if err != nil {
				return 0, fmt.Errorf("plugin argument %s: want host:port", a)
			}
			return p, nil
		}
	}
	return freePort()
}
