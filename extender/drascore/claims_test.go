package drascore

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestDRAClaimOf checks the parsing of claims: defaults, rounding up to the driver's steps,
// what is not modelled, and consumed capacity.
func TestDRAClaimOf(t *testing.T) {
	t.Parallel()
	claim := vgputest.Claim("c").
		Request("plain", vgpu.DRADriverName, 0, 0, 0).
		Request("sized", vgpu.DRADriverName, 2, 1024, 30).
		Request("admin", vgpu.DRADriverName, 1, 0, 0).
		Request("huge", vgpu.DRADriverName, 33, 0, 0).Obj()
	claim.Spec.Devices.Requests[2].Exactly.AdminAccess = ptr.To(true)
	claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourcev1.DeviceRequest{Name: "list", FirstAvailable: []resourcev1.DeviceSubRequest{{Name: "a"}}})
	claim.Spec.Devices.Constraints = []resourcev1.DeviceConstraint{{Requests: []string{"sized"}, MatchAttribute: ptr.To(resourcev1.FullyQualifiedName("gpuslice.hami.io/numaNode"))}}
	got := draClaimOf(claim)
	want := &draClaim{namespace: "default", name: "c", numa: true, requests: []claimRequest{
		{name: "plain", class: vgpu.DRADriverName, modeled: true, count: 1},
		{name: "sized", class: vgpu.DRADriverName, modeled: true, count: 2, memoryMiB: 1024, cores: 30},
		{name: "admin", class: vgpu.DRADriverName},
		{name: "huge", class: vgpu.DRADriverName},
		{name: "list"},
	}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(draClaim{}, claimRequest{}, claimResult{})); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestSelectorModels checks the reading of the webhook's and the chart's model selectors back
// into a model filter, and that other expressions are not read.
func TestSelectorModels(t *testing.T) {
	t.Parallel()
	contains := func(m string) string {
		return `device.attributes["gpuslice.hami.io"].model.lowerAscii().contains("` + m + `")`
	}
	tests := []struct {
		expr            string
		models, exclude []string
		ok              bool
	}{
		{contains("a100"), []string{"a100"}, nil, true},
		{contains("a100") + " || " + contains("h100"), []string{"a100", "h100"}, nil, true},
		{"!(" + contains("t4") + ")", nil, []string{"t4"}, true},
		{contains(`a " || b`), nil, nil, false},
		{contains(`a \" || b`), []string{`a " || b`}, nil, true},
		{`device.driver == "gpuslice.hami.io" && device.attributes["gpuslice.hami.io"].model == "NVIDIA A100-SXM4-80GB"`, []string{"NVIDIA A100-SXM4-80GB"}, nil, true},
		{`device.attributes["gpuslice.hami.io"].uuid in ["GPU-0"]`, nil, nil, false},
		{`device.driver == "gpuslice.hami.io"`, nil, nil, false},
		{contains(""), nil, nil, false},
		{"", nil, nil, false},
	}
	for _, tt := range tests {
		models, exclude, ok := selectorModels(tt.expr)
		if diff := cmp.Diff([]any{tt.models, tt.exclude, tt.ok}, []any{models, exclude, ok}); diff != "" {
			t.Errorf("selectorModels(%q) (-want +got):\n%s", tt.expr, diff)
		}
	}
}
