package vgpu_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// fourGPUs is a node with four 16 GiB GPUs on two NUMA nodes.
func fourGPUs() *vgputest.NodeBuilder {
	return vgputest.Node("n1").
		GPU("GPU-0", 16384).GPU("GPU-1", 16384).GPU("GPU-2", 16384).GPU("GPU-3", 16384).
		NUMA("GPU-2", 1).NUMA("GPU-3", 1)
}

func TestFitErrors(t *testing.T) {
	t.Parallel()
	t4 := vgputest.Node("t4").GPU("GPU-a", 15360).GPU("GPU-b", 15360).GPU("GPU-c", 15360).GPU("GPU-d", 15360).
		Model("GPU-a", "Tesla T4").Model("GPU-b", "Tesla T4").Model("GPU-c", "Tesla T4").Model("GPU-d", "Tesla T4")
	tests := []struct {
		name  string
		pod   *vgputest.PodBuilder
		node  vgpu.NodeInventory
		usage *vgpu.NodeUsage
		want  *vgpu.FitError
	}{{
		name: "node without GPUs",
		pod:  vgputest.Pod("p").GPU(1),
		node: vgputest.Node("n1").Obj(),
		want: &vgpu.FitError{Reason: vgpu.ReasonUnhealthy, Message: "not enough healthy GPUs: needs 1, node has no GPU"},
	}, {
		name: "too few healthy GPUs",
		pod:  vgputest.Pod("p").GPU(4).MemoryMiB(1024),
		node: fourGPUs().Unhealthy("GPU-1").Obj(),
		want: &vgpu.FitError{Reason: vgpu.ReasonUnhealthy, Message: "not enough healthy GPUs: needs 4, node has 3 healthy of 4"},
	}, {
		name: "no GPU of the model",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationGPUModel, "A100").MemoryMiB(1024),
		node: t4.Obj(),
		want: &vgpu.FitError{Reason: vgpu.ReasonModel, Message: "no GPU of model A100 (node has: Tesla T4 x4)"},
	}, {
		name: "too few GPUs of the model",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationGPUModel, "t4").GPU(2).MemoryMiB(1024),
		node: fourGPUs().Model("GPU-3", "Tesla T4").Obj(),
		want: &vgpu.FitError{Reason: vgpu.ReasonModel, Message: "not enough GPUs of model t4: needs 2, node has 1 (node has: NVIDIA A100-SXM4-80GB x3, Tesla T4 x1)"},
	}, {
		name: "model excluded",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationGPUModelExclude, "T4").MemoryMiB(1024),
		node: t4.Obj(),
		want: &vgpu.FitError{Reason: vgpu.ReasonModel, Message: "no GPU of model not T4 (node has: Tesla T4 x4)"},
	}, {
		name: "uuid filter",
		pod: vgputest.Pod("p").Annotation(vgpu.AnnotationGPUUUID, "GPU-0,GPU-9").
			Annotation(vgpu.AnnotationGPUUUIDExclude, "GPU-0").MemoryMiB(1024),
		node: fourGPUs().Obj(),
		want: &vgpu.FitError{Reason: vgpu.ReasonUUID, Message: "not enough GPUs pass the UUID filter (hami.io/gpu-uuid=GPU-0,GPU-9; hami.io/gpu-uuid-exclude=GPU-0): needs 1, 0 of 4 healthy GPUs pass"},
	}, {
		name:  "no free slice",
		pod:   vgputest.Pod("p").MemoryMiB(1024),
		node:  vgputest.Node("n1").SplitCount(2).GPU("GPU-0", 16384).Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 1024, 0).Container("b").Slice("GPU-0", 1024, 0).Obj()),
		want:  &vgpu.FitError{Reason: vgpu.ReasonNoFreeSlice, Message: "no free slice: needs a free slice on 1 GPU, 0 of 1 has one (at most 2 slices per GPU)"},
	}, {
		name:  "whole GPU needs an untouched GPU",
		pod:   vgputest.Pod("p").GPU(2),
		node:  fourGPUs().Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 1024, 0).Slice("GPU-1", 1024, 0).Slice("GPU-2", 1024, 0).Obj()),
		want:  &vgpu.FitError{Reason: vgpu.ReasonNoFreeSlice, Message: "no free slice: needs 2 GPUs untouched for whole-GPU use, 1 is"},
	}, {
		name:  "insufficient memory",
		pod:   vgputest.Pod("p").MemoryMiB(20480),
		node:  vgputest.Node("n1").GPU("GPU-0", 16384).GPU("GPU-1", 24576).Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-1", 8192, 0).Obj()),
		want:  &vgpu.FitError{Reason: vgpu.ReasonInsufficientMemory, Message: "insufficient memory: needs 20480 MiB, largest free 16384 MiB on GPU-0"},
	}, {
		name:  "insufficient memory on several GPUs",
		pod:   vgputest.Pod("p").GPU(2).MemoryMiB(10240),
		node:  vgputest.Node("n1").GPU("GPU-0", 16384).GPU("GPU-1", 16384).Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-1", 8192, 0).Obj()),
		want:  &vgpu.FitError{Reason: vgpu.ReasonInsufficientMemory, Message: "insufficient memory: needs 10240 MiB on each of 2 GPUs, 1 has it free; largest free elsewhere 8192 MiB on GPU-1"},
	}, {
		name:  "insufficient memory in percent",
		pod:   vgputest.Pod("p").MemoryPercent(50),
		node:  vgputest.Node("n1").GPU("GPU-0", 16384).Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 12288, 0).Obj()),
		want:  &vgpu.FitError{Reason: vgpu.ReasonInsufficientMemory, Message: "insufficient memory: needs 50 percent of GPU memory, largest free 25 percent (4096 MiB) on GPU-0"},
	}, {
		name:  "insufficient cores",
		pod:   vgputest.Pod("p").MemoryMiB(1024).Cores(30),
		node:  vgputest.Node("n1").GPU("GPU-0", 16384).GPU("GPU-1", 16384).Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 1024, 80).Slice("GPU-1", 1024, 90).Obj()),
		want:  &vgpu.FitError{Reason: vgpu.ReasonInsufficientCores, Message: "insufficient cores: needs 30 percent, largest free 20 percent on GPU-0"},
	}, {
		name: "GPU offering less than 100% cannot be taken whole",
		pod:  vgputest.Pod("p").GPU(1),
		node: vgputest.Node("n1").GPU("GPU-0", 16384).Cores("GPU-0", 50).Obj(),
		want: &vgpu.FitError{Reason: vgpu.ReasonInsufficientCores, Message: "insufficient cores: needs 100 percent, largest free 50 percent on GPU-0"},
	}, {
		name:  "numa",
		pod:   vgputest.Pod("p").Annotation(vgpu.AnnotationNUMABind, "true").GPU(2).MemoryMiB(8192),
		node:  fourGPUs().Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 16384, 0).Slice("GPU-2", 16384, 0).Obj()),
		want:  &vgpu.FitError{Reason: vgpu.ReasonNUMA, Message: "no NUMA node has 2 fitting GPUs for hami.io/numa-bind (fitting GPUs per NUMA node: 0: 1, 1: 1)"},
	}, {
		name: "second container names itself",
		pod:  vgputest.Pod("p").Container("a").MemoryMiB(10240).Container("b").MemoryMiB(10240),
		node: vgputest.Node("n1").GPU("GPU-0", 16384).Obj(),
		want: &vgpu.FitError{Reason: vgpu.ReasonInsufficientMemory, Container: 1, Message: `container "b": insufficient memory: needs 10240 MiB, largest free 6144 MiB on GPU-0`},
	}, {
		name:  "regular init container alone does not fit",
		pod:   vgputest.Pod("p").InitContainer("warm").GPU(1).Container("main").MemoryMiB(1024),
		node:  vgputest.Node("n1").GPU("GPU-0", 16384).Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 1024, 0).Obj()),
		want:  &vgpu.FitError{Reason: vgpu.ReasonNoFreeSlice, Message: `init container "warm": no free slice: needs 1 GPU untouched for whole-GPU use, 0 are`},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pod := tt.pod.Obj()
			c, err := vgpu.ConstraintsFromPod(pod)
			if err != nil {
				t.Fatal(err)
			}
			_, err = vgpu.Fit(vgpu.PodDemand{Request: tt.pod.PodRequest(), Constraints: c},
				vgpu.NodeState{Inventory: tt.node, Usage: tt.usage}, vgpu.FitOptions{})
			var got *vgpu.FitError
			if !errors.As(err, &got) {
				t.Fatalf("Fit() error = %v, want a *FitError", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Fit() error mismatch (-want +got):\n%s", diff)
			}
			// ReasonOnly: the same reason and container, no message; the
			// need message names no GPU of the node.
			d := vgpu.PodDemand{Request: tt.pod.PodRequest(), Constraints: c}
			_, err = vgpu.Fit(d, vgpu.NodeState{Inventory: tt.node, Usage: tt.usage}, vgpu.FitOptions{ReasonOnly: true})
			var short *vgpu.FitError
			if !errors.As(err, &short) || short.Reason != tt.want.Reason || short.Container != tt.want.Container || short.Message != "" {
				t.Errorf("Fit(ReasonOnly) error = %#v, want reason %s, container %d, no message", err, tt.want.Reason, tt.want.Container)
			}
			if msg := vgpu.NeedMessage(d, got); msg == "" || strings.Contains(msg, "largest free") || strings.Contains(msg, "node has: ") || strings.Contains(msg, "healthy of") {
				t.Errorf("NeedMessage = %q, want what the pod needs without the node's details", msg)
			}
			// kube-scheduler formats an extender's messages into events:
			// a percent sign would be read as a verb.
			for _, msg := range []string{got.Message, vgpu.NeedMessage(d, got)} {
				if strings.Contains(msg, "%") {
					t.Errorf("message %q holds a percent sign", msg)
				}
			}
		})
	}
}

