package vgpu_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/internal/fuzzcost"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestWorkloadClassBounded: however a class reaches a Workload (a pod's
// demand, AddClass, NewWorkload), one whose model filter is beyond
// Constraints' limits is not learnt, and one at the limits is.
func TestWorkloadClassBounded(t *testing.T) {
	t.Parallel()
	models := func(n, length int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%0*d", length, i)
		}
		return out
	}
	shape := vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 50, Weight: 1}
	with := func(include, exclude []string) vgpu.WorkloadClass {
		c := shape
		c.Models, c.ExcludeModels = include, exclude
		return c
	}
	tests := []struct {
		name  string
		class vgpu.WorkloadClass
		want  int
	}{
		{"at the limits", with(models(vgpu.MaxListItems, vgpu.MaxListItemLength), models(vgpu.MaxListItems, vgpu.MaxListItemLength)), 1},
		{"one model too many", with(models(vgpu.MaxListItems+1, 8), nil), 0},
		{"one excluded model too many", with(nil, models(vgpu.MaxListItems+1, 8)), 0},
		{"a model too long", with([]string{"A100", strings.Repeat("x", vgpu.MaxListItemLength+1)}, nil), 0},
		{"50,000 excluded models", with(nil, models(50000, 4)), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := &vgpu.Workload{}
			w.Add(vgpu.PodDemand{
				Request:     vgputest.Pod("p").Container("main").GPU(1).MemoryPercent(50).PodRequest(),
				Constraints: vgpu.Constraints{Models: tt.class.Models, ExcludeModels: tt.class.ExcludeModels},
			})
			w.AddClass(tt.class)
			if got := w.Len(); got != tt.want {
				t.Errorf("after Add and AddClass: %d classes, want %d", got, tt.want)
			}
			if got := vgpu.NewWorkload(tt.class).Len(); got != tt.want {
				t.Errorf("NewWorkload: %d classes, want %d", got, tt.want)
			}
		})
	}
}

// TestRequestGPUContainersBounded: a pod may ask for GPUs in at most
// MaxGPUContainersPerPod containers; the first one over is named, and the
// containers after it are not read.
func TestRequestGPUContainersBounded(t *testing.T) {
	t.Parallel()
	pod := func(n int) *vgputest.PodBuilder {
		b := vgputest.Pod("p").Sidecar("proxy").MemoryMiB(1024)
		for i := 1; i < n; i++ {
			b.Container(fmt.Sprintf("c%d", i)).GPU(1)
		}
		return b.Container("cpu-only")
	}
	got, err := vgpu.RequestFromPod(pod(vgpu.MaxGPUContainersPerPod).Obj())
	if err != nil || len(got.Containers) != vgpu.MaxGPUContainersPerPod {
		t.Fatalf("RequestFromPod(%d GPU containers) = %d containers, %v; want them all", vgpu.MaxGPUContainersPerPod, len(got.Containers), err)
	}
	// The container after the first one over is not read: its own
	// problem is not reported.
	got, err = vgpu.RequestFromPod(pod(vgpu.MaxGPUContainersPerPod + 1).Container("bad").Cores(150).Obj())
	want := `container "c32": hami.io/gpu=1: a pod may have at most 32 containers and init containers that ask for GPUs, and this is one more`
	if err == nil || err.Error() != want {
		t.Fatalf("RequestFromPod(35 GPU containers) error = %v, want\n%s", err, want)
	}
	var re *vgpu.RequestError
	if !errors.As(err, &re) {
		t.Errorf("error is no *RequestError: %T", err)
	}
	if diff := cmp.Diff(vgpu.PodRequest{}, got); diff != "" {
		t.Errorf("value with the error (-want +got):\n%s", diff)
	}
}

