package deviceplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Defaults for Config. DefaultDevicePluginDir is the kubelet's fixed folder.
const (
	DefaultSplitCount      = 10
	DefaultMemoryScaling   = 1.0
	DefaultDevicePluginDir = "/var/lib/kubelet/device-plugins"
	DefaultLeaseDuration   = 40 * time.Second
	DefaultLeaseRenew      = 10 * time.Second
	DefaultHealthCoolDown  = 30 * time.Second
	MaxSplitCount          = 100
	MaxMemoryScaling       = 10.0
	maxDeviceIDLength      = 63
	kubeletSocketName      = "kubelet.sock"
)

// Config is the device plugin's configuration. Zero fields take the defaults
// of DefaultConfig when read from a file; call Validate before use.
type Config struct {
	// NodeName is the Kubernetes Node this agent runs on. Required.
	NodeName string `json:"nodeName"`
	// ResourceName is the extended resource registered with the kubelet.
	ResourceName string `json:"resourceName"`
	// SplitCount is the number of virtual devices advertised per healthy GPU,
	// i.e. the most pods that may share one GPU. 1..MaxSplitCount.
	SplitCount int `json:"splitCount"`
	// MemoryScaling multiplies each GPU's schedulable memory; above 1.0 it
	// allows oversubscription. (0, MaxMemoryScaling].
	MemoryScaling float64 `json:"memoryScaling"`
	// ReservedMemoryMiB is held back on every GPU for the driver and CUDA
	// context before scaling. >= 0 and below the smallest GPU's memory.
	ReservedMemoryMiB int64 `json:"reservedMemoryMiB"`
	// ExcludeGPUs lists GPUs the plugin must not advertise, each a UUID
	// ("GPU-…") or an NVML index ("3").
	ExcludeGPUs []string `json:"excludeGPUs,omitempty"`
	// DevicePluginDir is the kubelet's device-plugin folder, holding
	// kubelet.sock and the plugin's own socket.
	DevicePluginDir string `json:"devicePluginDir"`
	// HeartbeatNamespace is where the per-node heartbeat Lease lives.
	HeartbeatNamespace string `json:"heartbeatNamespace"`
	// LeaseDuration is the heartbeat Lease's leaseDurationSeconds.
	LeaseDuration metav1.Duration `json:"leaseDuration"`
	// LeaseRenew is how often the Lease is renewed; below LeaseDuration.
	LeaseRenew metav1.Duration `json:"leaseRenew"`
	// HealthCoolDown is how long an unhealthy GPU waits before a re-probe.
	HealthCoolDown metav1.Duration `json:"healthCoolDown"`
	// FakeGPUs, when set, replaces NVML with fake GPUs: a mock server name
	// (dgxa100, dgxh100, dgxh200, dgxb200) or a list such as
	// "2xA100-80GB,1xT4-16GB".
	FakeGPUs string `json:"fakeGPUs,omitempty"`
}

// DefaultConfig returns the configuration used when nothing is set.
// NodeName defaults to the NODE_NAME environment variable.
func DefaultConfig() Config {
	return Config{
		NodeName:           os.Getenv("NODE_NAME"),
		ResourceName:       string(vgpu.ResourceGPU),
		SplitCount:         DefaultSplitCount,
		MemoryScaling:      DefaultMemoryScaling,
		DevicePluginDir:    DefaultDevicePluginDir,
		HeartbeatNamespace: vgpu.DefaultHeartbeatNamespace,
		LeaseDuration:      metav1.Duration{Duration: DefaultLeaseDuration},
		LeaseRenew:         metav1.Duration{Duration: DefaultLeaseRenew},
		HealthCoolDown:     metav1.Duration{Duration: DefaultHealthCoolDown},
	}
}

// LoadConfigFile reads a YAML or JSON file over base: fields present in the
// file replace those of base; unknown fields are an error naming the field.
func LoadConfigFile(path string, base Config) (Config, error) {
	data, err := os.ReadFile(path) //nolint:gosec // G304: the operator names the file.
	if err != nil {
		return base, fmt.Errorf("config file: %w", err)
	}
	cfg := base
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return base, fmt.Errorf("config file %s: %w", path, err)
	}
	return cfg, nil
}

