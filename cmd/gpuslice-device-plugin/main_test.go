package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
)

// TestBadStart runs the real binary the way a user would and checks that
// every start-up failure is one clear line on stderr with a non-zero exit
// code, never a panic or a stack trace. "no driver" is real here: this
// machine has no NVIDIA driver, so NVML's Init fails for real.
func TestBadStart(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gpuslice-device-plugin")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	badFile := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badFile, []byte("splitCount: 4\nmemoryScale: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pluginDir := filepath.Join(dir, "device-plugins")

	tests := []struct {
		name     string
		args     []string
		env      []string
		wantCode int
		want     []string // substrings of the one stderr line
	}{
		{name: "no node name", args: []string{"--fake-gpus=dgxa100"}, wantCode: 2, want: []string{"nodeName", "NODE_NAME"}},
		{name: "split count zero", args: []string{"--node-name=n1", "--split-count=0"}, wantCode: 2, want: []string{"splitCount", "from 1 to 100"}},
		{name: "memory scaling negative", args: []string{"--node-name=n1", "--memory-scaling=-1"}, wantCode: 2, want: []string{"memoryScaling", "above 0"}},
		{name: "exclude not a GPU", args: []string{"--node-name=n1", "--exclude-gpus=0,first"}, wantCode: 2, want: []string{"excludeGPUs", "first", "UUID"}},
		{name: "resource name", args: []string{"--node-name=n1", "--resource-name=gpu"}, wantCode: 2, want: []string{"resourceName", "hami.io/gpu"}},
		{name: "unknown field in config file", args: []string{"--node-name=n1", "--config=" + badFile}, wantCode: 2, want: []string{"memoryScale"}},
		{name: "bad fake GPU spec", args: []string{"--node-name=n1", "--fake-gpus=3xBANANA", "--device-plugin-dir=" + pluginDir}, wantCode: 2, want: []string{"fakeGPUs", "BANANA"}},
		{name: "missing faults folder", args: []string{"--node-name=n1", "--fake-gpus=1xT4-16GB", "--fake-gpu-faults-dir=" + filepath.Join(dir, "absent"), "--device-plugin-dir=" + pluginDir}, wantCode: 2, want: []string{"fakeGPUFaultsDir", "absent"}},
		{name: "stray argument", args: []string{"--node-name=n1", "extra"}, wantCode: 2, want: []string{"extra"}},
		{name: "unknown mode", args: []string{"--node-name=n1", "--mode=docker"}, wantCode: 2, want: []string{"mode", "docker", "cdi", "env"}},
		{name: "relative CDI spec dir", args: []string{"--node-name=n1", "--cdi-spec-dir=cdi"}, wantCode: 2, want: []string{"cdiSpecDir", "absolute"}},
		{name: "relative libvgpu", args: []string{"--node-name=n1", "--host-libvgpu=libvgpu.so"}, wantCode: 2, want: []string{"hostLibVGPU", "libvgpu.so"}},
		{name: "unknown enforcement", args: []string{"--node-name=n1", "--enforcement=cgroup"}, wantCode: 2, want: []string{"enforcement", "cgroup", "auto", "hami-core"}},
		{name: "bad fake node fact", args: []string{"--node-name=n1", "--fake-gpus=1xT4-16GB;cgroup=3", "--device-plugin-dir=" + pluginDir}, wantCode: 2, want: []string{"fakeGPUs", "cgroup=3"}},
		{name: "fake MPS without the binary", args: []string{"--node-name=n1", "--fake-gpus=1xT4-16GB;mps", "--mps-control=" + filepath.Join(dir, "no-mps"), "--device-plugin-dir=" + pluginDir},
			wantCode: 1, want: []string{"report MPS", "no-mps", "not found"}},
		{name: "forced MPS without the binary", args: []string{"--node-name=n1", "--fake-gpus=1xT4-16GB", "--enforcement=mps", "--mps-control=" + filepath.Join(dir, "no-mps"), "--device-plugin-dir=" + pluginDir},
			wantCode: 1, want: []string{"enforcement=mps", "not found"}},
		{name: "no NVIDIA driver", args: []string{"--node-name=n1", "--device-plugin-dir=" + pluginDir}, wantCode: 1, want: []string{"NVML", "--fake-gpus"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, tt.args...)
			cmd.Env = append(os.Environ(), "NODE_NAME=")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			cmd.WaitDelay = 10 * time.Second
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("exit: %v, want exit code %d\nstderr:\n%s", err, tt.wantCode, stderr.String())
			}
			if exit.ExitCode() != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstderr:\n%s", exit.ExitCode(), tt.wantCode, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			last := lines[len(lines)-1]
			if strings.Contains(stderr.String(), "panic") || strings.Contains(stderr.String(), "goroutine ") {
				t.Errorf("stderr shows a crash:\n%s", stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(last, w) {
					t.Errorf("error line %q does not mention %q", last, w)
				}
			}
		})
	}
}

