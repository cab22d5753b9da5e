package vgpu_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestNodeInventoryLookups(t *testing.T) {
	t.Parallel()
	inv := vgputest.Node("n1").GPU("GPU-a", 81920).GPU("GPU-b", 40960).GPU("GPU-c", 40960).Unhealthy("GPU-b").Obj()
	tests := []struct {
		uuid   string
		want   vgpu.GPU
		wantOK bool
	}{
		{uuid: "GPU-b", want: inv.GPUs[1], wantOK: true},
		{uuid: "GPU-x", want: vgpu.GPU{}, wantOK: false},
		{uuid: "", want: vgpu.GPU{}, wantOK: false},
	}
	for _, tt := range tests {
		t.Run(tt.uuid, func(t *testing.T) {
			t.Parallel()
			got, ok := inv.GPU(tt.uuid)
			if ok != tt.wantOK {
				t.Errorf("GPU(%q) ok = %v, want %v", tt.uuid, ok, tt.wantOK)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("GPU(%q) mismatch (-want +got):\n%s", tt.uuid, diff)
			}
		})
	}
	if got := inv.Healthy(); got != 2 {
		t.Errorf("Healthy() = %d, want 2", got)
	}
	if got := vgputest.Node("n").Obj().Healthy(); got != 0 {
		t.Errorf("Healthy() of a node without GPUs = %d, want 0", got)
	}
}

func TestNodeInventoryValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	inv := vgputest.Node("").SplitCount(0).GPU("", 0).Obj()
	err := inv.Validate()
	want := []string{"node: must not be empty", "splitCount=0", "gpus[0].uuid: must not be empty", "gpus[0].totalMemoryMiB=0"}
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate() = %v, want it to mention %q", err, w)
		}
	}
}

func TestPodAllocationContainer(t *testing.T) {
	t.Parallel()
	a := examplePodAllocation()
	if got, ok := a.Container("train"); !ok || got.Name != "train" || len(got.GPUs) != 2 {
		t.Errorf("Container(train) = %+v, %v", got, ok)
	}
	if got, ok := a.Container("missing"); ok {
		t.Errorf("Container(missing) = %+v, true; want false", got)
	}
}

func TestHeartbeatLeaseName(t *testing.T) {
	t.Parallel()
	long := func(n int, end string) string { return strings.Repeat("a", n-len(end)) + end }
	tests := []struct {
		name string
		node string
		want string // "" means only check validity and length
	}{
		{name: "short", node: "gpu-node-1", want: "gpuslice-gpu-node-1"},
		{name: "dotted", node: "ip-10-0-0-1.ec2.internal", want: "gpuslice-ip-10-0-0-1.ec2.internal"},
		{name: "longest kept as is", node: long(244, ""), want: "gpuslice-" + long(244, "")},
		{name: "one too long", node: long(245, ""), want: "gpuslice-" + long(228, "") + "5553f05514a6f627"},
		{name: "longest node name", node: long(253, "")},
		{name: "cut lands on a dot", node: long(226, "") + ".b" + long(24, "")},
		{name: "cut lands on a dash", node: long(226, "") + "-b" + long(24, "")},
		{name: "cut after a dot", node: long(227, "") + ".b" + long(23, "")},
		{name: "cut after a dash", node: long(227, "") + "-b" + long(23, "")},
		{name: "same prefix, other tail", node: long(228, "") + "b" + long(24, "")},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		got := vgpu.HeartbeatLeaseName(tt.node)
		if tt.want != "" && got != tt.want {
			t.Errorf("%s: HeartbeatLeaseName() = %q, want %q", tt.name, got, tt.want)
		}
		// The chart's node policy, which cannot hash, checks a shortened
		// name by its length and the node name's first characters.
		if full := "gpuslice-" + tt.node; len(full) > 253 &&
			(len(got) != 253 || !strings.HasPrefix(got, "gpuslice-"+tt.node[:vgpu.HeartbeatLeaseNodePrefix])) {
			t.Errorf("%s: HeartbeatLeaseName() = %q, want 253 characters starting with gpuslice- and the node's first %d", tt.name, got, vgpu.HeartbeatLeaseNodePrefix)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("%s: HeartbeatLeaseName() = %q, not a valid name: %v", tt.name, got, errs)
		}
		if again := vgpu.HeartbeatLeaseName(tt.node); again != got {
			t.Errorf("%s: HeartbeatLeaseName() not stable: %q then %q", tt.name, got, again)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("%s: HeartbeatLeaseName() = %q, same as for %s", tt.name, got, other)
		}
		seen[got] = tt.name
	}
}
