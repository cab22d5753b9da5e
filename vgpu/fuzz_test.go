package vgpu_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuslice/gpuslice/internal/fuzzcost"
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

// FuzzParsePodAllocation checks fuzzParse's properties and a cost bound:
// the value is on pods, which the extender parses under its state's lock
// and the device plugin on every container start, so a parse allocates at
// most allocationBudget of its length (TestPodAllocationLimits checks that
// a value over MaxPodAllocationLength is refused for the cost of its
// error).
func FuzzParsePodAllocation(f *testing.F) {
	addGolden(f, "gpu-allocation.json")
	f.Add(`{"version":1,"node":"n","containers":[{"name":"c","init":false,"gpus":[{"uuid":"u","memoryMiB":1,"coresPercent":0}]}]}`)
	f.Add(`{"version":1,"node":"n","containers":[` + strings.Repeat(`{},`, 2000) + `{}]}`)
	f.Add(`{"version":1,"node":"n","containers":[{"name":"c","init":false,"gpus":[` + strings.Repeat(`{},`, 2000) + `{}]}]}`)
	f.Add(`{"version":1,"node":"n","containers":[` + strings.Repeat(`{"name":"c","init":false,"gpus":[{"uuid":"u","memoryMiB":1,"coresPercent":0}]},`, 31) + `{}]}`)
	f.Add(strings.Repeat("[", 5000))
	f.Fuzz(func(t *testing.T, s string) {
		fuzzParse(t, s, vgpu.ParsePodAllocation, vgpu.EncodePodAllocation)
		got := fuzzcost.Measure(fuzzcost.Runs, func() { _, _ = vgpu.ParsePodAllocation(s) })
		if budget := allocationBudget(s); !got.Within(budget) {
			t.Fatalf("ParsePodAllocation of %d bytes (%q) cost %+v, want at most %+v", len(s), vgpu.Abbreviate(s), got, budget)
		}
	})
}

