package nvidia

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// FakeSpecHelp describes the --fake-gpus value, for flag help and errors.
const FakeSpecHelp = `a mock server (dgxa100, dgxh100, dgxh200, dgxb200: 8 GPUs each) or a comma-separated list of [COUNTx]NAME-SIZEGB, e.g. "2xA100-80GB,1xT4-16GB" (known: ` + knownFakeModels + `; any other NAME-SIZEGB is a generic "NVIDIA NAME"), then optional node facts after ";": driver=VERSION, cgroup=1|2, mps (e.g. "2xA100-80GB;driver=615.20;cgroup=2")`

const (
	knownFakeModels = "A100-40GB, A100-80GB, H100-80GB, H200-141GB, B200-180GB, A30-24GB, T4-16GB, L4-24GB, A10-24GB, V100-32GB, L40S-48GB"
	// maxFakeGPUs bounds one node; real nodes hold at most 16.
	maxFakeGPUs = 256
	// maxFakeSizeGB bounds one GPU's memory.
	maxFakeSizeGB = 4096
)

// ErrInvalidFakeSpec is wrapped by every error about a --fake-gpus value.
var ErrInvalidFakeSpec = errors.New("invalid --fake-gpus value")

// FakeGPU is one GPU a --fake-gpus spec asks for, as the fake NVML will
// report it.
type FakeGPU struct {
	// Model is the product name NVML reports, e.g. "NVIDIA A100-SXM4-80GB".
	Model string
	// MemoryMiB is the framebuffer size NVML reports.
	MemoryMiB int64
}

// ParseFakeSpec checks a --fake-gpus value and returns its GPUs in index
// order. The grammar (FakeSpecHelp):
//
//	spec   = gpus { ";" fact }
//	gpus   = server | item { "," item }
//	fact   = "driver=" version | "cgroup=1" | "cgroup=2" | "mps"
//	server = "dgxa100" | "dgxh100" | "dgxh200" | "dgxb200"   (8 GPUs each)
//	item   = [ count "x" ] name "-" size "GB"
//	count  = 1..256 (all items together at most 256 GPUs; default 1)
//	name   = a letter, then letters, digits, ".", "_" and "-"
//	size   = 1..4096 (GiB; the GPU reports size*1024 MiB)
//
// Names and "GB" are case-insensitive; spaces around items and around "x"
// are ignored. Known NAME-SIZE pairs (A100-80GB, T4-16GB, …) report NVIDIA's
// product name; any other becomes a generic "NVIDIA NAME". Errors wrap
// ErrInvalidFakeSpec and name the bad item and the allowed forms.
func ParseFakeSpec(spec string) ([]FakeGPU, error) {
	parsed, err := parseFakeSpec(spec)
	if err != nil {
		return nil, err
	}
	out := make([]FakeGPU, len(parsed.configs))
	for i, c := range parsed.configs {
		out[i] = FakeGPU{Model: c.Name, MemoryMiB: int64(c.MemoryMB)} //nolint:gosec // G115: at most maxFakeSizeGB*1024
	}
	return out, nil
}

