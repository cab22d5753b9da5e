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

	"github.com/gpuslice/gpuslice/internal/configfile"
	"github.com/gpuslice/gpuslice/node/handoff"
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

	// DefaultCDISpecDir is where container runtimes look for transient CDI
	// specs (containerd and CRI-O read /etc/cdi and /var/run/cdi).
	DefaultCDISpecDir = "/var/run/cdi"
	// DefaultPodResourcesSocket is the kubelet's PodResources API socket.
	DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	// DefaultProcDir is where the plugin reads the processes' cgroups.
	DefaultProcDir = "/proc"
	// DefaultSharedCacheDir is the container path under which HAMi-core
	// keeps each container's shared memory-accounting file.
	DefaultSharedCacheDir = "/tmp/gpuslice"
	// defaultStateSubdir is the state folder inside DevicePluginDir when
	// StateDir is empty. The kubelet deletes only sockets there, never
	// files or folders.
	defaultStateSubdir = "gpuslice-state"
)

// Mode says how a container learns its slice.
type Mode string

const (
	// ModeCDI answers Allocate with a CDI device name whose spec file the
	// plugin prepares in the background for the container the kubelet
	// admits, and checks (or writes) at PreStartContainer, once the
	// kubelet's PodResources API names the container that holds the
	// devices. Exact; the default.
	ModeCDI Mode = "cdi"
	// ModeEnv answers Allocate with the environment itself, for runtimes
	// without CDI. Allocate carries no pod identity, so the plugin matches
	// the devices to the pending container the scheduler placed on those
	// GPUs and verifies the match at PreStartContainer.
	ModeEnv Mode = "env"
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
	// FakeGPUFaultsDir, with FakeGPUs, is a folder the fake GPUs take
	// faults from while the plugin runs: files that ask for an XID or a GPU
	// reset (nvidia.WriteFakeFault, docs/health.md), so that tests can break
	// and repair the GPUs of a running plugin. Empty takes none.
	FakeGPUFaultsDir string `json:"fakeGPUFaultsDir,omitempty"`
	// Mode is how a container gets its slice: "cdi" (default) or "env"
	// (runtimes without CDI support). See ModeCDI and ModeEnv.
	Mode Mode `json:"mode"`
	// CDISpecDir is the folder the plugin writes its CDI specs to (mode
	// cdi). The container runtime must read it; an absolute path.
	CDISpecDir string `json:"cdiSpecDir"`
	// PodResourcesSocket is the kubelet's PodResources API socket, which
	// names the pod and container that hold a set of device IDs. The
	// plugin's DaemonSet must mount its folder. An absolute path.
	PodResourcesSocket string `json:"podResourcesSocket"`
	// HostLibVGPU is the host path of HAMi-core's libvgpu.so. When set,
	// the node qualifies for the hami-core mechanism: every GPU container
	// under it gets the library read-only at /usr/local/vgpu/libvgpu.so and
	// an /etc/ld.so.preload that loads it. Empty: no library is injected.
	HostLibVGPU string `json:"hostLibVGPU,omitempty"`
	// Enforcement is the mechanism that enforces the slices
	// (docs/enforcement.md): "auto" (the default) picks the strongest the
	// node qualifies for, driver, hami-core or mps forces that one, none
	// enforces nothing. hami-core needs HostLibVGPU; mps needs MPSControl.
	Enforcement string `json:"enforcement"`
	// DisabledEnforcement lists mechanisms (driver, hami-core, mps) that
	// "auto" must not pick.
	DisabledEnforcement []string `json:"disabledEnforcement,omitempty"`
	// NVIDIACDISpecs are glob patterns of the NVIDIA container toolkit's
	// CDI spec files. Under the driver mechanism a container also gets the
	// NVIDIA CDI device of each of its GPUs found there, so the runtime
	// applies the toolkit's edits and memory-limit hook. Empty: none.
	NVIDIACDISpecs []string `json:"nvidiaCDISpecs,omitempty"`
	// EnforcementDriverHook says how the node learns that the toolkit's
	// memory-limit hook (nvidia-cdi-hook apply-cuda-memory-limits) runs,
	// without which driver limits nothing: "detect" (the default) finds it
	// in the NVIDIACDISpecs for every GPU, or the node does not qualify
	// for driver; "assume" takes the operator's word, and the node's
	// driver mechanism is reported unverified.
	EnforcementDriverHook string `json:"enforcementDriverHook"`
	// MPSControl is the MPS control binary, a path or a name looked up in
	// PATH; the node qualifies for mps when it is found.
	MPSControl string `json:"mpsControl"`
	// MPSDir is the folder of the MPS daemons' pipes and logs, one
	// subfolder per GPU; the same path on the host, in the plugin's
	// container and in GPU containers (their pipe folder is mounted). A
	// clean absolute path.
	MPSDir string `json:"mpsDir"`
	// SharedCacheDir is the folder, inside the container, of the file set
	// in CUDA_DEVICE_MEMORY_SHARED_CACHE (<dir>/<pod UID>-<container>.cache).
	SharedCacheDir string `json:"sharedCacheDir"`
	// StateDir holds the plugin's own files: the checkpoint (env-mode
	// bindings, cdi-mode CDI device names), the records of GPUs that need
	// a reset (FaultRecordDir) and the ld.so.preload file mounted into
	// containers. It must be the same path on the host as in
	// the plugin's container (it is mounted into pods), and outlive the
	// plugin's container. Empty means <devicePluginDir>/gpuslice-state.
	StateDir string `json:"stateDir,omitempty"`
	// HealthAddress is the host:port of the probe endpoints: /readyz (200
	// only while the kubelet has accepted the plugin's registration) and
	// /healthz (200 while the process serves). Empty serves none.
	HealthAddress string `json:"healthAddress,omitempty"`
	// ProcDir is the host's /proc as the plugin sees it: the cgroups of
	// the processes NVML lists (/proc/<pid>/cgroup, host PIDs) name the
	// container each runs in, for the per-container GPU memory metrics.
	// The chart mounts the host's /proc read-only at /host/proc. An
	// absolute path.
	ProcDir string `json:"procDir"`
}

