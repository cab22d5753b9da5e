package drascore

import (
	"math"
	"regexp"
	"strconv"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"
)

// A ResourceClaim as the DRA scoring reads it (draClaimOf): what its requests ask for, and what
// its allocation took. Claims are written by users and controllers, so everything here is
// checked, never trusted: a request gpuslice cannot model is marked so, and a pod with one is
// scored neutrally.

// draClaim is one ResourceClaim, parsed once per change.
type draClaim struct {
	namespace, name string
	// owner is the UID of the claim's controller (the pod a template claim was made for), or
	// empty.
	owner types.UID
	// allocated is true once kube-scheduler wrote status.allocation; requests then place nothing
	// new and results are what it holds.
	allocated bool
	requests  []claimRequest
	// numa is true when a constraint asks the devices of one request to share the driver's NUMA
	// node attribute (the webhook writes it for hami.io/numa-bind).
	numa bool
	// results are the allocation's devices of the gpuslice driver.
	results []claimResult
}

// claimRequest is one request of a claim.
type claimRequest struct {
	// name is the request's name, class its DeviceClass.
	name, class string
	// modeled is false for what the scoring does not model: a prioritized list (firstAvailable,
	// which the DynamicResources plugin scores itself), allocation mode All, admin access, or a
	// count outside 1 to resourcev1.AllocationResultsMaxSize.
	modeled bool
	count   int
	// memoryMiB is the memory asked per device, rounded up to whole MiB (the driver's request
	// policy step); 0 when the request names none and gets all of it. A request below 1 MiB
	// asks -1: no device takes it.
	memoryMiB int64
	// cores is the compute asked per device, in percent rounded up; 0 when none is named.
	cores int
	// otherCapacity is true when the request names a capacity the driver does not publish, so
	// no gpuslice device takes it.
	otherCapacity bool
	// selectors are the request's CEL expressions.
	selectors []string
}

// claimResult is one allocated device of the gpuslice driver.
type claimResult struct {
	request, pool, device string
	// memoryMiB and cores are the consumed capacity; memoryMiB 0 is all of the device's memory
	// (none is named: the request policy's default).
	memoryMiB int64
	cores     int
	// whole is true when the result consumed no capacity at all: the device is the claim's
	// alone, as without consumable capacity.
	whole bool
}

// draClaimOf parses claim. It is pure and never fails: what it cannot model is marked.
func draClaimOf(claim *resourcev1.ResourceClaim) *draClaim {
	c := &draClaim{namespace: claim.Namespace, name: claim.Name}
	for _, ref := range claim.OwnerReferences {
		if ref.Controller != nil && *ref.Controller {
			c.owner = ref.UID
		}
	}
	for i := range claim.Spec.Devices.Requests {
		c.requests = append(c.requests, claimRequestOf(&claim.Spec.Devices.Requests[i]))
	}
	for _, con := range claim.Spec.Devices.Constraints {
		if con.MatchAttribute != nil && string(*con.MatchAttribute) == vgpu.DRADriverName+"/"+vgpu.DRAAttributeNUMANode {
			c.numa = true
		}
	}
	if a := claim.Status.Allocation; a != nil {
		c.allocated = true
		for _, r := range a.Devices.Results {
			if r.Driver != vgpu.DRADriverName {
				continue
			}
			res := claimResult{request: r.Request, pool: r.Pool, device: r.Device, whole: len(r.ConsumedCapacity) == 0}
			if q, ok := r.ConsumedCapacity[vgpu.DRACapacityMemory]; ok {
				res.memoryMiB = mebibytesUp(q)
			}
			if q, ok := r.ConsumedCapacity[vgpu.DRACapacityCores]; ok {
				res.cores = intUp(q)
			}
			c.results = append(c.results, res)
		}
	}
	return c
}

// claimRequestOf parses one request.
func claimRequestOf(r *resourcev1.DeviceRequest) claimRequest {
	out := claimRequest{name: r.Name}
	e := r.Exactly
	if e == nil {
		return out // a prioritized list
	}
	out.class = e.DeviceClassName
	count := e.Count
	if count == 0 {
		count = 1 // the API's default
	}
	out.modeled = (e.AllocationMode == "" || e.AllocationMode == resourcev1.DeviceAllocationModeExactCount) &&
		(e.AdminAccess == nil || !*e.AdminAccess) && count >= 1 && count <= resourcev1.AllocationResultsMaxSize
	if out.modeled {
		out.count = int(count)
	}
	for _, s := range e.Selectors {
		if s.CEL != nil {
			out.selectors = append(out.selectors, s.CEL.Expression)
		}
	}
	if e.Capacity == nil {
		return out
	}
	for name, q := range e.Capacity.Requests {
		switch name {
		case vgpu.DRACapacityMemory:
			out.memoryMiB = mebibytesUp(q)
			if out.memoryMiB == 0 {
				out.memoryMiB = -1
			}
		case vgpu.DRACapacityCores:
			out.cores = intUp(q)
		default:
			out.otherCapacity = true
		}
	}
	return out
}

