package drascore

import (
	"context"
	"encoding/json"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// FuzzDRAClaim feeds a ResourceClaim, as a stranger may write one (JSON of its spec and status),
// to the DRA scoring of a pod that owns it, on two DRA nodes, allocated or not: whatever the
// requests, quantities, selectors and results say, parsing and scoring answer without a panic,
// every score within 0 to 10, and the claim's usage is gone once it is deleted.
func FuzzDRAClaim(f *testing.F) {
	seeds := []*resourcev1.ResourceClaim{
		vgputest.Claim("c").Request("gpu", vgpu.DRADriverName, 1, 8192, 30).Obj(),
		vgputest.Claim("c").Request("gpu", vgpu.DRADriverName, 2, 0, 100).Selector(`device.attributes["gpuslice.hami.io"].model.lowerAscii().contains("a100") || device.attributes["gpuslice.hami.io"].model.lowerAscii().contains("h100")`).Obj(),
		vgputest.Claim("c").Request("gpu", vgpu.DRADriverName, 1, 1024, 0).Selector(`!(device.attributes["gpuslice.hami.io"].uuid in ["n1-GPU-0"])`).Obj(),
		vgputest.Claim("c").Request("gpu", vgpu.DRADriverName, 1, 4096, 0).Allocated("gpu", "n1", "gpu-0", 4096, 10).Obj(),
		vgputest.Claim("c").Request("gpu", vgpu.DRADriverName, 1, 0, 0).Selector(`device.attributes["gpuslice.hami.io"].nope > 1`).Obj(),
	}
	for _, c := range seeds {
		b, err := json.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, raw := range []string{
		`{"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpuslice.hami.io","count":33,"capacity":{"requests":{"memory":"1e300","cores":"-5"}}}}]}}}`,
		`{"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpuslice.hami.io","capacity":{"requests":{"memory":"0.5","cores":"0.001","other":"1"}}}}]}}}`,
		`{"status":{"allocation":{"devices":{"results":[{"request":"gpu","driver":"gpuslice.hami.io","pool":"n1","device":"gpu-9","consumedCapacity":{"memory":"-1Gi"}}]}}}}`,
		`{"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpuslice.hami.io","selectors":[{"cel":{"expression":"!("}}]}}]}}}`,
		`{}`,
	} {
		f.Add([]byte(raw))
	}
	names := []string{"n1", "n2", "dp"}
	f.Fuzz(func(t *testing.T, body []byte) {
		var claim resourcev1.ResourceClaim
		if err := json.Unmarshal(body, &claim); err != nil {
			return
		}
		for _, r := range claim.Spec.Devices.Requests {
			if r.Exactly != nil {
				for _, s := range r.Exactly.Selectors {
					if s.CEL != nil {
						selectorModels(s.CEL.Expression)
					}
				}
			}
		}
		d := newTestState()
		d.UpsertClass(vgputest.DRAClass())
		d.UpsertSlice(vgputest.DRANodeSlice("n1", 2, 16384, "NVIDIA A100-SXM4-80GB"))
		d.UpsertSlice(vgputest.DRANodeSlice("n2", 2, 16384, "Tesla T4"))
		pod, _ := vgputest.DRAPod("p", vgputest.Claim("p-gpu"))
		claim.Namespace, claim.Name = pod.Namespace, "p-gpu"
		claim.OwnerReferences = vgputest.Claim("p-gpu").OwnedBy(pod).Obj().OwnerReferences
		d.UpsertClaim(&claim)
		res, ok := d.Score(context.Background(), pod, names)
		if ok {
			for i, v := range Rank(res.Scores) {
				if v < 0 || v > extenderv1.MaxExtenderPriority {
					t.Fatalf("score %d for %s", v, names[i])
				}
			}
		}
		d.DeleteClaim(&claim)
		for _, n := range d.nodes {
			for _, g := range n.inv.GPUs {
				if u := n.usage.GPU(g.UUID); u != (vgpu.GPUUsage{}) {
					t.Fatalf("%s holds %+v after the claim was deleted", g.UUID, u)
				}
			}
		}
	})
}
