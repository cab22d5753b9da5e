package dra

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/publish"
	"github.com/gpuslice/gpuslice/vgpu"
)

func testGPUs() []vgpu.GPU {
	return []vgpu.GPU{
		{UUID: "GPU-b", Index: 1, Model: "A100-80GB", TotalMemoryMiB: 81920, NUMANode: 1, PCIBusID: "00000000:08:00.0"},
		{UUID: "GPU-a", Index: 0, Model: "A100-80GB", TotalMemoryMiB: 81920, NUMANode: -1, Health: vgpu.Unhealthy},
	}
}

func TestSchedulableGPUs(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NodeName, cfg.ReservedMemoryMiB, cfg.MemoryScaling, cfg.ExcludeGPUs = "n1", 1024, 2, []string{"GPU-b"}
	got, err := schedulableGPUs(cfg, testGPUs())
	if err != nil {
		t.Fatal(err)
	}
	want := []vgpu.GPU{{UUID: "GPU-a", Index: 0, Model: "A100-80GB", TotalMemoryMiB: 81920, SchedulableMemoryMiB: 161792, CoresPercent: 100, NUMANode: -1, Health: vgpu.Unhealthy}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("schedulableGPUs (-want +got):\n%s", diff)
	}
	cfg.ReservedMemoryMiB = 81920
	if _, err := schedulableGPUs(cfg, testGPUs()); err == nil {
		t.Error("a reserve of all the memory was accepted")
	}
}

func TestDevices(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NodeName = "n1"
	gpus, err := schedulableGPUs(cfg, testGPUs())
	if err != nil {
		t.Fatal(err)
	}
	since := metav1.Date(2026, 1, 2, 3, 4, 5, 0, metav1.Now().Location())
	devs := Devices(gpus, "615.20", map[string]metav1.Time{"GPU-a": since})
	if len(devs) != 2 || devs[0].Name != "gpu-0" || devs[1].Name != "gpu-1" {
		t.Fatalf("devices %v, want gpu-0 and gpu-1 in index order", devs)
	}
	healthy := devs[1]
	if !ptr.Deref(healthy.AllowMultipleAllocations, false) {
		t.Error("a GPU device is not shared (allowMultipleAllocations)")
	}
	mem := healthy.Capacity[CapacityMemory]
	if mem.Value.Cmp(resource.MustParse("80Gi")) != 0 || mem.RequestPolicy.Default.Cmp(mem.Value) != 0 {
		t.Errorf("memory %s default %s, want 80Gi both (a claim naming no size gets the whole GPU)", mem.Value.String(), mem.RequestPolicy.Default.String())
	}
	cores := healthy.Capacity[CapacityCores]
	if cores.Value.Value() != 100 || cores.RequestPolicy.Default.Value() != 0 {
		t.Errorf("cores %s default %s, want 100 and 0", cores.Value.String(), cores.RequestPolicy.Default.String())
	}
	if got := *healthy.Attributes[AttributePCIBusID].StringValue; got != "0000:08:00.0" {
		t.Errorf("pciBusID %q, want 0000:08:00.0", got)
	}
	if got := *healthy.Attributes[AttributeNUMANode].IntValue; got != 1 {
		t.Errorf("numaNode %d, want 1", got)
	}
	if len(healthy.Taints) != 0 {
		t.Errorf("healthy GPU tainted: %v", healthy.Taints)
	}
	want := []resourceapi.DeviceTaint{{Key: TaintUnhealthy, Value: string(vgpu.Unhealthy), Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &since}}
	if diff := cmp.Diff(want, devs[0].Taints); diff != "" {
		t.Errorf("unhealthy GPU taints (-want +got):\n%s", diff)
	}
	if _, ok := devs[0].Attributes[AttributeNUMANode]; ok {
		t.Error("a GPU without NUMA node has a numaNode attribute")
	}
}

