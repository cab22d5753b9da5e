//go:build nvml

package gpucheck

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/test/harness/devicemanager"
)

// reportEnv names the file the report is written to; empty writes it to
// the test log only.
const reportEnv = "GPU_CHECK_REPORT"

// report collects the check's lines and writes them at the end.
type report struct {
	t     *testing.T
	lines []string
}

func (r *report) add(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	r.t.Log(line)
	r.lines = append(r.lines, line)
}

func (r *report) write() {
	path := os.Getenv(reportEnv)
	if path == "" {
		return
	}
	if err := os.WriteFile(path, []byte(strings.Join(r.lines, "\n")+"\n"), 0o600); err != nil { //nolint:gosec // G703: the path the check script chose.
		r.t.Errorf("write the report: %v", err)
	}
}

// TestGPUCheck opens NVML on this machine, lists its GPUs, opens an XID
// event stream on each, starts the device plugin on real NVML against the
// kubelet's device manager and waits until the kubelet counts every
// device, then reports what the node qualifies for. The plugin runs with
// enforcement none, so the check starts no MPS daemon.
func TestGPUCheck(t *testing.T) {
	r := &report{t: t}
	defer r.write()
	logger, ctx := ktesting.NewTestContext(t)
	backend, err := nvidia.Open(nvidia.Options{Logger: logger, EventWait: 100 * time.Millisecond})
	if err != nil {
		r.add("NVML: FAILED: %v", err)
		t.Fatal(err)
	}
	defer func() { _ = backend.Close() }()

	driver, err := backend.DriverVersion()
	if err != nil {
		r.add("driver: FAILED: %v", err)
		t.Fatal(err)
	}
	r.add("driver: %s", driver)
	gpus, err := backend.GPUs()
	if err != nil || len(gpus) == 0 {
		r.add("GPUs: FAILED: %d found, %v", len(gpus), err)
		t.Fatalf("GPUs: %d, %v", len(gpus), err)
	}
	r.add("GPUs: %d", len(gpus))
	for _, g := range gpus {
		r.add("  GPU %d: %s  %s  %d MiB  bus %s  NUMA %d  %s", g.Index, g.UUID, g.Model, g.TotalMemoryMiB, g.PCIBusID, g.NUMANode, g.Health)
	}

	xids, err := backend.CheckXIDEvents(time.Second)
	if err != nil {
		r.add("XID events: FAILED: %v", err)
		t.Error(err)
	}
	for _, x := range xids {
		if x.Registered {
			r.add("XID events: GPU %d: event stream open", x.Index)
		} else {
			r.add("XID events: GPU %d: not watched (%s)", x.Index, x.Reason)
		}
	}

	cfg := deviceplugin.DefaultConfig()
	facts := handoff.DetectNodeFacts(driver, "/sys/fs/cgroup", cfg.MPSControl)
	r.add("cgroup: v%d", facts.CgroupVersion)
	mps := facts.MPSControl
	if mps == "" {
		mps = "not found"
	}
	r.add("MPS control: %s", mps)
	r.add("enforcement the node qualifies for (strongest first): %v (hami-core needs hostLibVGPU, not set here)", handoff.QualifiedEnforcements(cfg.EnforcementConfig(), facts))

	dir, err := os.MkdirTemp("", "gpucheck")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	m := devicemanager.Start(t, dir)
	cfg.NodeName = "gpu-check"
	cfg.DevicePluginDir = dir
	cfg.CDISpecDir = filepath.Join(dir, "cdi")
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.MPSDir = filepath.Join(dir, "mps")
	cfg.PodResourcesSocket = filepath.Join(dir, "no-pod-resources.sock")
	cfg.Enforcement = "none"
	p, err := deviceplugin.New(cfg, backend, deviceplugin.Options{PluginVersion: "gpu-check", Facts: facts})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(klog.NewContext(ctx, logger))
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plugin Run: %v", err)
		}
	}()
	want := int64(len(gpus) * cfg.SplitCount)
	waitCtx, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	started := time.Now()
	if err := m.WaitResource(waitCtx, cfg.ResourceName, want, want); err != nil {
		capacity, allocatable := m.Resource(cfg.ResourceName)
		r.add("registration: FAILED: the kubelet device manager counts %s capacity %d, allocatable %d, want %d: %v", cfg.ResourceName, capacity, allocatable, want, err)
		t.Fatal(err)
	}
	r.add("registration: the kubelet device manager accepted %s with %d devices (%d GPUs x %d) in %s", cfg.ResourceName, want, len(gpus), cfg.SplitCount, time.Since(started).Round(time.Millisecond))
}