// DefaultConfig returns the configuration used when nothing is set.
// NodeName defaults to the NODE_NAME environment variable.
func DefaultConfig() Config {
	return Config{
		NodeName:              os.Getenv("NODE_NAME"),
		ResourceName:          string(vgpu.ResourceGPU),
		SplitCount:            DefaultSplitCount,
		MemoryScaling:         DefaultMemoryScaling,
		DevicePluginDir:       DefaultDevicePluginDir,
		HeartbeatNamespace:    vgpu.DefaultHeartbeatNamespace,
		LeaseDuration:         metav1.Duration{Duration: DefaultLeaseDuration},
		LeaseRenew:            metav1.Duration{Duration: DefaultLeaseRenew},
		HealthCoolDown:        metav1.Duration{Duration: DefaultHealthCoolDown},
		Mode:                  ModeCDI,
		CDISpecDir:            DefaultCDISpecDir,
		PodResourcesSocket:    DefaultPodResourcesSocket,
		SharedCacheDir:        DefaultSharedCacheDir,
		Enforcement:           handoff.EnforcementAuto,
		NVIDIACDISpecs:        handoff.DefaultNVIDIACDISpecs(),
		EnforcementDriverHook: handoff.DriverHookDetect,
		MPSControl:            handoff.DefaultMPSControl,
		MPSDir:                handoff.DefaultMPSDir,
		ProcDir:               DefaultProcDir,
	}
}

// EffectiveStateDir returns StateDir, or <DevicePluginDir>/gpuslice-state
// when StateDir is empty.
func (c Config) EffectiveStateDir() string {
	if c.StateDir != "" {
		return c.StateDir
	}
	return filepath.Join(c.DevicePluginDir, defaultStateSubdir)
}

// faultRecordSubdir is the folder of FaultRecordDir in the state folder.
const faultRecordSubdir = "gpu-faults"

// FaultRecordDir is where the GPU backend records each GPU that needs a
// reset (nvidia.Options.FaultRecordDir), so that a restarted plugin keeps
// it out of service until NVML shows the reset: gpu-faults in the state
// folder, which outlives the plugin's container.
func (c Config) FaultRecordDir() string {
	return filepath.Join(c.EffectiveStateDir(), faultRecordSubdir)
}

// LoadConfigFile reads a YAML or JSON file over base: fields present in the
// file replace those of base; unknown fields are an error naming the field.
func LoadConfigFile(path string, base Config) (Config, error) {
	return configfile.Load(path, base)
}