func TestFit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		pod   *vgputest.PodBuilder
		node  vgpu.NodeInventory
		usage *vgpu.NodeUsage
		opts  vgpu.FitOptions
		want  vgpu.PodAllocation
	}{{
		name:  "binpack takes the most used GPU",
		pod:   vgputest.Pod("p").MemoryMiB(4096).Cores(10),
		node:  fourGPUs().Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-2", 4096, 0).Container("b").Slice("GPU-1", 8192, 0).Obj()),
		want:  vgputest.Allocation("n1").Container("main").Slice("GPU-1", 4096, 10).Obj(),
	}, {
		name:  "spread takes the least used GPU, lowest index on ties",
		pod:   vgputest.Pod("p").Annotation(vgpu.AnnotationGPUPolicy, "spread").MemoryMiB(4096),
		node:  fourGPUs().Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 4096, 0).Obj()),
		want:  vgputest.Allocation("n1").Container("main").Slice("GPU-1", 4096, 0).Obj(),
	}, {
		name:  "global spread",
		pod:   vgputest.Pod("p").MemoryMiB(4096),
		node:  fourGPUs().Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 4096, 0).Obj()),
		opts:  vgpu.FitOptions{GPUPolicy: vgpu.PolicySpread},
		want:  vgputest.Allocation("n1").Container("main").Slice("GPU-1", 4096, 0).Obj(),
	}, {
		name:  "fragmentation keeps a GPU whole for whole-GPU requests",
		pod:   vgputest.Pod("p").Annotation(vgpu.AnnotationGPUPolicy, "fragmentation").MemoryPercent(25),
		node:  vgputest.Node("n1").GPU("GPU-0", 16384).GPU("GPU-1", 16384).Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-1", 4096, 0).Obj()),
		want:  vgputest.Allocation("n1").Container("main").Slice("GPU-1", 4096, 0).Obj(),
	}, {
		name:  "whole GPUs take all memory and cores",
		pod:   vgputest.Pod("p").GPU(2),
		node:  fourGPUs().Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 1024, 0).Obj()),
		want:  vgputest.Allocation("n1").Container("main").Slice("GPU-1", 16384, 100).Slice("GPU-2", 16384, 100).Obj(),
	}, {
		name: "percent of schedulable memory",
		pod:  vgputest.Pod("p").MemoryPercent(50).Cores(20),
		node: vgputest.Node("n1").GPU("GPU-0", 16384).Schedulable("GPU-0", 15000).Obj(),
		want: vgputest.Allocation("n1").Container("main").Slice("GPU-0", 7500, 20).Obj(),
	}, {
		name:  "best effort fits a GPU whose cores are all reserved",
		pod:   vgputest.Pod("p").MemoryMiB(1024),
		node:  vgputest.Node("n1").GPU("GPU-0", 16384).Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 1024, 100).Obj()),
		want:  vgputest.Allocation("n1").Container("main").Slice("GPU-0", 1024, 0).Obj(),
	}, {
		name:  "numa binding picks one NUMA node",
		pod:   vgputest.Pod("p").Annotation(vgpu.AnnotationNUMABind, "true").GPU(2).MemoryMiB(8192),
		node:  fourGPUs().Obj(),
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-1", 1024, 0).Obj()),
		want:  vgputest.Allocation("n1").Container("main").Slice("GPU-1", 8192, 0).Slice("GPU-0", 8192, 0).Obj(),
	}, {
		name: "regular init container reuses the app container's memory",
		pod: vgputest.Pod("p").InitContainer("warm").MemoryMiB(12288).
			Container("main").MemoryMiB(12288),
		node: vgputest.Node("n1").GPU("GPU-0", 16384).Obj(),
		want: vgputest.Allocation("n1").InitContainer("warm").Slice("GPU-0", 12288, 0).
			Container("main").Slice("GPU-0", 12288, 0).Obj(),
	}, {
		name: "sidecar and app container add up",
		pod: vgputest.Pod("p").Sidecar("proxy").MemoryMiB(8192).
			Container("main").MemoryMiB(8192),
		node: vgputest.Node("n1").GPU("GPU-0", 16384).GPU("GPU-1", 16384).Obj(),
		want: vgputest.Allocation("n1").InitContainer("proxy").Slice("GPU-0", 8192, 0).
			Container("main").Slice("GPU-0", 8192, 0).Obj(),
	}, {
		name: "no GPU request fits with no containers",
		pod:  vgputest.Pod("p").Container("c"),
		node: vgputest.Node("n1").Obj(),
		want: vgputest.Allocation("n1").Obj(),
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := vgpu.ConstraintsFromPod(tt.pod.Obj())
			if err != nil {
				t.Fatal(err)
			}
			p, err := vgpu.Fit(vgpu.PodDemand{Request: tt.pod.PodRequest(), Constraints: c},
				vgpu.NodeState{Inventory: tt.node, Usage: tt.usage}, tt.opts)
			if err != nil {
				t.Fatalf("Fit() error = %v", err)
			}
			if diff := cmp.Diff(tt.want, p.Allocation); diff != "" {
				t.Errorf("Fit() allocation mismatch (-want +got):\n%s", diff)
			}
			if len(p.Allocation.Containers) > 0 {
				if err := p.Allocation.Validate(); err != nil {
					t.Errorf("allocation does not validate: %v", err)
				}
			}
		})
	}
}

