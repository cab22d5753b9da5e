package vgputest

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/vgpu"
)

// DRASlice returns the ResourceSlice gpuslice's DRA driver publishes for node: pool node, one
// shared device "gpu-<i>" per GPU of inv with its uuid, model, index and NUMA attributes and its
// memory (bytes) and cores capacities; an unhealthy GPU carries a NoSchedule taint.
func DRASlice(inv vgpu.NodeInventory) *resourcev1.ResourceSlice {
	sl := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: inv.Node + "-" + vgpu.DRADriverName},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: vgpu.DRADriverName, NodeName: ptr.To(inv.Node),
			Pool: resourcev1.ResourcePool{Name: inv.Node, Generation: 1, ResourceSliceCount: 1},
		},
	}
	for _, g := range inv.GPUs {
		d := resourcev1.Device{
			Name: "gpu-" + strconv.Itoa(g.Index),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				vgpu.DRAAttributeUUID:  {StringValue: ptr.To(g.UUID)},
				vgpu.DRAAttributeModel: {StringValue: ptr.To(g.Model)},
				vgpu.DRAAttributeIndex: {IntValue: ptr.To(int64(g.Index))},
			},
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
				vgpu.DRACapacityMemory: {Value: *resource.NewQuantity(g.SchedulableMemoryMiB<<20, resource.BinarySI)},
				vgpu.DRACapacityCores:  {Value: *resource.NewQuantity(int64(g.CoresPercent), resource.DecimalSI)},
			},
			AllowMultipleAllocations: ptr.To(true),
		}
		if g.NUMANode >= 0 {
			d.Attributes[vgpu.DRAAttributeNUMANode] = resourcev1.DeviceAttribute{IntValue: ptr.To(int64(g.NUMANode))}
		}
		if g.Health != vgpu.Healthy {
			d.Taints = []resourcev1.DeviceTaint{{Key: vgpu.DRADriverName + "/unhealthy", Effect: resourcev1.DeviceTaintEffectNoSchedule}}
		}
		sl.Spec.Devices = append(sl.Spec.Devices, d)
	}
	return sl
}

// DRAClass returns the DeviceClass gpuslice's chart installs: every device of the driver.
func DRAClass() *resourcev1.DeviceClass {
	return DRAClassWith(vgpu.DRADriverName, `device.driver == "`+vgpu.DRADriverName+`"`)
}

// DRAClassWith returns a DeviceClass named name with one CEL selector.
func DRAClassWith(name, expr string) *resourcev1.DeviceClass {
	return &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: expr}}}},
	}
}

// ClaimBuilder builds a *resourcev1.ResourceClaim. Start with Claim.
type ClaimBuilder struct {
	claim resourcev1.ResourceClaim
}

// Claim starts a claim in namespace "default" with UID "uid-"+name and no requests.
func Claim(name string) *ClaimBuilder {
	return &ClaimBuilder{claim: resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: metav1.NamespaceDefault, UID: types.UID("uid-" + name),
	}}}
}

// Request adds an exact request of count devices of class, asking memMiB MiB (0: none named,
// all of it) and cores percent (0: none named).
func (b *ClaimBuilder) Request(name, class string, count int64, memMiB int64, cores int64) *ClaimBuilder {
	req := map[resourcev1.QualifiedName]resource.Quantity{}
	if memMiB > 0 {
		req[vgpu.DRACapacityMemory] = *resource.NewQuantity(memMiB<<20, resource.BinarySI)
	}
	if cores > 0 {
		req[vgpu.DRACapacityCores] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	e := &resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count}
	if len(req) > 0 {
		e.Capacity = &resourcev1.CapacityRequirements{Requests: req}
	}
	b.claim.Spec.Devices.Requests = append(b.claim.Spec.Devices.Requests, resourcev1.DeviceRequest{Name: name, Exactly: e})
	return b
}

// Selector adds a CEL selector to the last request added.
func (b *ClaimBuilder) Selector(expr string) *ClaimBuilder {
	r := &b.claim.Spec.Devices.Requests[len(b.claim.Spec.Devices.Requests)-1]
	r.Exactly.Selectors = append(r.Exactly.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: expr}})
	return b
}

// OwnedBy makes pod the claim's controller, as the resourceclaim controller does for the claim
// of a pod's template.
func (b *ClaimBuilder) OwnedBy(pod *corev1.Pod) *ClaimBuilder {
	b.claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}
	return b
}

// Allocated adds an allocation result of the driver: request on device of pool node, consuming
// memMiB MiB and cores percent.
func (b *ClaimBuilder) Allocated(request, node, device string, memMiB, cores int64) *ClaimBuilder {
	if b.claim.Status.Allocation == nil {
		b.claim.Status.Allocation = &resourcev1.AllocationResult{}
	}
	r := &b.claim.Status.Allocation.Devices
	r.Results = append(r.Results, resourcev1.DeviceRequestAllocationResult{
		Request: request, Driver: vgpu.DRADriverName, Pool: node, Device: device,
		ConsumedCapacity: map[resourcev1.QualifiedName]resource.Quantity{
			vgpu.DRACapacityMemory: *resource.NewQuantity(memMiB<<20, resource.BinarySI),
			vgpu.DRACapacityCores:  *resource.NewQuantity(cores, resource.DecimalSI),
		},
	})
	return b
}

// Obj returns a deep copy of the claim built so far.
func (b *ClaimBuilder) Obj() *resourcev1.ResourceClaim { return b.claim.DeepCopy() }

// ClaimFromTemplate adds a pod claim name made from template, and the status the resourceclaim
// controller writes once it created claim for it.
func (b *PodBuilder) ClaimFromTemplate(name, template, claim string) *PodBuilder {
	b.pod.Spec.ResourceClaims = append(b.pod.Spec.ResourceClaims, corev1.PodResourceClaim{Name: name, ResourceClaimTemplateName: ptr.To(template)})
	b.pod.Status.ResourceClaimStatuses = append(b.pod.Status.ResourceClaimStatuses, corev1.PodResourceClaimStatus{Name: name, ResourceClaimName: ptr.To(claim)})
	return b
}

// ClaimName adds a pod claim name that names an existing claim.
func (b *PodBuilder) ClaimName(name, claim string) *PodBuilder {
	b.pod.Spec.ResourceClaims = append(b.pod.Spec.ResourceClaims, corev1.PodResourceClaim{Name: name, ResourceClaimName: ptr.To(claim)})
	return b
}

// DRANodeSlice returns the ResourceSlice (DRASlice) of DRA node name with gpus GPUs of memMiB and
// model: UUIDs "<name>-GPU-<i>", devices "gpu-<i>".
func DRANodeSlice(name string, gpus int, memMiB int64, model string) *resourcev1.ResourceSlice {
	b := Node(name)
	for i := range gpus {
		uuid := fmt.Sprintf("%s-GPU-%d", name, i)
		b.GPU(uuid, memMiB).Model(uuid, model)
	}
	return DRASlice(b.Obj())
}

// DRAPod returns pod name, one container "main" with a pod claim "gpu" made from a template
// into claim "<name>-gpu", and the claim b builds, owned by the pod.
func DRAPod(name string, b *ClaimBuilder) (*corev1.Pod, *resourcev1.ResourceClaim) {
	pod := Pod(name).Container("main").ClaimFromTemplate("gpu", "tmpl", name+"-gpu").Obj()
	return pod, b.OwnedBy(pod).Obj()
}
