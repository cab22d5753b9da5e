package vgpu_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestParseConstraints(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		annotations map[string]string
		want        vgpu.Constraints
	}{{
		name: "none",
		want: vgpu.Constraints{},
	}, {
		name: "every key",
		annotations: map[string]string{
			vgpu.AnnotationGPUModel:        "A100, H100,",
			vgpu.AnnotationGPUModelExclude: "40GB",
			vgpu.AnnotationGPUUUID:         "GPU-a,GPU-b",
			vgpu.AnnotationGPUUUIDExclude:  " GPU-c ",
			vgpu.AnnotationNUMABind:        "true",
			vgpu.AnnotationNodePolicy:      "spread",
			vgpu.AnnotationGPUPolicy:       "fragmentation",
			"unrelated":                    "ignored",
		},
		want: vgpu.Constraints{
			Models: []string{"A100", "H100"}, ExcludeModels: []string{"40GB"},
			UUIDs: []string{"GPU-a", "GPU-b"}, ExcludeUUIDs: []string{"GPU-c"},
			NUMABind: true, NodePolicy: vgpu.PolicySpread, GPUPolicy: vgpu.PolicyFragmentation,
		},
	}, {
		name:        "numa-bind false",
		annotations: map[string]string{vgpu.AnnotationNUMABind: "false", vgpu.AnnotationGPUPolicy: "binpack"},
		want:        vgpu.Constraints{GPUPolicy: vgpu.PolicyBinpack},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := vgpu.ParseConstraints(tt.annotations)
			if err != nil {
				t.Fatalf("ParseConstraints() error = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseConstraints() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseConstraintsErrors(t *testing.T) {
	t.Parallel()
	pod := vgputest.Pod("p").Annotation(vgpu.AnnotationNUMABind, "yes").
		Annotation(vgpu.AnnotationNodePolicy, "pack").Annotation(vgpu.AnnotationGPUPolicy, "Spread").Obj()
	got, err := vgpu.ConstraintsFromPod(pod)
	if diff := cmp.Diff(vgpu.Constraints{}, got); diff != "" {
		t.Errorf("ConstraintsFromPod() value on error (-want +got):\n%s", diff)
	}
	want := `hami.io/numa-bind="yes": must be "true" or "false"` + "\n" +
		`hami.io/node-policy="pack": must be one of binpack, spread, fragmentation` + "\n" +
		`hami.io/gpu-policy="Spread": must be one of binpack, spread, fragmentation`
	if err == nil || err.Error() != want {
		t.Fatalf("ConstraintsFromPod() error = %v, want\n%s", err, want)
	}
	if !errors.Is(err, vgpu.ErrMalformed) {
		t.Errorf("error does not wrap ErrMalformed")
	}
	var ae *vgpu.AnnotationError
	if !errors.As(err, &ae) || ae.Key != vgpu.AnnotationNUMABind || ae.Value != "yes" {
		t.Errorf("errors.As(*AnnotationError) = %+v", ae)
	}
}
