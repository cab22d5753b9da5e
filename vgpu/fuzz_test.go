package vgpu_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// addGolden seeds f with a golden file.
func addGolden(f *testing.F, file string) {
	b, err := os.ReadFile(filepath.Join("testdata", "protocol", file))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(b))
}

// fuzzParse checks the properties every Parse must have: it never panics; on
// error it returns the zero value and a sentinel; on success the value
// encodes, and the encoding parses back to the same value and encodes to the
// same bytes.
func fuzzParse[T any](t *testing.T, s string, parse func(string) (T, error), encode func(T) (string, error)) {
	got, err := parse(s)
	if err != nil {
		var zero T
		if diff := cmp.Diff(zero, got); diff != "" {
			t.Fatalf("parse(%q) returned a value with error %v (-want +got):\n%s", s, err, diff)
		}
		if !errors.Is(err, vgpu.ErrMalformed) && !errors.Is(err, vgpu.ErrUnknownVersion) {
			t.Fatalf("parse(%q) error %v wraps neither ErrMalformed nor ErrUnknownVersion", s, err)
		}
		return
	}
	enc, err := encode(got)
	if err != nil {
		t.Fatalf("encode(parse(%q)) error = %v", s, err)
	}
	again, err := parse(enc)
	if err != nil {
		t.Fatalf("parse(encode(parse(%q))) = parse(%q) error = %v", s, enc, err)
	}
	if diff := cmp.Diff(got, again); diff != "" {
		t.Fatalf("parse(encode(parse(%q))) mismatch (-want +got):\n%s", s, diff)
	}
	if enc2, err := encode(again); err != nil || enc2 != enc {
		t.Fatalf("encoding is not stable: %q then %q (%v)", enc, enc2, err)
	}
}

func FuzzParseNodeInventory(f *testing.F) {
	addGolden(f, "node-gpu-inventory.json")
	f.Add(`{"version":1,"node":"n","splitCount":1,"memoryScaling":0.5,"gpus":[]}`)
	f.Fuzz(func(t *testing.T, s string) {
		fuzzParse(t, s, vgpu.ParseNodeInventory, vgpu.EncodeNodeInventory)
	})
}

func FuzzParsePluginHeartbeat(f *testing.F) {
	addGolden(f, "plugin-heartbeat.json")
	f.Add(`{"version":1,"node":"n","pluginVersion":"","resourceName":"r","registered":false,"registeredAt":"","socket":""}`)
	f.Fuzz(func(t *testing.T, s string) {
		fuzzParse(t, s, vgpu.ParsePluginHeartbeat, vgpu.EncodePluginHeartbeat)
	})
}