// FakeUUID is the UUID the fake GPU at index on nodeName reports:
// "GPU-" and a UUID (RFC 9562 version 8) made from a SHA-256 of the node
// name and index, so that restarts keep it and nodes do not share it.
func FakeUUID(nodeName string, index int) string {
	sum := sha256.Sum256([]byte("gpuslice fake GPU\x00" + nodeName + "\x00" + strconv.Itoa(index)))
	u := sum[:16]
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// FakeFacts are the node facts a --fake-gpus value reports beside its
// GPUs, so that each enforcement mechanism can be tried without one.
type FakeFacts struct {
	// DriverVersion is what NVML reports; default fakeDriverVersion.
	DriverVersion string
	// CgroupVersion is 1 or 2; 0 (not given) means the host's.
	CgroupVersion int
	// MPS says the node has the MPS control binary.
	MPS bool
}

// fakeDriverVersion is the driver of go-nvml's mock servers.
const fakeDriverVersion = "550.54.15"

// fakeSpec is a parsed --fake-gpus value.
type fakeSpec struct {
	configs   []gpus.Config
	newServer func() *server.Server
	facts     FakeFacts
}

// fakeDriver matches a driver version: digits and dots.
var fakeDriver = regexp.MustCompile(`^[0-9]+(\.[0-9]+)*$`)

// parseFakeFacts reads the facts after the GPUs of a --fake-gpus value.
func parseFakeFacts(items []string) (FakeFacts, error) {
	f := FakeFacts{DriverVersion: fakeDriverVersion}
	for _, item := range items {
		item = strings.TrimSpace(item)
		key, value, _ := strings.Cut(item, "=")
		switch {
		case key == "driver" && fakeDriver.MatchString(value):
			f.DriverVersion = value
		case key == "cgroup" && (value == "1" || value == "2"):
			f.CgroupVersion = int(value[0] - '0')
		case item == "mps":
			f.MPS = true
		default:
			return FakeFacts{}, fmt.Errorf("%w: node fact %q: want driver=VERSION (digits and dots), cgroup=1, cgroup=2 or mps", ErrInvalidFakeSpec, item)
		}
	}
	return f, nil
}

// fakeItem matches one list item: optional count, name, size.
var fakeItem = regexp.MustCompile(`^(?:([0-9]+)\s*[xX]\s*)?([A-Za-z][A-Za-z0-9._-]*)-([0-9]+)[gG][bB]$`)

func parseFakeSpec(spec string) (fakeSpec, error) {
	parts := strings.Split(spec, ";")
	facts, err := parseFakeFacts(parts[1:])
	if err != nil {
		return fakeSpec{}, err
	}
	s, err := parseFakeGPUs(strings.TrimSpace(parts[0]))
	if err != nil {
		return fakeSpec{}, err
	}
	s.facts = facts
	newServer := s.newServer
	s.newServer = func() *server.Server {
		srv := newServer()
		srv.DriverVersion = facts.DriverVersion
		return srv
	}
	return s, nil
}

// parseFakeGPUs reads the GPUs of a --fake-gpus value.
func parseFakeGPUs(spec string) (fakeSpec, error) {
	if s, ok := fakeServer(strings.ToLower(spec)); ok {
		return s, nil
	}
	if spec == "" {
		return fakeSpec{}, fmt.Errorf("%w: empty; want %s", ErrInvalidFakeSpec, FakeSpecHelp)
	}
	var configs []gpus.Config
	for item := range strings.SplitSeq(spec, ",") {
		item = strings.TrimSpace(item)
		m := fakeItem.FindStringSubmatch(item)
		if m == nil {
			return fakeSpec{}, fmt.Errorf("%w: item %q: want %s", ErrInvalidFakeSpec, item, FakeSpecHelp)
		}
		count := 1
		if m[1] != "" {
			n, err := strconv.Atoi(m[1])
			if err != nil || n < 1 || n > maxFakeGPUs {
				return fakeSpec{}, fmt.Errorf("%w: item %q: count %s: want 1 to %d", ErrInvalidFakeSpec, item, m[1], maxFakeGPUs)
			}
			count = n
		}
		sizeGB, err := strconv.Atoi(m[3])
		if err != nil || sizeGB < 1 || sizeGB > maxFakeSizeGB {
			return fakeSpec{}, fmt.Errorf("%w: item %q: size %sGB: want 1 to %dGB", ErrInvalidFakeSpec, item, m[3], maxFakeSizeGB)
		}
		if len(configs)+count > maxFakeGPUs {
			return fakeSpec{}, fmt.Errorf("%w: %q: more than %d GPUs", ErrInvalidFakeSpec, spec, maxFakeGPUs)
		}
		configs = append(configs, gpus.Multiple(count, fakeModel(m[2], sizeGB))...)
	}
	return fakeSpec{
		configs: configs,
		newServer: func() *server.Server {
			// Same versions as go-nvml's DGX A100/H100 mocks.
			s, _ := server.New(
				server.WithGPUs(configs...),
				server.WithDriverVersion(fakeDriverVersion),
				server.WithNVMLVersion("12.550.54.15"),
				server.WithCUDADriverVersion(12040),
			)
			return s
		},
	}, nil
}

// fakeServer returns go-nvml's mock server of that name.
func fakeServer(name string) (fakeSpec, bool) {
	var (
		model gpus.Config
		newFn func() *server.Server
	)
	switch name {
	case "dgxa100":
		model, newFn = gpus.A100_SXM4_40GB, dgxa100.New
	case "dgxh100":
		model, newFn = gpus.H100_SXM5_80GB, dgxh100.New
	case "dgxh200":
		model, newFn = gpus.H200_SXM5_141GB, dgxh200.New
	case "dgxb200":
		model, newFn = gpus.B200_SXM5_180GB, dgxb200.New
	default:
		return fakeSpec{}, false
	}
	// go-nvml names its DGX A100 GPUs "Mock NVIDIA …"; report the real name.
	model.Name = strings.TrimPrefix(model.Name, "Mock ")
	return fakeSpec{configs: gpus.Multiple(8, model), newServer: newFn}, true
}

// fakeModel is the GPU a NAME-SIZEGB item stands for: go-nvml's mock model
// when it has one, NVIDIA's product name for other known models, else a
// generic "NVIDIA NAME".
func fakeModel(name string, sizeGB int) gpus.Config {
	c := gpus.Config{
		Name:         "NVIDIA " + name,
		Architecture: nvml.DEVICE_ARCH_UNKNOWN,
		Brand:        nvml.BRAND_NVIDIA,
	}
	switch strings.ToUpper(name) + "-" + strconv.Itoa(sizeGB) + "GB" {
	case "A100-40GB":
		c = gpus.A100_SXM4_40GB
		c.Name = "NVIDIA A100-SXM4-40GB" // go-nvml prefixes "Mock " here
	case "A100-80GB":
		c = gpus.A100_SXM4_80GB
	case "H100-80GB":
		c = gpus.H100_SXM5_80GB
	case "H200-141GB":
		c = gpus.H200_SXM5_141GB
	case "B200-180GB":
		c = gpus.B200_SXM5_180GB
	case "A30-24GB":
		c = gpus.A30_PCIE_24GB
	case "T4-16GB":
		c = plainModel("Tesla T4", nvml.DEVICE_ARCH_TURING, 7, 5, 0x1EB810DE)
	case "L4-24GB":
		c = plainModel("NVIDIA L4", nvml.DEVICE_ARCH_ADA, 8, 9, 0x27B810DE)
	case "A10-24GB":
		c = plainModel("NVIDIA A10", nvml.DEVICE_ARCH_AMPERE, 8, 6, 0x223610DE)
	case "V100-32GB":
		c = plainModel("Tesla V100-SXM2-32GB", nvml.DEVICE_ARCH_VOLTA, 7, 0, 0x1DB510DE)
	case "L40S-48GB":
		c = plainModel("NVIDIA L40S", nvml.DEVICE_ARCH_ADA, 8, 9, 0x26B910DE)
	}
	c.MemoryMB = uint64(sizeGB) * 1024 //nolint:gosec // G115: 1..maxFakeSizeGB
	return c
}

// plainModel is a GPU without MIG profiles.
func plainModel(name string, arch nvml.DeviceArchitecture, cudaMajor, cudaMinor int, pciDeviceID uint32) gpus.Config {
	return gpus.Config{
		Name:         name,
		Architecture: arch,
		Brand:        nvml.BRAND_NVIDIA,
		CudaMajor:    cudaMajor,
		CudaMinor:    cudaMinor,
		PciDeviceId:  pciDeviceID,
	}
}

// ParseFakeFacts returns the node facts of a --fake-gpus value (see
// ParseFakeSpec); errors wrap ErrInvalidFakeSpec.
func ParseFakeFacts(spec string) (FakeFacts, error) {
	parsed, err := parseFakeSpec(spec)
	if err != nil {
		return FakeFacts{}, err
	}
	return parsed.facts, nil
}