// TestFitUnscored checks FitOptions.Unscored: the same allocation, with the
// figures only Score reads left zero.
func TestFitUnscored(t *testing.T) {
	inv := vgputest.Node("n1").GPU("GPU-0", 81920).GPU("GPU-1", 81920).Obj()
	usage := vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 20480, 30).Obj())
	req := vgputest.Pod("p").MemoryMiB(10240).Cores(20).PodRequest()
	for _, policy := range vgpu.Policies() {
		opts := vgpu.FitOptions{NodePolicy: policy, GPUPolicy: policy}
		scored, err := vgpu.Fit(vgpu.PodDemand{Request: req}, vgpu.NodeState{Inventory: inv, Usage: usage}, opts)
		if err != nil {
			t.Fatal(err)
		}
		opts.Unscored = true
		unscored, err := vgpu.Fit(vgpu.PodDemand{Request: req}, vgpu.NodeState{Inventory: inv, Usage: usage}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(scored.Allocation, unscored.Allocation); diff != "" {
			t.Errorf("%s: allocation differs (-scored +unscored):\n%s", policy, diff)
		}
		if scored.UsedAfter == 0 || unscored.UsedBefore != 0 || unscored.UsedAfter != 0 || unscored.FragmentationBefore != 0 || unscored.FragmentationAfter != 0 {
			t.Errorf("%s: scored used after %v; unscored figures %+v, want all zero", policy, scored.UsedAfter, unscored)
		}
	}
}
