package nvidia

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpuslice/gpuslice/vgpu"
)

// wantGPU is the record GPUs returns for fake GPU index of n.
func wantGPU(index, n int, model string, memoryMiB int64) vgpu.GPU {
	return vgpu.GPU{
		UUID:           FakeUUID(testNode, index),
		Index:          index,
		Minor:          index,
		Model:          model,
		TotalMemoryMiB: memoryMiB,
		CoresPercent:   100,
		NUMANode:       index * 2 / max(n, 2),
		PCIBusID:       fmt.Sprintf("00000000:%02X:00.0", index+1),
		Health:         vgpu.Healthy,
	}
}

func TestGPUs(t *testing.T) {
	dgx := func(model string, memoryMiB int64) []vgpu.GPU {
		var out []vgpu.GPU
		for i := range 8 {
			out = append(out, wantGPU(i, 8, model, memoryMiB))
		}
		return out
	}
	tests := []struct {
		spec string
		want []vgpu.GPU
	}{
		{"dgxa100", dgx("NVIDIA A100-SXM4-40GB", 40960)},
		{"dgxh100", dgx("NVIDIA H100 80GB HBM3", 81920)},
		{"dgxh200", dgx("NVIDIA H200 141GB HBM3e", 144384)},
		{"dgxb200", dgx("NVIDIA B200 180GB HBM3e", 184320)},
		{"2xA100-80GB,1xT4-16GB,RTX4090-24GB", []vgpu.GPU{
			wantGPU(0, 4, "NVIDIA A100-SXM4-80GB", 81920),
			wantGPU(1, 4, "NVIDIA A100-SXM4-80GB", 81920),
			wantGPU(2, 4, "Tesla T4", 16384),
			wantGPU(3, 4, "NVIDIA RTX4090", 24576),
		}},
		{"L4-24GB", []vgpu.GPU{wantGPU(0, 1, "NVIDIA L4", 24576)}},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			f := newFixture(t, tc.spec)
			got, err := f.b.GPUs()
			if err != nil {
				t.Fatalf("GPUs: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGPUsSameUUIDsAcrossRestarts(t *testing.T) {
	first, err := newFixture(t, "dgxa100").b.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	second, err := newFixture(t, "dgxa100").b.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, second); diff != "" {
		t.Errorf("GPUs differ between two fakes of one node (-first +second):\n%s", diff)
	}
}

func TestGPUsLostGPU(t *testing.T) {
	f := newFixture(t, "dgxa100")
	if err := f.fake.SetLost(6, true); err != nil {
		t.Fatal(err)
	}
	_, err := f.b.GPUs()
	if !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		t.Fatalf("GPUs error = %v, want it to wrap ERROR_GPU_IS_LOST", err)
	}
	if want := "GPU 6: NVML get handle: ERROR_GPU_IS_LOST"; err.Error() != want {
		t.Errorf("GPUs error = %q, want %q", err, want)
	}
}

// noNUMALibrary is a Fake whose library lacks nvmlDeviceGetNumaNodeId, as
// old drivers do.
type noNUMALibrary struct{ *Fake }

func (l noNUMALibrary) Extensions() nvml.ExtendedInterface {
	return &mock.ExtendedInterface{
		LookupSymbolFunc: func(name string) error { return errors.New("undefined symbol: " + name) },
	}
}

func TestGPUsWithoutNUMAQuery(t *testing.T) {
	fake, err := NewFake("2xA30-24GB", testNode)
	if err != nil {
		t.Fatal(err)
	}
	logger, _ := ktesting.NewTestContext(t)
	b, err := Open(Options{Library: noNUMALibrary{fake}, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	got, err := b.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	want := []vgpu.GPU{wantGPU(0, 2, "NVIDIA A30-PCIE-24GB", 24576), wantGPU(1, 2, "NVIDIA A30-PCIE-24GB", 24576)}
	for i := range want {
		want[i].NUMANode = -1
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GPUs (-want +got):\n%s", diff)
	}
}

func TestCString(t *testing.T) {
	tests := []struct {
		in   []int8
		want string
	}{
		{nil, ""},
		{[]int8{'a', 'b', 0, 'c'}, "ab"},
		{[]int8{'0', '0', ':'}, "00:"},
	}
	for _, tc := range tests {
		if got := cString(tc.in); got != tc.want {
			t.Errorf("cString(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := cString(cChars(strings.Repeat("x", 3))); got != "xxx" {
		t.Errorf("cString(cChars(xxx)) = %q", got)
	}
}