// Validate checks every field and returns the first problem as a *vgpu.FieldError.
func (c Config) Validate() error {
	switch {
	case c.NodeName == "":
		return vgpu.InvalidField("nodeName", "", "required: set --node-name or the NODE_NAME environment variable")
	case len(validation.IsDNS1123Subdomain(c.NodeName)) > 0:
		return vgpu.InvalidField("nodeName", c.NodeName, "must be a valid Node name ("+strings.Join(validation.IsDNS1123Subdomain(c.NodeName), "; ")+")")
	case !vgpu.IsExtendedResourceName(c.ResourceName):
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
	case c.FakeGPUFaultsDir != "" && c.FakeGPUs == "":
		return vgpu.InvalidField("fakeGPUFaultsDir", c.FakeGPUFaultsDir, "must be empty unless fakeGPUs is set: only fake GPUs take injected faults")
	case c.FakeGPUFaultsDir != "" && !cleanAbs(c.FakeGPUFaultsDir):
		return vgpu.InvalidField("fakeGPUFaultsDir", c.FakeGPUFaultsDir, "must be empty or a clean absolute path of a folder")
	case c.Mode != ModeCDI && c.Mode != ModeEnv:
		return vgpu.InvalidField("mode", string(c.Mode), `must be "cdi" (CDI devices, the default) or "env" (environment, for runtimes without CDI)`)
	case !cleanAbs(c.CDISpecDir):
		return vgpu.InvalidField("cdiSpecDir", c.CDISpecDir, "must be a clean absolute path of a folder the container runtime reads CDI specs from (default "+DefaultCDISpecDir+")")
	case !cleanAbs(c.PodResourcesSocket):
		return vgpu.InvalidField("podResourcesSocket", c.PodResourcesSocket, "must be a clean absolute path (the kubelet uses "+DefaultPodResourcesSocket+")")
	case c.HostLibVGPU != "" && !cleanAbs(c.HostLibVGPU):
		return vgpu.InvalidField("hostLibVGPU", c.HostLibVGPU, "must be empty or the clean absolute host path of HAMi-core's libvgpu.so")
	case !handoff.ValidEnforcement(c.Enforcement):
		return vgpu.InvalidField("enforcement", c.Enforcement, "must be auto (the strongest the node has, the default) or one of "+vgpu.EnforcementList())
	case c.Enforcement == string(vgpu.EnforcementHAMiCore) && c.HostLibVGPU == "":
		return vgpu.InvalidField("enforcement", c.Enforcement, "needs hostLibVGPU, the host path of HAMi-core's libvgpu.so")
	case !handoff.ValidDriverHook(c.EnforcementDriverHook):
		return vgpu.InvalidField("enforcementDriverHook", c.EnforcementDriverHook, "must be detect (find the toolkit's memory-limit hook in its CDI specs, the default) or assume (take the operator's word)")
	case c.Enforcement == string(vgpu.EnforcementMPS) && c.MPSControl == "":
		return vgpu.InvalidField("enforcement", c.Enforcement, "needs mpsControl, the nvidia-cuda-mps-control binary")
	case !cleanAbs(c.MPSDir):
		return vgpu.InvalidField("mpsDir", c.MPSDir, "must be a clean absolute path, the same on the host and in containers (default "+handoff.DefaultMPSDir+")")
	case !cleanAbs(c.SharedCacheDir):
		return vgpu.InvalidField("sharedCacheDir", c.SharedCacheDir, "must be a clean absolute path inside the container (default "+DefaultSharedCacheDir+")")
	case c.StateDir != "" && !cleanAbs(c.StateDir):
		return vgpu.InvalidField("stateDir", c.StateDir, "must be empty (<devicePluginDir>/"+defaultStateSubdir+") or a clean absolute path")
	case !cleanAbs(c.ProcDir):
		return vgpu.InvalidField("procDir", c.ProcDir, "must be a clean absolute path of the host's /proc (default "+DefaultProcDir+"; the chart mounts it at /host/proc)")
	case c.HealthAddress != "" && !validHealthAddress(c.HealthAddress):
		return vgpu.InvalidField("healthAddress", c.HealthAddress, `must be empty (no probe endpoints) or host:port with a port from 1 to 65535, e.g. ":8090"`)
	}
	for _, e := range c.DisabledEnforcement {
		if m, err := vgpu.ParseEnforcement(e); err != nil || !m.Guards() {
			return vgpu.InvalidField("disabledEnforcement", e, "each entry must be one of driver, hami-core, mps")
		}
	}
	for _, p := range c.NVIDIACDISpecs {
		if _, err := filepath.Match(p, ""); err != nil || !filepath.IsAbs(p) {
			return vgpu.InvalidField("nvidiaCDISpecs", p, "each entry must be an absolute path or glob pattern, e.g. /etc/cdi/nvidia*.yaml")
		}
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

// cleanAbs reports whether path is absolute and already clean (no "..",
// no trailing slash, no repeated slashes), so it can be used verbatim in
// mounts and CDI specs.
func cleanAbs(path string) bool {
	return filepath.IsAbs(path) && filepath.Clean(path) == path
}

func isIndex(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 0
}

// validHealthAddress reports whether addr is host:port with a port from 1
// to 65535.
func validHealthAddress(addr string) bool {
	port, ok := configfile.Port(addr)
	return ok && port >= 1
}