// allocatedClaim is a claim with one request on device of pool n1 consuming memory and cores.
func allocatedClaim(uid, request, device, memory, cores string) *resourceapi.ResourceClaim {
	r := resourceapi.DeviceRequestAllocationResult{Request: request, Driver: DefaultDriverName, Pool: "n1", Device: device, ShareID: ptr.To(types.UID("share-" + uid))}
	if memory != "" {
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{CapacityMemory: resource.MustParse(memory), CapacityCores: resource.MustParse(cores)}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c-" + uid, Namespace: "ns", UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{r}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + uid, UID: types.UID("pod-uid-" + uid)}},
		},
	}
}

func TestGrants(t *testing.T) {
	gpu := func(name string) (vgpu.GPU, bool) {
		if name != "gpu-0" {
			return vgpu.GPU{}, false
		}
		return vgpu.GPU{UUID: "GPU-a", SchedulableMemoryMiB: 81920, CoresPercent: 100}, true
	}
	tests := []struct {
		name    string
		claim   *resourceapi.ResourceClaim
		want    []vgpu.GPUSlice
		wantErr bool
	}{
		{name: "capacity consumed", claim: allocatedClaim("u1", "gpu", "gpu-0", "10Gi", "30"), want: []vgpu.GPUSlice{{UUID: "GPU-a", MemoryMiB: 10240, CoresPercent: 30}}},
		{name: "no capacity: whole GPU", claim: allocatedClaim("u2", "gpu", "gpu-0", "", ""), want: []vgpu.GPUSlice{{UUID: "GPU-a", MemoryMiB: 81920, CoresPercent: 100}}},
		{name: "unknown device", claim: allocatedClaim("u3", "gpu", "gpu-9", "1Gi", "0"), wantErr: true},
		{name: "more than the GPU", claim: allocatedClaim("u4", "gpu", "gpu-0", "100Gi", "0"), wantErr: true},
		{name: "not allocated", claim: &resourceapi.ResourceClaim{}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			grants, err := Grants(DefaultDriverName, tt.claim, gpu)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Grants() error = %v, want error %v", err, tt.wantErr)
			}
			var got []vgpu.GPUSlice
			for _, g := range grants {
				got = append(got, g.Slice)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("slices (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPrepareIdempotent prepares a claim twice and after a new driver (a restart): the answer and
// the CDI spec are the same each time, and unprepare removes the spec, twice without error.
func TestPrepareIdempotent(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	newDriver := func() *Driver {
		cfg := DefaultConfig()
		cfg.NodeName, cfg.FakeGPUs, cfg.CDISpecDir, cfg.StateDir = "n1", "2xA100-80GB", dir, dir
		d, err := New(cfg, staticBackend(testGPUs()), Options{Client: fake.NewClientset()})
		if err != nil {
			t.Fatal(err)
		}
		gpus, err := schedulableGPUs(cfg, testGPUs())
		if err != nil {
			t.Fatal(err)
		}
		d.gpus = gpus
		d.builder = &handoff.Builder{NodeName: "n1", GPU: d.gpuByUUID, SharedCacheDir: cfg.SharedCacheDir, FakeGPUs: true}
		return d
	}
	claim := allocatedClaim("u1", "gpu", "gpu-1", "10Gi", "30")
	var first map[types.UID]kubeletplugin.PrepareResult
	var firstSpec []byte
	for i, d := range []*Driver{newDriver(), newDriver()} {
		for range 2 {
			got, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
			if err != nil || got["u1"].Err != nil {
				t.Fatalf("driver %d: prepare: %v, %v", i, err, got["u1"].Err)
			}
			spec, err := os.ReadFile(filepath.Join(dir, handoff.SpecFileName("u1-gpu")))
			if err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first, firstSpec = got, spec
				continue
			}
			if diff := cmp.Diff(first, got); diff != "" {
				t.Errorf("driver %d: a second prepare answered differently (-first +again):\n%s", i, diff)
			}
			if string(spec) != string(firstSpec) {
				t.Errorf("driver %d: the spec changed:\n%s\nwas\n%s", i, spec, firstSpec)
			}
		}
	}
	want := []kubeletplugin.Device{{Requests: []string{"gpu"}, PoolName: "n1", DeviceName: "gpu-1", CDIDeviceIDs: []string{"gpuslice.io/vgpu=u1-gpu"}, ShareID: ptr.To(types.UID("share-u1"))}}
	if diff := cmp.Diff(want, first["u1"].Devices); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
	var spec cdispecs.Spec
	if err := json.Unmarshal(firstSpec, &spec); err != nil {
		t.Fatal(err)
	}
	env := spec.Devices[0].ContainerEdits.Env
	for _, kv := range []string{"NVIDIA_VISIBLE_DEVICES=GPU-b", "CUDA_DEVICE_MEMORY_LIMIT_0=10240m", "CUDA_DEVICE_SM_LIMIT=30", "GPUSLICE_POD=ns/pod-u1", "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/gpuslice/u1-gpu.cache"} {
		if !slices.Contains(env, kv) {
			t.Errorf("spec env %v lacks %s", env, kv)
		}
	}

	d := newDriver()
	for range 2 {
		got, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}})
		if err != nil || got["u1"] != nil {
			t.Fatalf("unprepare: %v, %v", err, got["u1"])
		}
	}
	if _, err := os.Stat(filepath.Join(dir, handoff.SpecFileName("u1-gpu"))); !os.IsNotExist(err) {
		t.Errorf("spec still there after unprepare: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		field  string
	}{
		{"no node", func(c *Config) { c.NodeName = "" }, "nodeName"},
		{"bad driver", func(c *Config) { c.DriverName = "Not_DNS" }, "driverName"},
		{"scaling", func(c *Config) { c.MemoryScaling = 0 }, "memoryScaling"},
		{"relative cdi", func(c *Config) { c.CDISpecDir = "cdi" }, "cdiSpecDir"},
		{"enforcement", func(c *Config) { c.Enforcement.Enforcement = "magic" }, "enforcement"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.NodeName = "n1"
			tt.mutate(&cfg)
			err := cfg.Validate()
			var fe *vgpu.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field {
				t.Errorf("Validate() = %v, want an error on %s", err, tt.field)
			}
		})
	}
	cfg := DefaultConfig()
	cfg.NodeName = "n1"
	if err := cfg.Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

type staticBackend []vgpu.GPU

func (b staticBackend) GPUs() ([]vgpu.GPU, error) { return b, nil }
func (staticBackend) WatchHealth(ctx context.Context, _ chan<- vgpu.HealthEvent) error {
	<-ctx.Done()
	return nil
}

func TestDRACondition(t *testing.T) {
	node := vgpu.NodeInventory{Node: "node-a", GPUs: []vgpu.GPU{{UUID: "GPU-0", Health: vgpu.Healthy}, {UUID: "GPU-1", Health: vgpu.Unhealthy}}}
	sick := vgpu.NodeInventory{Node: "node-a", GPUs: []vgpu.GPU{{UUID: "GPU-1", Health: vgpu.Unhealthy}}}
	for _, tt := range []struct {
		name   string
		reg    publish.Registration
		node   vgpu.NodeInventory
		want   publish.Condition
		wantOK bool
	}{
		{"registered", publish.Registration{Registered: true}, node, publish.Condition{Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered,
			Message: "registered DRA driver gpuslice.hami.io with the kubelet: 1 of 2 GPUs healthy, in ResourceSlice pool node-a"}, true},
		{"all unhealthy", publish.Registration{Registered: true}, sick, publish.Condition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonNoHealthyGPUs,
			Message: "registered DRA driver gpuslice.hami.io with the kubelet, but all 1 GPUs are unhealthy: their devices are tainted"}, true},
		{"refused", publish.Registration{Problem: vgpu.ReasonRegisterFailed, Detail: "boom"}, node, publish.Condition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonRegisterFailed, Message: "boom"}, true},
		{"not yet", publish.Registration{}, node, publish.Condition{}, false},
	} {
		got, ok := draCondition("gpuslice.hami.io", tt.reg, tt.node)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("%s: %+v %t, want %+v %t", tt.name, got, ok, tt.want, tt.wantOK)
		}
	}
}