// TestFlagsOverrideConfigFile checks the precedence: defaults, then the
// --config file, then flags given on the command line, wherever --config
// stands among them.
func TestFlagsOverrideConfigFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plugin.yaml")
	if err := os.WriteFile(file, []byte("nodeName: from-file\nsplitCount: 4\nexcludeGPUs: [\"1\"]\nleaseRenew: 2s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := parseFlags("test", []string{"--split-count=7", "--config=" + file, "--exclude-gpus=0,GPU-x", "--memory-scaling=1.5"})
	if err != nil {
		t.Fatal(err)
	}
	got := []any{cfg.NodeName, cfg.SplitCount, cfg.ExcludeGPUs, cfg.LeaseRenew.Duration, cfg.MemoryScaling}
	want := []any{"from-file", 7, []string{"0", "GPU-x"}, 2 * time.Second, 1.5}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("nodeName, splitCount, excludeGPUs, leaseRenew, memoryScaling (-want +got):\n%s", diff)
	}
}

func TestHandoffFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plugin.yaml")
	if err := os.WriteFile(file, []byte("nodeName: n1\nmode: env\ncdiSpecDir: /etc/cdi\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := parseFlags("test", []string{"--config=" + file, "--mode=cdi", "--pod-resources-socket=/run/pr.sock",
		"--host-libvgpu=/opt/hami/libvgpu.so", "--shared-cache-dir=/tmp/hami", "--state-dir=/var/lib/gpuslice"})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{string(cfg.Mode), cfg.CDISpecDir, cfg.PodResourcesSocket, cfg.HostLibVGPU, cfg.SharedCacheDir, cfg.StateDir}
	want := []string{"cdi", "/etc/cdi", "/run/pr.sock", "/opt/hami/libvgpu.so", "/tmp/hami", "/var/lib/gpuslice"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mode, cdiSpecDir, podResourcesSocket, hostLibVGPU, sharedCacheDir, stateDir (-want +got):\n%s", diff)
	}
}

// TestNodeFactsOfFakeGPUs: fake GPUs report their spec's facts, so that the
// plugin picks the mechanism a real node with those facts would: driver
// only once the toolkit's memory-limit hook is found too (hooked).
func TestNodeFactsOfFakeGPUs(t *testing.T) {
	mps := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if err := os.WriteFile(mps, []byte("#!/bin/sh\n"), 0o700); err != nil { //nolint:gosec // G306: an executable for the test.
		t.Fatal(err)
	}
	tests := []struct {
		spec         string
		want         handoff.NodeFacts
		mech, hooked vgpu.Enforcement
	}{
		{"2xA100-80GB;driver=615.20;cgroup=2", handoff.NodeFacts{DriverVersion: "615.20", CgroupVersion: 2}, vgpu.EnforcementNone, vgpu.EnforcementDriver},
		{"1xT4-16GB;mps;cgroup=1", handoff.NodeFacts{DriverVersion: "550.54.15", CgroupVersion: 1, MPSControl: mps}, vgpu.EnforcementMPS, vgpu.EnforcementMPS},
		{"1xT4-16GB;cgroup=2", handoff.NodeFacts{DriverVersion: "550.54.15", CgroupVersion: 2}, vgpu.EnforcementNone, vgpu.EnforcementNone},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			cfg := deviceplugin.DefaultConfig()
			cfg.NodeName = "n1"
			cfg.FakeGPUs = tt.spec
			cfg.MPSControl = mps
			backend, err := openBackend(t.Context(), cfg, klog.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = backend.Close() }()
			got, err := nodeFacts(cfg, backend)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("nodeFacts (-want +got):\n%s", diff)
			}
			if q := handoff.QualifiedEnforcements(cfg.EnforcementConfig(), got); q[0] != tt.mech {
				t.Errorf("QualifiedEnforcements = %v, want %s first", q, tt.mech)
			}
			got.DriverHook.Found = true
			if q := handoff.QualifiedEnforcements(cfg.EnforcementConfig(), got); q[0] != tt.hooked {
				t.Errorf("QualifiedEnforcements with the memory-limit hook = %v, want %s first", q, tt.hooked)
			}
		})
	}
}
