package nvidia

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func fakeGPUs(n int, model string, memoryMiB int64) []FakeGPU {
	out := make([]FakeGPU, n)
	for i := range out {
		out[i] = FakeGPU{Model: model, MemoryMiB: memoryMiB}
	}
	return out
}

func TestParseFakeSpec(t *testing.T) {
	tests := []struct {
		spec string
		want []FakeGPU
	}{
		{"dgxa100", fakeGPUs(8, "NVIDIA A100-SXM4-40GB", 40960)},
		{"DGXH100", fakeGPUs(8, "NVIDIA H100 80GB HBM3", 81920)},
		{" dgxh200 ", fakeGPUs(8, "NVIDIA H200 141GB HBM3e", 144384)},
		{"dgxb200", fakeGPUs(8, "NVIDIA B200 180GB HBM3e", 184320)},
		{"2xA100-80GB,1xT4-16GB", append(fakeGPUs(2, "NVIDIA A100-SXM4-80GB", 81920), FakeGPU{"Tesla T4", 16384})},
		{" 1x h100-80gb , L4-24GB ", []FakeGPU{{"NVIDIA H100 80GB HBM3", 81920}, {"NVIDIA L4", 24576}}},
		{"A100-40GB,H200-141GB,B200-180GB,A30-24GB,A10-24GB,V100-32GB,L40S-48GB", []FakeGPU{
			{"NVIDIA A100-SXM4-40GB", 40960},
			{"NVIDIA H200 141GB HBM3e", 144384},
			{"NVIDIA B200 180GB HBM3e", 184320},
			{"NVIDIA A30-PCIE-24GB", 24576},
			{"NVIDIA A10", 24576},
			{"Tesla V100-SXM2-32GB", 32768},
			{"NVIDIA L40S", 49152},
		}},
		{"2 x A10-24GB", fakeGPUs(2, "NVIDIA A10", 24576)},
		{"3XRTX-4090-24GB", fakeGPUs(3, "NVIDIA RTX-4090", 24576)},
		{"A100-20GB", []FakeGPU{{"NVIDIA A100", 20480}}},
		{"256xT4-16GB", fakeGPUs(256, "Tesla T4", 16384)},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := ParseFakeSpec(tc.spec)
			if err != nil {
				t.Fatalf("ParseFakeSpec(%q): %v", tc.spec, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseFakeSpec(%q) (-want +got):\n%s", tc.spec, diff)
			}
		})
	}
}

func TestParseFakeSpecErrors(t *testing.T) {
	tests := []struct {
		spec    string
		wantMsg string // the error names this
	}{
		{"", "empty"},
		{"   ", "empty"},
		{"dgxa200", `item "dgxa200"`},
		{"2xA100", `item "2xA100"`},
		{"A100 80GB", `item "A100 80GB"`},
		{"A100-80GiB", `item "A100-80GiB"`},
		{"-80GB", `item "-80GB"`},
		{"2x-80GB", `item "2x-80GB"`},
		{"4090-24GB", `item "4090-24GB"`},
		{"A100-80GB,", `item ""`},
		{"A100-80GB,,T4-16GB", `item ""`},
		{"0xA100-80GB", "count 0: want 1 to 256"},
		{"257xA100-80GB", "count 257: want 1 to 256"},
		{"99999999999999999999xT4-16GB", "count 99999999999999999999"},
		{"A100-0GB", "size 0GB: want 1 to 4096GB"},
		{"A100-5000GB", "size 5000GB"},
		{"200xA100-80GB,100xT4-16GB", "more than 256 GPUs"},
		{"A100-80GB;driver=R615", `node fact "driver=R615": want driver=VERSION`},
		{"A100-80GB;cgroup=3", `node fact "cgroup=3"`},
		{"A100-80GB;mps=yes", `node fact "mps=yes"`},
		{"A100-80GB;", `node fact ""`},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			_, err := ParseFakeSpec(tc.spec)
			if !errors.Is(err, ErrInvalidFakeSpec) {
				t.Fatalf("ParseFakeSpec(%q) = %v, want ErrInvalidFakeSpec", tc.spec, err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not name %q", err, tc.wantMsg)
			}
			if strings.HasPrefix(tc.wantMsg, "item") && !strings.Contains(err.Error(), "dgxa100") {
				t.Errorf("error %q does not list the allowed forms", err)
			}
			if _, err := NewFake(tc.spec, testNode); !errors.Is(err, ErrInvalidFakeSpec) {
				t.Errorf("NewFake(%q) = %v, want ErrInvalidFakeSpec", tc.spec, err)
			}
		})
	}
}

func TestFakeFacts(t *testing.T) {
	tests := []struct {
		spec string
		want FakeFacts
	}{
		{"2xA100-80GB", FakeFacts{DriverVersion: "550.54.15"}},
		{"dgxh100; driver=615.20.01 ;cgroup=2", FakeFacts{DriverVersion: "615.20.01", CgroupVersion: 2}},
		{"T4-16GB;mps;cgroup=1", FakeFacts{DriverVersion: "550.54.15", CgroupVersion: 1, MPS: true}},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			f, err := NewFake(tc.spec, testNode)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, f.Facts()); diff != "" {
				t.Errorf("Facts (-want +got):\n%s", diff)
			}
			b, err := Open(Options{Library: f})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = b.Close() }()
			if v, err := b.DriverVersion(); err != nil || v != tc.want.DriverVersion {
				t.Errorf("DriverVersion() = %q, %v; want %q", v, err, tc.want.DriverVersion)
			}
		})
	}
}

func TestNewFakeNeedsNodeName(t *testing.T) {
	if _, err := NewFake("dgxa100", ""); err == nil {
		t.Error("NewFake with an empty node name succeeded")
	}
}

var uuidForm = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestFakeUUID(t *testing.T) {
	// Pinned: a change would rename every fake GPU of every cluster.
	if got, want := FakeUUID("node-a", 0), "GPU-20e67e84-51da-849c-a851-cc3c606dd26e"; got != want {
		t.Errorf("FakeUUID(node-a, 0) = %q, want %q", got, want)
	}
	tests := []struct {
		name       string
		aNode      string
		aIndex     int
		bNode      string
		bIndex     int
		wantSameID bool
	}{
		{"same node and index", "node-a", 3, "node-a", 3, true},
		{"other node", "node-a", 3, "node-b", 3, false},
		{"other index", "node-a", 3, "node-a", 4, false},
		{"no ambiguity in concatenation", "node-1", 11, "node-11", 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := FakeUUID(tc.aNode, tc.aIndex), FakeUUID(tc.bNode, tc.bIndex)
			if (a == b) != tc.wantSameID {
				t.Errorf("FakeUUID(%s,%d)=%s, FakeUUID(%s,%d)=%s; same = %v, want %v", tc.aNode, tc.aIndex, a, tc.bNode, tc.bIndex, b, a == b, tc.wantSameID)
			}
			for _, u := range []string{a, b} {
				if !uuidForm.MatchString(u) {
					t.Errorf("FakeUUID = %q, want GPU-<version 8 UUID>", u)
				}
			}
		})
	}
}