// mebibytesUp is q bytes in MiB, rounded up, at most vgpu.MaxMemoryMiB+1 (more than any GPU);
// negative quantities are 0.
func mebibytesUp(q resource.Quantity) int64 {
	const mib = 1 << 20
	if q.Sign() <= 0 {
		return 0
	}
	if q.Cmp(*resource.NewQuantity(vgpu.MaxMemoryMiB*mib, resource.BinarySI)) > 0 {
		return vgpu.MaxMemoryMiB + 1
	}
	b, _ := q.AsInt64() // in range: checked above
	if b == 0 {
		b = int64(math.Ceil(q.AsApproximateFloat64())) // a fraction of a byte
	}
	return (b + mib - 1) / mib
}

// intUp is q rounded up to an integer, at most vgpu.MaxPercent+1 (more than any GPU offers);
// negative quantities are 0.
func intUp(q resource.Quantity) int {
	if q.Sign() <= 0 {
		return 0
	}
	if q.Cmp(*resource.NewQuantity(vgpu.MaxPercent, resource.DecimalSI)) > 0 {
		return vgpu.MaxPercent + 1
	}
	return int(math.Ceil(q.AsApproximateFloat64()))
}

// The model selectors the webhook writes (webhook/dra.go) and the chart's model classes, read
// back into vgpu's model filter for the workload's classes: any other expression still selects
// devices exactly (CEL), it only leaves the class's model filter open.
var (
	// modelContains is one `device.attributes["gpuslice.hami.io"].model.lowerAscii().contains("a100")`.
	modelContains = regexp.MustCompile(`^device\.attributes\["` + regexp.QuoteMeta(vgpu.DRADriverName) + `"\]\.model\.lowerAscii\(\)\.contains\(("(?:[^"\\]|\\.)*")\)$`)
	// modelEquals is `device.attributes["gpuslice.hami.io"].model == "NVIDIA A100-SXM4-80GB"`,
	// possibly after `device.driver == "gpuslice.hami.io" && `.
	modelEquals = regexp.MustCompile(`^(?:device\.driver == "` + regexp.QuoteMeta(vgpu.DRADriverName) + `" && )?device\.attributes\["` + regexp.QuoteMeta(vgpu.DRADriverName) + `"\]\.model == ("(?:[^"\\]|\\.)*")$`)
)

// selectorModels returns the model filter of one CEL expression as the webhook or the chart
// writes it: models is an or of substrings ("a || b"), exclude the same under "!( … )"; ok is
// false for any other expression.
func selectorModels(expr string) (models, exclude []string, ok bool) {
	negated := false
	if len(expr) > 3 && expr[:2] == "!(" && expr[len(expr)-1] == ')' {
		negated, expr = true, expr[2:len(expr)-1]
	}
	if m := modelEquals.FindStringSubmatch(expr); m != nil && !negated {
		s, err := strconv.Unquote(m[1])
		if err != nil || s == "" {
			return nil, nil, false
		}
		return []string{s}, nil, true
	}
	var names []string
	for _, part := range splitOr(expr) {
		m := modelContains.FindStringSubmatch(part)
		if m == nil {
			return nil, nil, false
		}
		s, err := strconv.Unquote(m[1])
		if err != nil || s == "" {
			return nil, nil, false
		}
		names = append(names, s)
	}
	if negated {
		return nil, names, true
	}
	return names, nil, true
}

// splitOr splits expr at " || " outside string literals.
func splitOr(expr string) []string {
	var parts []string
	start, quoted := 0, false
	for i := 0; i < len(expr); i++ {
		switch {
		case quoted && expr[i] == '\\':
			i++
		case expr[i] == '"':
			quoted = !quoted
		case !quoted && i+4 <= len(expr) && expr[i:i+4] == " || ":
			parts = append(parts, expr[start:i])
			start = i + 4
			i += 3
		}
	}
	return append(parts, expr[start:])
}
