package vgpu_test

import (
	"errors"
	"fmt"
	"strings"
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

// TestParseConstraintsLimits: a placement value over a limit is an
// *AnnotationError naming the key, the limit and the value's length, and
// quoting no more than the first MaxShownValueRunes runes of it; values at
// the limits parse.
func TestParseConstraintsLimits(t *testing.T) {
	t.Parallel()
	// 96-byte items, the most a list item may hold.
	item := func(i int) string { return fmt.Sprintf("GPU-%092d", i) }
	list := func(n int) string {
		items := make([]string, n)
		for i := range items {
			items[i] = item(i)
		}
		return strings.Join(items, ", ")
	}
	huge := strings.Repeat("40GB,", 40960) // 200 KiB
	tests := []struct {
		name        string
		annotations map[string]string
		want        string // the error; "" for none
	}{{
		name:        "200 KiB exclude list",
		annotations: map[string]string{vgpu.AnnotationGPUModelExclude: huge},
		want: `hami.io/gpu-model-exclude="` + huge[:64] + `…" (204800 bytes): must be at most 4096 bytes: ` +
			`at most 32 models of at most 96 bytes each`,
	}, {
		name:        "33 UUIDs",
		annotations: map[string]string{vgpu.AnnotationGPUUUID: list(33)},
		want:        `hami.io/gpu-uuid="` + list(33)[:64] + `…" (3232 bytes): must list at most 32 GPU UUIDs, not 33`,
	}, {
		name:        "an item of 97 bytes",
		annotations: map[string]string{vgpu.AnnotationGPUModel: "A100," + strings.Repeat("x", 97)},
		want:        `hami.io/gpu-model="A100,` + strings.Repeat("x", 59) + `…" (102 bytes): each of the models must be at most 96 bytes: item 2 is 97 bytes`,
	}, {
		name:        "a policy over the length limit",
		annotations: map[string]string{vgpu.AnnotationGPUPolicy: strings.Repeat("é", 3000)},
		want:        `hami.io/gpu-policy="` + strings.Repeat("é", 64) + `…" (6000 bytes): must be at most 4096 bytes`,
	}, {
		name: "every list at its limits",
		annotations: map[string]string{
			vgpu.AnnotationGPUModel: list(32), vgpu.AnnotationGPUModelExclude: list(32) + ",,, ",
			vgpu.AnnotationGPUUUID: list(32), vgpu.AnnotationGPUUUIDExclude: list(32),
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := vgpu.ParseConstraints(tt.annotations)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ParseConstraints() error = %v", err)
				}
				if len(got.Models) != vgpu.MaxListItems || len(got.ExcludeUUIDs) != vgpu.MaxListItems {
					t.Errorf("ParseConstraints() = %d models, %d excluded UUIDs; want %d each", len(got.Models), len(got.ExcludeUUIDs), vgpu.MaxListItems)
				}
				return
			}
			var ae *vgpu.AnnotationError
			if !errors.As(err, &ae) || !errors.Is(err, vgpu.ErrMalformed) {
				t.Fatalf("ParseConstraints() error = %v, want an *AnnotationError wrapping ErrMalformed", err)
			}
			if diff := cmp.Diff(tt.want, err.Error()); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(vgpu.Constraints{}, got); diff != "" {
				t.Errorf("value with the error (-want +got):\n%s", diff)
			}
		})
	}
}