func FuzzParsePodAllocation(f *testing.F) {
	addGolden(f, "gpu-allocation.json")
	f.Add(`{"version":1,"node":"n","containers":[{"name":"c","init":false,"gpus":[{"uuid":"u","memoryMiB":1,"coresPercent":0}]}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		fuzzParse(t, s, vgpu.ParsePodAllocation, vgpu.EncodePodAllocation)
	})
}

// FuzzRequestFromPod builds a pod whose first container (an init container
// when init is set) has the fuzzed quantities as limits; "" or a string that
// is not a quantity leaves that resource out. Properties: no panic; an error
// comes with a zero value and is made of *RequestError only; a result keeps
// the documented invariants and, written back as a pod, reads the same.
func FuzzRequestFromPod(f *testing.F) {
	f.Add("1", "10240", "", "30", false)
	f.Add("", "10Gi", "", "", true)
	f.Add("2", "", "50", "", false)
	f.Add("0", "1Ki", "101", "1.5", false)
	f.Add("17", "10G", "50", "-1", true)
	f.Fuzz(func(t *testing.T, gpu, memory, percent, cores string, init bool) {
		b := vgputest.Pod("p")
		if init {
			b.InitContainer("c")
		} else {
			b.Container("c")
		}
		for name, s := range map[corev1.ResourceName]string{
			vgpu.ResourceGPU: gpu, vgpu.ResourceMemory: memory, vgpu.ResourceMemoryPercentage: percent, vgpu.ResourceCores: cores,
		} {
			if _, err := resource.ParseQuantity(s); err == nil {
				b.Limit(name, s)
			}
		}
		got, err := vgpu.RequestFromPod(b.Obj())
		if err != nil {
			if diff := cmp.Diff(vgpu.PodRequest{}, got); diff != "" {
				t.Fatalf("RequestFromPod() returned a value with error %v (-want +got):\n%s", err, diff)
			}
			requestErrors(t, err)
			return
		}
		for _, c := range got.Containers {
			checkRequestInvariants(t, c)
		}
		again, err := vgpu.RequestFromPod(podFromRequest(got))
		if err != nil {
			t.Fatalf("RequestFromPod(podFromRequest(%+v)) error = %v", got, err)
		}
		if diff := cmp.Diff(got, again); diff != "" {
			t.Fatalf("request does not survive a trip through a pod (-want +got):\n%s", diff)
		}
	})
}

func checkRequestInvariants(t *testing.T, c vgpu.ContainerRequest) {
	t.Helper()
	if c.GPUs < 1 || c.GPUs > vgpu.MaxGPUsPerContainer {
		t.Errorf("%+v: GPUs out of range", c)
	}
	if (c.MemoryMiB > 0) == (c.MemoryPercent > 0) {
		t.Errorf("%+v: want exactly one of MemoryMiB and MemoryPercent", c)
	}
	if c.MemoryMiB < 0 || c.MemoryMiB > vgpu.MaxMemoryMiB || c.MemoryPercent < 0 || c.MemoryPercent > 100 {
		t.Errorf("%+v: memory out of range", c)
	}
	if c.CoresPercent < 0 || c.CoresPercent > 100 {
		t.Errorf("%+v: cores out of range", c)
	}
	if c.Exclusive && (c.MemoryPercent != 100 || c.CoresPercent != 100) {
		t.Errorf("%+v: exclusive without the whole GPU", c)
	}
}

// podFromRequest writes r back as a pod, in plain MiB.
func podFromRequest(r vgpu.PodRequest) *corev1.Pod {
	b := vgputest.Pod("p")
	for _, c := range r.Containers {
		switch {
		case c.Sidecar:
			b.Sidecar(c.Name)
		case c.Init:
			b.InitContainer(c.Name)
		default:
			b.Container(c.Name)
		}
		b.GPU(c.GPUs)
		if c.Exclusive {
			continue
		}
		if c.MemoryMiB > 0 {
			b.MemoryMiB(c.MemoryMiB)
		} else {
			b.MemoryPercent(c.MemoryPercent)
		}
		if c.CoresPercent > 0 {
			b.Cores(c.CoresPercent)
		}
	}
	return b.Obj()
}

func FuzzParseReadyLabel(f *testing.F) {
	for _, s := range []string{"true", "false", "", "True", "1", "true "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fuzzParse(t, s, vgpu.ParseReadyLabel, func(b bool) (string, error) { return vgpu.EncodeReadyLabel(b), nil })
	})
}

func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{"binpack", "spread", "fragmentation", "", "Binpack", "pack"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fuzzParse(t, s, vgpu.ParsePolicy, func(p vgpu.Policy) (string, error) { return string(p), nil })
	})
}

// FuzzParseConstraints feeds every placement annotation at once: ParseConstraints never panics,
// returns a zero value with an error, and reads what it accepts the same way again from the
// annotations of the value it returned.
func FuzzParseConstraints(f *testing.F) {
	f.Add("A100,H100", "T4", "GPU-a, GPU-b,", "", "true", "binpack", "spread")
	f.Add("", "", "", "GPU-x", "false", "", "fragmentation")
	f.Add(",,,", " , ", "", "", "yes", "pack", "Spread")
	f.Fuzz(func(t *testing.T, models, excludeModels, uuids, excludeUUIDs, numa, nodePolicy, gpuPolicy string) {
		annotations := map[string]string{
			vgpu.AnnotationGPUModel: models, vgpu.AnnotationGPUModelExclude: excludeModels,
			vgpu.AnnotationGPUUUID: uuids, vgpu.AnnotationGPUUUIDExclude: excludeUUIDs,
			vgpu.AnnotationNUMABind: numa, vgpu.AnnotationNodePolicy: nodePolicy, vgpu.AnnotationGPUPolicy: gpuPolicy,
		}
		got, err := vgpu.ParseConstraints(annotations)
		if err != nil {
			if diff := cmp.Diff(vgpu.Constraints{}, got); diff != "" {
				t.Fatalf("ParseConstraints returned a value with error %v (-want +got):\n%s", err, diff)
			}
			return
		}
		again, err := vgpu.ParseConstraints(annotations)
		if err != nil || !cmp.Equal(got, again) {
			t.Fatalf("ParseConstraints is not deterministic: %+v then %+v (%v)", got, again, err)
		}
	})
}
