package dra

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Grant is one allocation result of a claim on this driver, turned into the
// GPU slice it grants.
type Grant struct {
	// Request is the result's request (with its subrequest, if any).
	Request string
	// Pool and Device name the allocated device; ShareID is the share of
	// it the allocator gave this result.
	Pool, Device string
	ShareID      *types.UID
	// Slice is the GPU and the capacity consumed: memory in MiB (rounded
	// down), cores in percent.
	Slice vgpu.GPUSlice
	// CDIName is the CDI device name of the result's request: the claim
	// UID and the request name, so it never repeats across claims. All
	// results of one request share it (one environment lists all their
	// GPUs, as a container's hami.io/gpu: 2 does).
	CDIName string
}

// Grants returns the grants of claim's results for driver, in result order;
// results of other drivers are skipped. A device the node does not publish
// (gpu returns false), a consumed capacity that is not a whole number of
// MiB or percent within the GPU, or a claim without allocation is an error
// naming the claim and the result. Without consumedCapacity (a device not
// shared) the result gets the whole GPU. Pure.
func Grants(driver string, claim *resourceapi.ResourceClaim, gpu func(device string) (vgpu.GPU, bool)) ([]Grant, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	var out []Grant
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driver {
			continue
		}
		g, ok := gpu(r.Device)
		if !ok {
			return nil, fmt.Errorf("claim %s/%s request %s: device %s/%s is not a GPU this node publishes", claim.Namespace, claim.Name, r.Request, r.Pool, r.Device)
		}
		s := vgpu.GPUSlice{UUID: g.UUID, MemoryMiB: g.SchedulableMemoryMiB, CoresPercent: 0}
		if q, ok := r.ConsumedCapacity[CapacityMemory]; ok {
			s.MemoryMiB = q.Value() / mebibyte
		}
		if q, ok := r.ConsumedCapacity[CapacityCores]; ok {
			s.CoresPercent = int(q.Value())
		}
		if len(r.ConsumedCapacity) == 0 {
			s.CoresPercent = g.CoresPercent
		}
		if s.MemoryMiB <= 0 || s.MemoryMiB > g.SchedulableMemoryMiB || s.CoresPercent < 0 || s.CoresPercent > g.CoresPercent {
			return nil, fmt.Errorf("claim %s/%s request %s: consumed capacity %d MiB, %d%% cores does not fit GPU %s (%d MiB, %d%%)",
				claim.Namespace, claim.Name, r.Request, s.MemoryMiB, s.CoresPercent, g.UUID, g.SchedulableMemoryMiB, g.CoresPercent)
		}
		out = append(out, Grant{
			Request: r.Request, Pool: r.Pool, Device: r.Device, ShareID: r.ShareID, Slice: s,
			CDIName: cdiName(claim.UID, r.Request),
		})
	}
	return out, nil
}

// cdiName is the CDI device name of request (its subrequest dropped) of
// the claim with uid.
func cdiName(uid types.UID, request string) string {
	base, _, _ := strings.Cut(request, "/")
	return string(uid) + "-" + base
}

// consumer is the pod a claim is reserved for, when exactly one pod is.
func consumer(claim *resourceapi.ResourceClaim) (name string, uid types.UID) {
	var pods []resourceapi.ResourceClaimConsumerReference
	for _, c := range claim.Status.ReservedFor {
		if c.Resource == "pods" && c.APIGroup == "" {
			pods = append(pods, c)
		}
	}
	if len(pods) != 1 {
		return "", ""
	}
	return pods[0].Name, pods[0].UID
}