// allocationBudget is what ParsePodAllocation of s may allocate: a few
// hundred allocations and 64 KiB, plus one allocation per 2 bytes and 64
// bytes per byte of a value it decodes; the measured worst inputs (empty
// containers or slices by the thousand) take a tenth of an allocation and
// 35 bytes per byte. A value over MaxPodAllocationLength is refused for
// the cost of its error.
func allocationBudget(s string) fuzzcost.Cost {
	if len(s) > vgpu.MaxPodAllocationLength {
		return fuzzcost.Cost{Allocs: 8, Bytes: 512}
	}
	return fuzzcost.Cost{Allocs: 256 + uint64(len(s))/2, Bytes: 64<<10 + 64*uint64(len(s))}
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

// constraintsBudget is what ParseConstraints may allocate, whatever the
// values' lengths: the limits bound what it keeps (the most, four lists of
// 32 items, takes 25 allocations and 4 KiB) and what an error quotes.
var constraintsBudget = fuzzcost.Cost{Allocs: 64, Bytes: 16 << 10}

// maxConstraintsMessage bounds the message of ParseConstraints' error: eight
// keys, each quoting at most MaxShownValueRunes runes of its value.
const maxConstraintsMessage = 4 << 10

// FuzzParseConstraints feeds every placement annotation at once: ParseConstraints never panics,
// returns a zero value with an error, keeps every list within the limits, reads what it accepts
// the same way again, and allocates and says no more than constraintsBudget and
// maxConstraintsMessage, however long the values.
func FuzzParseConstraints(f *testing.F) {
	f.Add("A100,H100", "T4", "GPU-a, GPU-b,", "", "true", "binpack", "spread", "required")
	f.Add("", "", "", "GPU-x", "false", "", "fragmentation", "mps")
	f.Add(",,,", " , ", "", "", "yes", "pack", "Spread", "strict")
	huge := strings.Repeat("40GB,", 40960)
	f.Add(huge, huge, huge, huge, huge, huge, huge, huge)
	f.Add(strings.Repeat("a,", 2000), strings.Repeat(",", 4096), strings.Repeat("x", 97), strings.Repeat("GPU-0,", 33), "", "", "", "")
	items := make([]string, vgpu.MaxListItems)
	for i := range items {
		items[i] = fmt.Sprintf("%096d", i)
	}
	atLimit := strings.Join(items, ",")
	f.Add(atLimit, atLimit, atLimit, atLimit, "true", "spread", "binpack", "driver")
	f.Fuzz(func(t *testing.T, models, excludeModels, uuids, excludeUUIDs, numa, nodePolicy, gpuPolicy, enforcement string) {
		annotations := map[string]string{
			vgpu.AnnotationGPUModel: models, vgpu.AnnotationGPUModelExclude: excludeModels,
			vgpu.AnnotationGPUUUID: uuids, vgpu.AnnotationGPUUUIDExclude: excludeUUIDs,
			vgpu.AnnotationNUMABind: numa, vgpu.AnnotationNodePolicy: nodePolicy, vgpu.AnnotationGPUPolicy: gpuPolicy,
			vgpu.AnnotationEnforcement: enforcement,
		}
		cost := fuzzcost.Measure(fuzzcost.Runs, func() { _, _ = vgpu.ParseConstraints(annotations) })
		if !cost.Within(constraintsBudget) {
			t.Fatalf("ParseConstraints of values of %d bytes in all cost %+v, want at most %+v", valueBytes(annotations), cost, constraintsBudget)
		}
		got, err := vgpu.ParseConstraints(annotations)
		if err != nil {
			if diff := cmp.Diff(vgpu.Constraints{}, got); diff != "" {
				t.Fatalf("ParseConstraints returned a value with error %v (-want +got):\n%s", err, diff)
			}
			if n := len(err.Error()); n > maxConstraintsMessage {
				t.Fatalf("ParseConstraints error of %d bytes, want at most %d: %s", n, maxConstraintsMessage, vgpu.Abbreviate(err.Error()))
			}
			return
		}
		for _, list := range [][]string{got.Models, got.ExcludeModels, got.UUIDs, got.ExcludeUUIDs} {
			if len(list) > vgpu.MaxListItems || slices.ContainsFunc(list, func(s string) bool { return len(s) > vgpu.MaxListItemLength }) {
				t.Fatalf("ParseConstraints kept a list beyond the limits: %d items", len(list))
			}
		}
		again, err := vgpu.ParseConstraints(annotations)
		if err != nil || !cmp.Equal(got, again) {
			t.Fatalf("ParseConstraints is not deterministic: %+v then %+v (%v)", got, again, err)
		}
	})
}

// valueBytes is the length of annotations' values together.
func valueBytes(annotations map[string]string) int {
	n := 0
	for _, v := range annotations {
		n += len(v)
	}
	return n
}

// requestBudget is what RequestFromPod may allocate for a pod of gpu
// containers that ask for GPUs: 32 allocations and 2 KiB per container it
// reads, which is at most MaxGPUContainersPerPod+1 of them (measured: 15
// allocations and 1.2 KiB for a container with four invalid values),
// whatever the pod's size.
func requestBudget(gpu int) fuzzcost.Cost {
	read := uint64(min(max(gpu, 0), vgpu.MaxGPUContainersPerPod+1)) //nolint:gosec // G115: 0..MaxGPUContainersPerPod+1
	return fuzzcost.Cost{Allocs: 16 + 32*read, Bytes: 1024 + 2048*read}
}

// FuzzRequestFromPodCost builds a pod of n containers, every every-th of
// which (when every > 0) has the fuzzed quantities as limits, as
// FuzzRequestFromPod does, and the others none: RequestFromPod allocates no
// more than requestBudget of the GPU containers, and reads no container
// past the first one over MaxGPUContainersPerPod.
func FuzzRequestFromPodCost(f *testing.F) {
	f.Add("1", "10240", "", "30", uint16(1), uint8(1))
	f.Add("17", "10G", "150", "-1", uint16(2000), uint8(1))
	f.Add("", "1Gi", "", "", uint16(2000), uint8(60))
	f.Add("2", "", "50", "", uint16(33), uint8(1))
	f.Fuzz(func(t *testing.T, gpu, memory, percent, cores string, n uint16, every uint8) {
		b := vgputest.Pod("p")
		gpuContainers := 0
		for i := range int(n) {
			b.Container(fmt.Sprintf("c%d", i))
			if every == 0 || i%int(every) != 0 {
				continue
			}
			set := false
			for name, s := range map[corev1.ResourceName]string{
				vgpu.ResourceGPU: gpu, vgpu.ResourceMemory: memory, vgpu.ResourceMemoryPercentage: percent, vgpu.ResourceCores: cores,
			} {
				if _, err := resource.ParseQuantity(s); err == nil {
					b.Limit(name, s)
					set = true
				}
			}
			if set {
				gpuContainers++
			}
		}
		pod := b.Obj()
		cost := fuzzcost.Measure(fuzzcost.Runs, func() { _, _ = vgpu.RequestFromPod(pod) })
		if budget := requestBudget(gpuContainers); !cost.Within(budget) {
			t.Fatalf("RequestFromPod of %d containers, %d asking for GPUs, cost %+v, want at most %+v", n, gpuContainers, cost, budget)
		}
		got, err := vgpu.RequestFromPod(pod)
		if err == nil && len(got.Containers) > vgpu.MaxGPUContainersPerPod {
			t.Fatalf("RequestFromPod accepted %d GPU containers", len(got.Containers))
		}
		if err != nil {
			requestErrors(t, err)
		}
	})
}
