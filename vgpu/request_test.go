package vgpu_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestRequestFromPod(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		pod  *corev1.Pod
		want vgpu.PodRequest
	}{{
		name: "no GPU resources",
		pod:  vgputest.Pod("p").Container("c").Limit(corev1.ResourceCPU, "1").Obj(),
		want: vgpu.PodRequest{},
	}, {
		name: "gpu only is whole exclusive GPUs",
		pod:  vgputest.Pod("p").Container("c").GPU(2).Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{
			{Name: "c", GPUs: 2, MemoryPercent: 100, CoresPercent: 100, Exclusive: true},
		}},
	}, {
		name: "gpu, memory and cores",
		pod:  vgputest.Pod("p").Container("train").GPU(1).MemoryMiB(10240).Cores(30).Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{
			{Name: "train", GPUs: 1, MemoryMiB: 10240, CoresPercent: 30},
		}},
	}, {
		name: "memory without gpu means one GPU and no cores reserved",
		pod:  vgputest.Pod("p").Container("c").MemoryMiB(4096).Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "c", GPUs: 1, MemoryMiB: 4096}}},
	}, {
		name: "cores without gpu or memory means one GPU with all its memory",
		pod:  vgputest.Pod("p").Container("c").Cores(50).Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "c", GPUs: 1, MemoryPercent: 100, CoresPercent: 50}}},
	}, {
		name: "memory percentage without gpu",
		pod:  vgputest.Pod("p").Container("c").MemoryPercent(25).Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "c", GPUs: 1, MemoryPercent: 25}}},
	}, {
		name: "percentages at their bounds",
		pod:  vgputest.Pod("p").Container("c").GPU(16).MemoryPercent(100).Cores(100).Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "c", GPUs: 16, MemoryPercent: 100, CoresPercent: 100}}},
	}, {
		name: "memory with a binary suffix is bytes",
		pod:  vgputest.Pod("p").Container("c").Limit(vgpu.ResourceMemory, "10Gi").Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "c", GPUs: 1, MemoryMiB: 10240}}},
	}, {
		name: "memory of a fractional binary quantity that is whole MiB",
		pod:  vgputest.Pod("p").Container("c").Limit(vgpu.ResourceMemory, "1.5Gi").Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "c", GPUs: 1, MemoryMiB: 1536}}},
	}, {
		name: "plain memory the API renders with a decimal suffix is still MiB",
		pod:  vgputest.Pod("p").Container("c").Limit(vgpu.ResourceMemory, "20k").Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "c", GPUs: 1, MemoryMiB: 20000}}},
	}, {
		name: "memory at its upper bound",
		pod:  vgputest.Pod("p").Container("c").MemoryMiB(vgpu.MaxMemoryMiB).Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "c", GPUs: 1, MemoryMiB: vgpu.MaxMemoryMiB}}},
	}, {
		name: "requests are read when limits are absent",
		pod: vgputest.Pod("p").Container("c").
			Request(vgpu.ResourceGPU, "2").Request(vgpu.ResourceCores, "20").Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "c", GPUs: 2, MemoryPercent: 100, CoresPercent: 20}}},
	}, {
		name: "equal limits and requests",
		pod: vgputest.Pod("p").Container("c").GPU(1).Request(vgpu.ResourceGPU, "1").
			Limit(vgpu.ResourceMemory, "1Gi").Request(vgpu.ResourceMemory, "1024Mi").Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "c", GPUs: 1, MemoryMiB: 1024}}},
	}, {
		name: "init containers first, sidecars marked, containers without GPUs skipped",
		pod: vgputest.Pod("p").
			Container("app").GPU(1).MemoryMiB(2048).
			Container("logger").Limit(corev1.ResourceMemory, "1Gi").
			InitContainer("setup").Cores(10).
			Sidecar("proxy").GPU(1).
			InitContainer("plain").
			Obj(),
		want: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{
			{Name: "setup", Init: true, GPUs: 1, MemoryPercent: 100, CoresPercent: 10},
			{Name: "proxy", Init: true, Sidecar: true, GPUs: 1, MemoryPercent: 100, CoresPercent: 100, Exclusive: true},
			{Name: "app", GPUs: 1, MemoryMiB: 2048},
		}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := vgpu.RequestFromPod(tt.pod)
			if err != nil {
				t.Fatalf("RequestFromPod() error = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("RequestFromPod() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRequestFromPodErrors(t *testing.T) {
	t.Parallel()
	const (
		gpus    = "must be an integer from 1 to 16"
		percent = "must be an integer from 1 to 100"
		memory  = "must be a whole number of MiB from 1 to 16777216: a plain number is MiB (10240), a binary suffix means bytes (10Gi)"
	)
	gpu, mem, pct, cores := string(vgpu.ResourceGPU), string(vgpu.ResourceMemory), string(vgpu.ResourceMemoryPercentage), string(vgpu.ResourceCores)
	c := func(resource, value, allowed string) vgpu.RequestError {
		return vgpu.RequestError{Container: "c", Resource: resource, Value: value, Allowed: allowed}
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want []vgpu.RequestError
	}{
		{"gpu zero", vgputest.Pod("p").Container("c").GPU(0).Obj(), []vgpu.RequestError{c(gpu, "0", gpus)}},
		{"gpu negative", vgputest.Pod("p").Container("c").GPU(-1).Obj(), []vgpu.RequestError{c(gpu, "-1", gpus)}},
		{"gpu above max", vgputest.Pod("p").Container("c").GPU(17).Obj(), []vgpu.RequestError{c(gpu, "17", gpus)}},
		{"gpu fraction", vgputest.Pod("p").Container("c").Limit(vgpu.ResourceGPU, "1.5").Obj(), []vgpu.RequestError{c(gpu, "1500m", gpus)}},
		{"gpu milli", vgputest.Pod("p").Container("c").Limit(vgpu.ResourceGPU, "500m").Obj(), []vgpu.RequestError{c(gpu, "500m", gpus)}},
		{"gpu huge", vgputest.Pod("p").Container("c").Limit(vgpu.ResourceGPU, "99999999999999999999").Obj(), []vgpu.RequestError{c(gpu, "99999999999999999999", gpus)}},
		{"cores zero", vgputest.Pod("p").Container("c").Cores(0).Obj(), []vgpu.RequestError{c(cores, "0", percent)}},
		{"cores above 100", vgputest.Pod("p").Container("c").Cores(150).Obj(), []vgpu.RequestError{c(cores, "150", percent)}},
		{"cores fraction", vgputest.Pod("p").Container("c").Limit(vgpu.ResourceCores, "10.5").Obj(), []vgpu.RequestError{c(cores, "10500m", percent)}},
		{"percentage zero", vgputest.Pod("p").Container("c").MemoryPercent(0).Obj(), []vgpu.RequestError{c(pct, "0", percent)}},
		{"percentage above 100", vgputest.Pod("p").Container("c").MemoryPercent(101).Obj(), []vgpu.RequestError{c(pct, "101", percent)}},
		{"memory zero", vgputest.Pod("p").Container("c").MemoryMiB(0).Obj(), []vgpu.RequestError{c(mem, "0", memory)}},
		{"memory negative", vgputest.Pod("p").Container("c").MemoryMiB(-1024).Obj(), []vgpu.RequestError{c(mem, "-1024", memory)}},
		{"memory fraction", vgputest.Pod("p").Container("c").Limit(vgpu.ResourceMemory, "10.5").Obj(), []vgpu.RequestError{c(mem, "10500m", memory)}},
		{"memory bytes not whole MiB", vgputest.Pod("p").Container("c").Limit(vgpu.ResourceMemory, "1Ki").Obj(), []vgpu.RequestError{c(mem, "1Ki", memory)}},
		{"memory decimal suffix too large", vgputest.Pod("p").Container("c").Limit(vgpu.ResourceMemory, "10G").Obj(), []vgpu.RequestError{c(mem, "10G", memory)}},
		{"memory bytes too large", vgputest.Pod("p").Container("c").Limit(vgpu.ResourceMemory, "17Ti").Obj(), []vgpu.RequestError{c(mem, "17Ti", memory)}},
		{
			"memory and percentage together",
			vgputest.Pod("p").Container("c").MemoryMiB(1024).MemoryPercent(50).Obj(),
			[]vgpu.RequestError{c(mem, "1024", "must not be set together with hami.io/gpumem-percentage (50): set one of them")},
		},
		{
			"limit and request differ",
			vgputest.Pod("p").Container("c").Cores(30).Request(vgpu.ResourceCores, "40").Obj(),
			[]vgpu.RequestError{c(cores, "30", "must equal its request (40): an extended resource's request and limit must be equal")},
		},
		{
			"every problem at once, in container then resource order",
			vgputest.Pod("p").
				Container("train").GPU(17).Cores(150).
				Container("ok").GPU(1).
				InitContainer("setup").MemoryMiB(0).MemoryPercent(200).
				Obj(),
			[]vgpu.RequestError{
				{Container: "setup", Init: true, Resource: mem, Value: "0", Allowed: memory},
				{Container: "setup", Init: true, Resource: pct, Value: "200", Allowed: percent},
				{Container: "setup", Init: true, Resource: mem, Value: "0", Allowed: "must not be set together with hami.io/gpumem-percentage (200): set one of them"},
				{Container: "train", Resource: gpu, Value: "17", Allowed: gpus},
				{Container: "train", Resource: cores, Value: "150", Allowed: percent},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := vgpu.RequestFromPod(tt.pod)
			if err == nil {
				t.Fatalf("RequestFromPod() = %+v, want an error", got)
			}
			if diff := cmp.Diff(vgpu.PodRequest{}, got); diff != "" {
				t.Errorf("RequestFromPod() returned a value with its error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, requestErrors(t, err)); diff != "" {
				t.Errorf("RequestFromPod() errors mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// requestErrors unpacks the joined error of RequestFromPod, failing the test
// when a part is not a *vgpu.RequestError.
func requestErrors(t *testing.T, err error) []vgpu.RequestError {
	t.Helper()
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		t.Fatalf("error %v is not a joined error", err)
	}
	var out []vgpu.RequestError
	for _, e := range joined.Unwrap() {
		var re *vgpu.RequestError
		if !errors.As(e, &re) {
			t.Fatalf("error %v is not a *vgpu.RequestError", e)
		}
		out = append(out, *re)
	}
	return out
}

func TestRequestErrorMessage(t *testing.T) {
	t.Parallel()
	pod := vgputest.Pod("p").Container("train").Cores(150).InitContainer("setup").GPU(0).Obj()
	_, err := vgpu.RequestFromPod(pod)
	want := `init container "setup": hami.io/gpu=0: must be an integer from 1 to 16` + "\n" +
		`container "train": hami.io/gpucores=150: must be an integer from 1 to 100`
	if err == nil || err.Error() != want {
		t.Errorf("RequestFromPod() error =\n%v\nwant\n%s", err, want)
	}
	var re *vgpu.RequestError
	if !errors.As(err, &re) || re.Container != "setup" {
		t.Errorf("errors.As(%v) = %+v, want the first *RequestError", err, re)
	}
}

func TestRequestFromPodNil(t *testing.T) {
	t.Parallel()
	if got, err := vgpu.RequestFromPod(nil); err == nil {
		t.Errorf("RequestFromPod(nil) = %+v, want an error", got)
	}
}

// TestDemandOf checks that a pod's demand is its request, its placement
// annotations and its host requests, and that an invalid request or
// annotation is an error that says which and wraps the cause.
func TestDemandOf(t *testing.T) {
	t.Parallel()
	b := vgputest.Pod("p").Annotation(vgpu.AnnotationNodePolicy, "spread").
		Container("main").GPU(1).MemoryMiB(2048).Request(corev1.ResourceCPU, "500m").Request(corev1.ResourceMemory, "1Gi")
	want := vgpu.PodDemand{
		Request:     b.PodRequest(),
		Constraints: vgpu.Constraints{NodePolicy: vgpu.PolicySpread},
		Host:        vgpu.HostResources{CPUMilli: 500, MemoryMiB: 1024},
	}
	got, err := vgpu.DemandOf(b.Obj())
	if err != nil {
		t.Fatalf("DemandOf() error = %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DemandOf() (-want +got):\n%s", diff)
	}
	tests := map[string]struct {
		pod  *corev1.Pod
		want string
	}{
		"request":    {vgputest.Pod("p").Container("main").GPU(1).Cores(150).Obj(), `invalid GPU request: container "main": hami.io/gpucores=150: must be an integer from 1 to 100`},
		"annotation": {vgputest.Pod("p").Annotation(vgpu.AnnotationGPUPolicy, "pack").Container("main").GPU(1).Obj(), `invalid placement annotation: hami.io/gpu-policy="pack": must be one of binpack, spread, fragmentation`},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := vgpu.DemandOf(tt.pod)
			if err == nil || err.Error() != tt.want || errors.Unwrap(err) == nil {
				t.Errorf("DemandOf() = %+v, %v, want an error %q that wraps its cause", got, err, tt.want)
			}
		})
	}
}
