package vgpu_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/protocol")

const protocolDoc = "../docs/protocol.md"

// Examples of each value, as in docs/protocol.md.
func exampleNodeInventory() vgpu.NodeInventory {
	return vgputest.Node("gpu-node-1").
		GPUWith(vgpu.GPU{
			UUID: "GPU-8b3c6f2e-1d4a-4f5b-9c7e-0a1b2c3d4e5f", Index: 0, Minor: 0, Model: "NVIDIA A100-SXM4-80GB",
			TotalMemoryMiB: 81920, SchedulableMemoryMiB: 81408, CoresPercent: 100, NUMANode: 0,
			PCIBusID: "00000000:07:00.0", Health: vgpu.Healthy,
		}).
		GPUWith(vgpu.GPU{
			UUID: "GPU-0f9e8d7c-6b5a-4c3d-8e1f-2a3b4c5d6e7f", Index: 1, Minor: 1, Model: "NVIDIA A100-SXM4-80GB",
			TotalMemoryMiB: 81920, SchedulableMemoryMiB: 81408, CoresPercent: 100, NUMANode: 1,
			PCIBusID: "00000000:87:00.0", Health: vgpu.Unhealthy,
		}).
		Obj()
}

func examplePluginHeartbeat() vgpu.PluginHeartbeat {
	return vgpu.PluginHeartbeat{
		Node: "gpu-node-1", PluginVersion: "v0.1.0", ResourceName: string(vgpu.ResourceGPU),
		Registered: true, RegisteredAt: time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC),
		Socket: "gpuslice-1773480413.sock",
	}
}

func examplePodAllocation() vgpu.PodAllocation {
	return vgputest.Allocation("gpu-node-1").
		InitContainer("warmup").Slice("GPU-8b3c6f2e-1d4a-4f5b-9c7e-0a1b2c3d4e5f", 2048, 0).
		Container("train").
		Slice("GPU-8b3c6f2e-1d4a-4f5b-9c7e-0a1b2c3d4e5f", 10240, 30).
		Slice("GPU-0f9e8d7c-6b5a-4c3d-8e1f-2a3b4c5d6e7f", 10240, 30).
		Obj()
}

func TestGolden(t *testing.T) {
	doc, err := os.ReadFile(protocolDoc)
	if err != nil && !*update {
		t.Fatalf("read the protocol spec: %v", err)
	}
	tests := []struct {
		file   string
		encode func() (string, error)
		parse  func(string) (any, error)
		want   any
	}{{
		file:   "node-gpu-inventory.json",
		encode: func() (string, error) { return vgpu.EncodeNodeInventory(exampleNodeInventory()) },
		parse:  func(s string) (any, error) { return vgpu.ParseNodeInventory(s) },
		want:   exampleNodeInventory(),
	}, {
		file:   "plugin-heartbeat.json",
		encode: func() (string, error) { return vgpu.EncodePluginHeartbeat(examplePluginHeartbeat()) },
		parse:  func(s string) (any, error) { return vgpu.ParsePluginHeartbeat(s) },
		want:   examplePluginHeartbeat(),
	}, {
		file:   "gpu-allocation.json",
		encode: func() (string, error) { return vgpu.EncodePodAllocation(examplePodAllocation()) },
		parse:  func(s string) (any, error) { return vgpu.ParsePodAllocation(s) },
		want:   examplePodAllocation(),
	}}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			encoded, err := tt.encode()
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			var indented bytes.Buffer
			if err := json.Indent(&indented, []byte(encoded), "", "  "); err != nil {
				t.Fatalf("indent %s: %v", encoded, err)
			}
			indented.WriteString("\n")
			path := filepath.Join("testdata", "protocol", tt.file)
			if *update {
				if err := os.WriteFile(path, indented.Bytes(), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			golden, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden file (regenerate with go test ./vgpu/ -update): %v", err)
			}
			if diff := cmp.Diff(string(golden), indented.String()); diff != "" {
				t.Errorf("%s is stale; regenerate with go test ./vgpu/ -update (-want +got):\n%s", path, diff)
			}
			got, err := tt.parse(string(golden))
			if err != nil {
				t.Fatalf("parse golden: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("parse golden mismatch (-want +got):\n%s", diff)
			}
			if block := "```json\n" + string(golden) + "```\n"; !strings.Contains(string(doc), block) {
				t.Errorf("%s does not contain %s verbatim in a json block:\n%s", protocolDoc, path, block)
			}
		})
	}
}