// TestPodAllocationLimits: ParsePodAllocation refuses a value over
// MaxPodAllocationLength before it decodes it, and an allocation of more
// containers or slices than a request may ask for; the largest allocation
// the limits allow encodes within the length and parses back.
func TestPodAllocationLimits(t *testing.T) {
	t.Parallel()
	largest := vgputest.Allocation("node-with-a-long-name-" + strings.Repeat("n", 40))
	for c := range vgpu.MaxGPUContainersPerPod {
		largest.Container(fmt.Sprintf("container-%053d", c))
		for g := range vgpu.MaxGPUsPerContainer {
			largest.Slice(fmt.Sprintf("GPU-%092d", g), vgpu.MaxMemoryMiB, vgpu.MaxPercent)
		}
	}
	raw, err := vgpu.EncodePodAllocation(largest.Obj())
	if err != nil {
		t.Fatalf("EncodePodAllocation(largest) error = %v", err)
	}
	t.Logf("the largest allocation: %d bytes", len(raw))
	if _, err := vgpu.ParsePodAllocation(raw); err != nil {
		t.Errorf("ParsePodAllocation(largest) error = %v", err)
	}

	over := vgputest.Allocation("n")
	for c := range vgpu.MaxGPUContainersPerPod + 1 {
		over.Container(fmt.Sprintf("c%d", c)).Slice("GPU-0", 1, 0)
	}
	wide := vgputest.Allocation("n").Container("main")
	for g := range vgpu.MaxGPUsPerContainer + 1 {
		wide.Slice(fmt.Sprintf("GPU-%d", g), 1, 0)
	}
	tests := []struct {
		name, raw, want string
	}{{
		name: "over the length",
		raw:  `{"version":1,"node":"n","containers":[]}` + strings.Repeat(" ", vgpu.MaxPodAllocationLength),
		want: "parse hami.io/gpu-allocation: malformed value: 131112 bytes: must be at most 131072",
	}, {
		name: "too many containers",
		raw:  encodeUnchecked(t, over.Obj()),
		want: "parse hami.io/gpu-allocation: malformed value: containers: 33 entries: must be at most 32",
	}, {
		name: "too many slices",
		raw:  encodeUnchecked(t, wide.Obj()),
		want: "parse hami.io/gpu-allocation: malformed value: containers[0].gpus: 17 slices: must be at most 16, one per GPU",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := vgpu.ParsePodAllocation(tt.raw)
			if err == nil || err.Error() != tt.want || !errors.Is(err, vgpu.ErrMalformed) {
				t.Fatalf("ParsePodAllocation() error = %v, want\n%s", err, tt.want)
			}
			if diff := cmp.Diff(vgpu.PodAllocation{}, got); diff != "" {
				t.Errorf("value with the error (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParsePodAllocationOverLengthCost: a value over MaxPodAllocationLength
// is refused for the cost of its error, whatever its length. Not parallel:
// other tests' allocations would count.
func TestParsePodAllocationOverLengthCost(t *testing.T) {
	for _, n := range []int{vgpu.MaxPodAllocationLength + 1, 1 << 20} {
		raw := `{"version":1,"node":"n","containers":[` + strings.Repeat(`{},`, n/3) + `{}]}`
		if cost, budget := fuzzcost.Measure(3, func() { _, _ = vgpu.ParsePodAllocation(raw) }), allocationBudget(raw); !cost.Within(budget) {
			t.Errorf("ParsePodAllocation of %d bytes cost %+v, want at most %+v", len(raw), cost, budget)
		}
	}
}

// encodeUnchecked writes a in the wire form of version 1 without
// validating it, as a writer other than EncodePodAllocation might.
func encodeUnchecked(t *testing.T, a vgpu.PodAllocation) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, `{"version":1,"node":%q,"containers":[`, a.Node)
	for i, c := range a.Containers {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"name":%q,"init":%t,"gpus":[`, c.Name, c.Init)
		for k, s := range c.GPUs {
			if k > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"uuid":%q,"memoryMiB":%d,"coresPercent":%d}`, s.UUID, s.MemoryMiB, s.CoresPercent)
		}
		b.WriteString("]}")
	}
	b.WriteString("]}")
	return b.String()
}

func TestAbbreviate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{strings.Repeat("x", 64), strings.Repeat("x", 64)},
		{strings.Repeat("x", 65), strings.Repeat("x", 64) + "…"},
		{strings.Repeat("é", 64), strings.Repeat("é", 64)},
		{strings.Repeat("é", 65), strings.Repeat("é", 64) + "…"},
		{"\xff" + strings.Repeat("x", 70), "\xff" + strings.Repeat("x", 63) + "…"},
	} {
		if got := vgpu.Abbreviate(tt.in); got != tt.want {
			t.Errorf("Abbreviate(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
