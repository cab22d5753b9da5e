package dra

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/vgpu"
)

// The names a GPU device carries in the ResourceSlice. Unqualified names
// belong to the driver's domain: a DeviceClass or claim selects them as
// device.attributes["gpuslice.hami.io"].model, device.capacity[…].memory.
const (
	// CapacityMemory is the GPU's schedulable memory, in bytes (a claim
	// asks for "10Gi"); the container's limits are in MiB.
	CapacityMemory resourceapi.QualifiedName = vgpu.DRACapacityMemory
	// CapacityCores is the GPU's compute, in percent (100 per GPU).
	CapacityCores resourceapi.QualifiedName = vgpu.DRACapacityCores

	AttributeUUID          resourceapi.QualifiedName = vgpu.DRAAttributeUUID
	AttributeModel         resourceapi.QualifiedName = vgpu.DRAAttributeModel
	AttributeIndex         resourceapi.QualifiedName = vgpu.DRAAttributeIndex
	AttributeNUMANode      resourceapi.QualifiedName = vgpu.DRAAttributeNUMANode
	AttributeDriverVersion resourceapi.QualifiedName = "driverVersion"
	// AttributePCIBusID is the standard attribute of a PCI device.
	AttributePCIBusID resourceapi.QualifiedName = "resource.kubernetes.io/pciBusID"

	// TaintUnhealthy is the device taint (NoSchedule) of an unhealthy
	// GPU: no new claim is allocated there; running pods keep it.
	TaintUnhealthy = "gpuslice.hami.io/unhealthy"

	// devicePrefix + index is a GPU's device name.
	devicePrefix = "gpu-"
	mebibyte     = 1 << 20
)

// DeviceName returns the ResourceSlice device name of the GPU with index.
func DeviceName(index int) string { return devicePrefix + strconv.Itoa(index) }

// schedulableGPUs applies cfg to the backend's GPUs: excluded ones are
// dropped, the rest get their schedulable memory ((total − reserve) ×
// scaling) and full cores, sorted by index. A reserve that leaves a GPU
// nothing is an error naming the GPU.
func schedulableGPUs(cfg Config, gpus []vgpu.GPU) ([]vgpu.GPU, error) {
	var out []vgpu.GPU
	for _, g := range gpus {
		if slices.Contains(cfg.ExcludeGPUs, g.UUID) || slices.Contains(cfg.ExcludeGPUs, strconv.Itoa(g.Index)) {
			continue
		}
		if g.TotalMemoryMiB <= cfg.ReservedMemoryMiB {
			return nil, vgpu.InvalidField("reservedMemoryMiB", strconv.FormatInt(cfg.ReservedMemoryMiB, 10), fmt.Sprintf("must be below GPU %d's memory (%d MiB)", g.Index, g.TotalMemoryMiB))
		}
		g.SchedulableMemoryMiB = int64(float64(g.TotalMemoryMiB-cfg.ReservedMemoryMiB) * cfg.MemoryScaling)
		if g.CoresPercent == 0 {
			g.CoresPercent = vgpu.MaxPercent
		}
		if g.Health == "" {
			g.Health = vgpu.Healthy
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b vgpu.GPU) int { return a.Index - b.Index })
	return out, nil
}

// Devices returns the ResourceSlice devices of gpus, in their order (by index:
// the order kube-scheduler's allocator tries them in; publishing them most used
// first packs no better on the FGD trace, docs/dra.md): one per GPU, shared by
// many claims (allowMultipleAllocations), with the attributes a DeviceClass
// or claim selects on and the consumable capacities memory and cores. A
// request that names no memory gets all of it (a whole GPU); one that
// names no cores reserves none, as hami.io/gpucores does. Memory is
// counted in whole MiB. An unhealthy GPU carries TaintUnhealthy, added at
// unhealthySince[uuid]. Pure.
func Devices(gpus []vgpu.GPU, driverVersion string, unhealthySince map[string]metav1.Time) []resourceapi.Device {
	out := make([]resourceapi.Device, 0, len(gpus))
	for _, g := range gpus {
		memory := resource.NewQuantity(g.SchedulableMemoryMiB*mebibyte, resource.BinarySI)
		cores := resource.NewQuantity(int64(g.CoresPercent), resource.DecimalSI)
		d := resourceapi.Device{
			Name: DeviceName(g.Index),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				AttributeUUID:  {StringValue: ptr.To(g.UUID)},
				AttributeModel: {StringValue: ptr.To(g.Model)},
				AttributeIndex: {IntValue: ptr.To(int64(g.Index))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				CapacityMemory: {Value: *memory, RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    memory,
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(mebibyte, resource.BinarySI), Max: memory, Step: resource.NewQuantity(mebibyte, resource.BinarySI)},
				}},
				CapacityCores: {Value: *cores, RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    resource.NewQuantity(0, resource.DecimalSI),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(0, resource.DecimalSI), Max: cores, Step: resource.NewQuantity(1, resource.DecimalSI)},
				}},
			},
			AllowMultipleAllocations: ptr.To(true),
		}
		if g.NUMANode >= 0 {
			d.Attributes[AttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.NUMANode))}
		}
		if bus, ok := pciBusID(g.PCIBusID); ok {
			d.Attributes[AttributePCIBusID] = resourceapi.DeviceAttribute{StringValue: ptr.To(bus)}
		}
		if driverVersion != "" {
			d.Attributes[AttributeDriverVersion] = resourceapi.DeviceAttribute{StringValue: ptr.To(driverVersion)}
		}
		if g.Health != vgpu.Healthy {
			since := unhealthySince[g.UUID]
			d.Taints = []resourceapi.DeviceTaint{{Key: TaintUnhealthy, Value: string(g.Health), Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &since}}
		}
		out = append(out, d)
	}
	return out
}

// pciBusPattern is the form of the standard PCI bus ID attribute.
var pciBusPattern = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// pciBusID turns NVML's bus ID ("00000000:07:00.0", 8-digit domain) into
// the attribute's form ("0000:07:00.0"); false when it has neither form.
func pciBusID(nvml string) (string, bool) {
	id := strings.ToLower(nvml)
	if domain, rest, ok := strings.Cut(id, ":"); ok && len(domain) == 8 && strings.HasPrefix(domain, "0000") {
		id = domain[4:] + ":" + rest
	}
	return id, pciBusPattern.MatchString(id)
}