func TestNodeInventoryRoundTrip(t *testing.T) {
	t.Parallel()
	tests := map[string]vgpu.NodeInventory{
		"example":    exampleNodeInventory(),
		"no GPUs":    vgputest.Node("empty").Obj(),
		"overcommit": vgputest.Node("n1").SplitCount(1).MemoryScaling(1.5).GPU("GPU-a", 24576).Unhealthy("GPU-a").Obj(),
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, err := vgpu.EncodeNodeInventory(in)
			if err != nil {
				t.Fatalf("EncodeNodeInventory() error = %v", err)
			}
			if again, _ := vgpu.EncodeNodeInventory(in); again != s {
				t.Errorf("EncodeNodeInventory() is not deterministic: %s then %s", s, again)
			}
			got, err := vgpu.ParseNodeInventory(s)
			if err != nil {
				t.Fatalf("ParseNodeInventory(%s) error = %v", s, err)
			}
			if diff := cmp.Diff(in, got); diff != "" {
				t.Errorf("round trip mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPluginHeartbeatRoundTrip(t *testing.T) {
	t.Parallel()
	berlin := time.FixedZone("CET", 3600)
	tests := []struct {
		name string
		in   vgpu.PluginHeartbeat
		want vgpu.PluginHeartbeat
	}{{
		name: "example",
		in:   examplePluginHeartbeat(),
		want: examplePluginHeartbeat(),
	}, {
		name: "never registered",
		in:   vgpu.PluginHeartbeat{Node: "n1", ResourceName: "hami.io/gpu"},
		want: vgpu.PluginHeartbeat{Node: "n1", ResourceName: "hami.io/gpu"},
	}, {
		name: "time converted to UTC and truncated to the second",
		in: vgpu.PluginHeartbeat{Node: "n1", ResourceName: "hami.io/gpu", Registered: true, Socket: "s.sock",
			RegisteredAt: time.Date(2026, 3, 14, 10, 26, 53, 999_999_999, berlin)},
		want: vgpu.PluginHeartbeat{Node: "n1", ResourceName: "hami.io/gpu", Registered: true, Socket: "s.sock",
			RegisteredAt: time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)},
	}, {
		name: "deregistered keeps the last registration time",
		in: vgpu.PluginHeartbeat{Node: "n1", ResourceName: "hami.io/gpu",
			RegisteredAt: time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)},
		want: vgpu.PluginHeartbeat{Node: "n1", ResourceName: "hami.io/gpu",
			RegisteredAt: time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := vgpu.EncodePluginHeartbeat(tt.in)
			if err != nil {
				t.Fatalf("EncodePluginHeartbeat() error = %v", err)
			}
			got, err := vgpu.ParsePluginHeartbeat(s)
			if err != nil {
				t.Fatalf("ParsePluginHeartbeat(%s) error = %v", s, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("round trip mismatch (-want +got):\n%s", diff)
			}
			if got.RegisteredAt.Location() != time.UTC {
				t.Errorf("RegisteredAt location = %v, want UTC", got.RegisteredAt.Location())
			}
		})
	}
}

func TestPodAllocationRoundTrip(t *testing.T) {
	t.Parallel()
	tests := map[string]vgpu.PodAllocation{
		"example":   examplePodAllocation(),
		"one slice": vgputest.Allocation("n1").Slice("GPU-a", 1, 100).Obj(),
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, err := vgpu.EncodePodAllocation(in)
			if err != nil {
				t.Fatalf("EncodePodAllocation() error = %v", err)
			}
			got, err := vgpu.ParsePodAllocation(s)
			if err != nil {
				t.Fatalf("ParsePodAllocation(%s) error = %v", s, err)
			}
			if diff := cmp.Diff(in, got); diff != "" {
				t.Errorf("round trip mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEncodeRejectsInvalid(t *testing.T) {
	t.Parallel()
	tests := map[string]func() (string, error){
		"inventory without node": func() (string, error) {
			return vgpu.EncodeNodeInventory(vgputest.Node("").GPU("GPU-a", 1).Obj())
		},
		"inventory with duplicate UUID": func() (string, error) {
			return vgpu.EncodeNodeInventory(vgputest.Node("n").GPU("GPU-a", 1).GPU("GPU-a", 1).Obj())
		},
		"heartbeat registered without socket": func() (string, error) {
			return vgpu.EncodePluginHeartbeat(vgpu.PluginHeartbeat{Node: "n", ResourceName: "r", Registered: true, RegisteredAt: time.Now()})
		},
		"heartbeat in year 10000": func() (string, error) {
			return vgpu.EncodePluginHeartbeat(vgpu.PluginHeartbeat{Node: "n", ResourceName: "r", RegisteredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
		},
		"allocation with no containers": func() (string, error) {
			return vgpu.EncodePodAllocation(vgpu.PodAllocation{Node: "n"})
		},
		"allocation with the same GPU twice": func() (string, error) {
			return vgpu.EncodePodAllocation(vgputest.Allocation("n").Slice("GPU-a", 1, 1).Slice("GPU-a", 1, 1).Obj())
		},
	}
	for name, encode := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if s, err := encode(); err == nil {
				t.Errorf("encode = %s, want an error", s)
			}
		})
	}
}

func TestReadyLabel(t *testing.T) {
	t.Parallel()
	for _, ready := range []bool{true, false} {
		got, err := vgpu.ParseReadyLabel(vgpu.EncodeReadyLabel(ready))
		if err != nil || got != ready {
			t.Errorf("ParseReadyLabel(EncodeReadyLabel(%v)) = %v, %v", ready, got, err)
		}
	}
	for _, bad := range []string{"", "True", "1", "yes", " true"} {
		got, err := vgpu.ParseReadyLabel(bad)
		if !errors.Is(err, vgpu.ErrMalformed) || got {
			t.Errorf("ParseReadyLabel(%q) = %v, %v; want false and ErrMalformed", bad, got, err)
		}
	}
}

// TestAnnotationPrefix checks that every key of the protocol starts with
// AnnotationPrefix, which caches of pods rely on.
func TestAnnotationPrefix(t *testing.T) {
	for _, key := range []string{
		vgpu.AnnotationNodeInventory, vgpu.LabelGPUReady, vgpu.AnnotationPluginHeartbeat, vgpu.AnnotationPodAllocation,
		vgpu.AnnotationGPUModel, vgpu.AnnotationGPUModelExclude, vgpu.AnnotationGPUUUID, vgpu.AnnotationGPUUUIDExclude,
		vgpu.AnnotationNUMABind, vgpu.AnnotationNodePolicy, vgpu.AnnotationGPUPolicy,
	} {
		if !strings.HasPrefix(key, vgpu.AnnotationPrefix) {
			t.Errorf("%q does not start with %q", key, vgpu.AnnotationPrefix)
		}
	}
}