// Validate checks every field and returns the first problem as a *vgpu.FieldError.
func (c Config) Validate() error {
	switch {
	case c.NodeName == "":
		return vgpu.InvalidField("nodeName", "", "required: set --node-name or the NODE_NAME environment variable")
	case len(validation.IsDNS1123Subdomain(c.NodeName)) > 0:
		return vgpu.InvalidField("nodeName", c.NodeName, "must be a valid Node name ("+strings.Join(validation.IsDNS1123Subdomain(c.NodeName), "; ")+")")
	case !validResourceName(c.ResourceName):
		return vgpu.InvalidField("resourceName", c.ResourceName, "must be an extended resource name like hami.io/gpu (a domain outside kubernetes.io, a slash, a name)")
	case c.SplitCount < 1 || c.SplitCount > MaxSplitCount:
		return vgpu.InvalidField("splitCount", strconv.Itoa(c.SplitCount), fmt.Sprintf("must be an integer from 1 to %d", MaxSplitCount))
	case !(c.MemoryScaling > 0 && c.MemoryScaling <= MaxMemoryScaling):
		return vgpu.InvalidField("memoryScaling", strconv.FormatFloat(c.MemoryScaling, 'g', -1, 64), fmt.Sprintf("must be a number above 0 and at most %g (above 1 oversubscribes memory)", MaxMemoryScaling))
	case c.ReservedMemoryMiB < 0:
		return vgpu.InvalidField("reservedMemoryMiB", strconv.FormatInt(c.ReservedMemoryMiB, 10), "must be 0 or more MiB")
	case c.DevicePluginDir == "" || !filepath.IsAbs(c.DevicePluginDir):
		return vgpu.InvalidField("devicePluginDir", c.DevicePluginDir, "must be an absolute path (the kubelet uses "+DefaultDevicePluginDir+")")
	case len(validation.IsDNS1123Label(c.HeartbeatNamespace)) > 0:
		return vgpu.InvalidField("heartbeatNamespace", c.HeartbeatNamespace, "must be a namespace name (lower-case letters, digits and '-')")
	case c.LeaseDuration.Duration < time.Second:
		return vgpu.InvalidField("leaseDuration", c.LeaseDuration.String(), "must be a duration of at least 1s")
	case c.LeaseRenew.Duration <= 0 || c.LeaseRenew.Duration >= c.LeaseDuration.Duration:
		return vgpu.InvalidField("leaseRenew", c.LeaseRenew.String(), "must be a duration above 0 and below leaseDuration ("+c.LeaseDuration.String()+")")
	case c.HealthCoolDown.Duration <= 0:
		return vgpu.InvalidField("healthCoolDown", c.HealthCoolDown.String(), "must be a duration above 0")
	}
	for _, g := range c.ExcludeGPUs {
		if !strings.HasPrefix(g, "GPU-") && !isIndex(g) {
			return vgpu.InvalidField("excludeGPUs", g, "each entry must be a GPU UUID (GPU-…) or an index (0, 1, …)")
		}
	}
	return nil
}

// excluded reports whether gpu matches an ExcludeGPUs entry.
func (c Config) excluded(gpu vgpu.GPU) bool {
	for _, g := range c.ExcludeGPUs {
		if g == gpu.UUID || g == strconv.Itoa(gpu.Index) {
			return true
		}
	}
	return false
}

func isIndex(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 0
}

func validResourceName(name string) bool {
	domain, rest, ok := strings.Cut(name, "/")
	if !ok || rest == "" || strings.Contains(rest, "/") {
		return false
	}
	if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") || domain == "requests" {
		return false
	}
	return len(validation.IsDNS1123Subdomain(domain)) == 0 && len(validation.IsQualifiedName(name)) == 0
}
