package vgpu_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestParseConstraintsEnforcement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		value   string
		want    vgpu.EnforcementRequirement
		wantErr string
	}{
		{value: "", want: vgpu.EnforcementRequirement{}},
		{value: "required", want: vgpu.EnforcementRequirement{Required: true}},
		{value: "driver", want: vgpu.EnforcementRequirement{Required: true, Mechanism: vgpu.EnforcementDriver}},
		{value: "hami-core", want: vgpu.EnforcementRequirement{Required: true, Mechanism: vgpu.EnforcementHAMiCore}},
		{value: "mps", want: vgpu.EnforcementRequirement{Required: true, Mechanism: vgpu.EnforcementMPS}},
		{value: "none", wantErr: `hami.io/enforcement="none": must be "required" (any mechanism) or one of driver, hami-core, mps`},
		{value: "Required", wantErr: `hami.io/enforcement="Required": must be`},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			t.Parallel()
			c, err := vgpu.ParseConstraints(map[string]string{vgpu.AnnotationEnforcement: tt.value})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, vgpu.ErrMalformed) {
					t.Fatalf("ParseConstraints() error = %v, want ErrMalformed containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, c.Enforcement); diff != "" {
				t.Errorf("Enforcement mismatch (-want +got):\n%s", diff)
			}
			if got := c.Enforcement.String(); got != tt.value {
				t.Errorf("String() = %q, want %q", got, tt.value)
			}
		})
	}
}

func TestFitEnforcement(t *testing.T) {
	t.Parallel()
	node := func(e vgpu.Enforcement) vgpu.NodeInventory {
		return vgputest.Node("n1").GPU("GPU-0", 16384).GPU("GPU-1", 16384).Enforcement(e).Obj()
	}
	tests := []struct {
		name    string
		pod     *vgputest.PodBuilder
		node    vgpu.NodeInventory
		wantErr *vgpu.FitError
	}{{
		name: "no requirement fits a node that enforces nothing",
		pod:  vgputest.Pod("p").MemoryMiB(1024),
		node: node(vgpu.EnforcementNone),
	}, {
		name: "required fits a driver node",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationEnforcement, "required").MemoryMiB(1024),
		node: node(vgpu.EnforcementDriver),
	}, {
		name: "required fits an MPS node for one GPU",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationEnforcement, "required").MemoryMiB(1024),
		node: node(vgpu.EnforcementMPS),
	}, {
		name: "required rejects a node that enforces nothing",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationEnforcement, "required").MemoryMiB(1024),
		node: node(vgpu.EnforcementNone),
		wantErr: &vgpu.FitError{Reason: vgpu.ReasonEnforcement,
			Message: "GPU limits not enforced: hami.io/enforcement=required needs a mechanism that guards on 1 GPU, node's mechanism is none"},
	}, {
		name: "required rejects an inventory without the field",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationEnforcement, "required").MemoryMiB(1024),
		node: node(""),
		wantErr: &vgpu.FitError{Reason: vgpu.ReasonEnforcement,
			Message: "GPU limits not enforced: hami.io/enforcement=required needs a mechanism that guards on 1 GPU, node's mechanism is not reported"},
	}, {
		name: "MPS does not guard a container on two GPUs",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationEnforcement, "required").GPU(2).MemoryMiB(1024),
		node: node(vgpu.EnforcementMPS),
		wantErr: &vgpu.FitError{Reason: vgpu.ReasonEnforcement,
			Message: "GPU limits not enforced: hami.io/enforcement=required needs a mechanism that guards on 2 GPUs, node's mechanism is mps (an MPS client reaches one GPU)"},
	}, {
		name: "a named mechanism rejects another",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationEnforcement, "driver").MemoryMiB(1024),
		node: node(vgpu.EnforcementHAMiCore),
		wantErr: &vgpu.FitError{Reason: vgpu.ReasonEnforcement,
			Message: "GPU limits not enforced: hami.io/enforcement=driver needs mechanism driver on 1 GPU, node's mechanism is hami-core"},
	}, {
		name: "a named mechanism fits its node",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationEnforcement, "hami-core").MemoryMiB(1024),
		node: node(vgpu.EnforcementHAMiCore),
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := vgpu.ConstraintsFromPod(tt.pod.Obj())
			if err != nil {
				t.Fatal(err)
			}
			d := vgpu.PodDemand{Request: tt.pod.PodRequest(), Constraints: c}
			_, err = vgpu.Fit(d, vgpu.NodeState{Inventory: tt.node}, vgpu.FitOptions{})
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Fit() error = %v, want a fit", err)
				}
				return
			}
			var got *vgpu.FitError
			if !errors.As(err, &got) {
				t.Fatalf("Fit() error = %v, want a *FitError", err)
			}
			if diff := cmp.Diff(tt.wantErr, got); diff != "" {
				t.Errorf("Fit() error mismatch (-want +got):\n%s", diff)
			}
			// The summary path agrees.
			_, err = vgpu.Summarize(vgpu.NodeState{Inventory: tt.node}, nil).Fit(d, vgpu.FitOptions{ReasonOnly: true})
			if !errors.As(err, &got) || got.Reason != vgpu.ReasonEnforcement {
				t.Errorf("NodeSummary.Fit() error = %v, want reason %s", err, vgpu.ReasonEnforcement)
			}
			if msg := vgpu.NeedMessage(d, got); !strings.Contains(msg, "GPU limits not enforced") || strings.Contains(msg, "node's mechanism") {
				t.Errorf("NeedMessage = %q, want the need without the node's mechanism", msg)
			}
		})
	}
}

func TestNodeInventoryEnforcementCodec(t *testing.T) {
	t.Parallel()
	inv := vgputest.Node("n1").GPU("GPU-0", 16384).Enforcement(vgpu.EnforcementMPS).Obj()
	s, err := vgpu.EncodeNodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s, `"enforcement":"mps"`) {
		t.Errorf("EncodeNodeInventory() = %s, want an enforcement field", s)
	}
	got, err := vgpu.ParseNodeInventory(s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(inv, got); diff != "" {
		t.Errorf("round trip mismatch (-want +got):\n%s", diff)
	}

	// An inventory written before the field existed still reads.
	old := strings.Replace(s, `"enforcement":"mps",`, "", 1)
	got, err = vgpu.ParseNodeInventory(old)
	if err != nil {
		t.Fatalf("ParseNodeInventory(%s) error = %v, want the inventory without enforcement", old, err)
	}
	if got.Enforcement != "" {
		t.Errorf("Enforcement = %q, want empty", got.Enforcement)
	}

	bad := strings.Replace(s, `"enforcement":"mps"`, `"enforcement":"cgroup"`, 1)
	if _, err := vgpu.ParseNodeInventory(bad); err == nil || !errors.Is(err, vgpu.ErrMalformed) || !strings.Contains(err.Error(), `enforcement="cgroup": must be one of driver, hami-core, mps, none`) {
		t.Errorf("ParseNodeInventory(%s) error = %v, want ErrMalformed naming enforcement", bad, err)
	}
}
