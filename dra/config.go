package dra

import (
	"fmt"
	"path"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuslice/gpuslice/internal/configfile"
	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Defaults of Config.
const (
	// DefaultDriverName is the DRA driver's name: the driver of the
	// ResourceSlices and of the DeviceClass the chart installs.
	DefaultDriverName = vgpu.DRADriverName
	// DefaultRegistrarDir is the kubelet's plugin registration folder.
	DefaultRegistrarDir = "/var/lib/kubelet/plugins_registry"
	// DefaultPluginsDir is the parent of the driver's own folder (its
	// socket), DefaultPluginsDir/<driver name>.
	DefaultPluginsDir = "/var/lib/kubelet/plugins"
	// DefaultCDISpecDir is where the CDI specs are written.
	DefaultCDISpecDir = "/var/run/cdi"
	// DefaultSharedCacheDir is HAMi-core's accounting folder in the
	// container, as in device-plugin mode.
	DefaultSharedCacheDir = "/tmp/gpuslice"
	// DefaultMemoryScaling is no over-commit.
	DefaultMemoryScaling = 1.0
	// MaxMemoryScaling bounds MemoryScaling.
	MaxMemoryScaling = 10.0
	// DefaultLeaseDuration and DefaultLeaseRenew time the heartbeat Lease,
	// as the device plugin's.
	DefaultLeaseDuration = 40 * time.Second
	DefaultLeaseRenew    = 10 * time.Second
)

// Config is the DRA driver's configuration. DefaultConfig fills it; Validate
// checks it.
type Config struct {
	// DriverName is the DRA driver name (a DNS subdomain).
	DriverName string `json:"driverName"`
	// NodeName is the Node the driver runs on; required.
	NodeName string `json:"nodeName"`
	// ReservedMemoryMiB is kept back from every GPU, MiB.
	ReservedMemoryMiB int64 `json:"reservedMemoryMiB"`
	// MemoryScaling multiplies the schedulable memory (over-commit above 1).
	MemoryScaling float64 `json:"memoryScaling"`
	// ExcludeGPUs lists GPUs (UUIDs or indexes) not to publish.
	ExcludeGPUs []string `json:"excludeGPUs,omitempty"`
	// RegistrarDir is the kubelet's plugin registration folder and
	// PluginDir the driver's own folder (its DRA socket).
	RegistrarDir string `json:"registrarDir"`
	PluginDir    string `json:"pluginDir"`
	// CDISpecDir is where the CDI specs of prepared claims are written.
	CDISpecDir string `json:"cdiSpecDir"`
	// SharedCacheDir is HAMi-core's accounting folder in the container.
	SharedCacheDir string `json:"sharedCacheDir"`
	// StateDir is the host folder of the ld.so.preload file.
	StateDir string `json:"stateDir"`
	// FakeGPUs, when set, means fake GPUs (no device nodes in the specs).
	FakeGPUs string `json:"fakeGPUs,omitempty"`
	// Enforcement chooses the node's enforcement mechanism.
	Enforcement handoff.EnforcementConfig `json:"enforcement"`
	// MPSDir is the host folder of the MPS daemons' pipes.
	MPSDir string `json:"mpsDir"`
	// HeartbeatNamespace is where the node's heartbeat Lease lives (the
	// device plugin's, vgpu.HeartbeatLeaseName), beside the kubelets'.
	HeartbeatNamespace string `json:"heartbeatNamespace"`
	// LeaseDuration is the heartbeat Lease's leaseDurationSeconds.
	LeaseDuration metav1.Duration `json:"leaseDuration"`
	// LeaseRenew is how often the Lease is renewed; below LeaseDuration.
	LeaseRenew metav1.Duration `json:"leaseRenew"`
	// HealthAddress is the host:port of the probe endpoints (/healthz,
	// /readyz: Driver.Ready); empty serves none.
	HealthAddress string `json:"healthAddress,omitempty"`
}

// DefaultConfig returns the defaults; NodeName stays empty.
func DefaultConfig() Config {
	return Config{
		DriverName:     DefaultDriverName,
		MemoryScaling:  DefaultMemoryScaling,
		RegistrarDir:   DefaultRegistrarDir,
		PluginDir:      path.Join(DefaultPluginsDir, DefaultDriverName),
		CDISpecDir:     DefaultCDISpecDir,
		SharedCacheDir: DefaultSharedCacheDir,
		StateDir:       path.Join(DefaultPluginsDir, DefaultDriverName, "state"),
		Enforcement:    handoff.EnforcementConfig{Enforcement: handoff.EnforcementAuto, MPSControl: handoff.DefaultMPSControl},
		MPSDir:         handoff.DefaultMPSDir,

		HeartbeatNamespace: vgpu.DefaultHeartbeatNamespace,
		LeaseDuration:      metav1.Duration{Duration: DefaultLeaseDuration},
		LeaseRenew:         metav1.Duration{Duration: DefaultLeaseRenew},
	}
}

// Validate reports the first field that is not allowed, naming it, its
// value and what is allowed.
func (c Config) Validate() error {
	if msgs := validation.IsDNS1123Subdomain(c.DriverName); len(msgs) > 0 {
		return vgpu.InvalidField("driverName", c.DriverName, "must be a DNS subdomain: "+msgs[0])
	}
	if c.NodeName == "" {
		return vgpu.InvalidField("nodeName", c.NodeName, "is required (--node-name or $NODE_NAME)")
	}
	if c.ReservedMemoryMiB < 0 {
		return vgpu.InvalidField("reservedMemoryMiB", fmt.Sprint(c.ReservedMemoryMiB), "must be 0 or more")
	}
	if c.MemoryScaling <= 0 || c.MemoryScaling > MaxMemoryScaling {
		return vgpu.InvalidField("memoryScaling", fmt.Sprint(c.MemoryScaling), fmt.Sprintf("must be above 0 and at most %g", MaxMemoryScaling))
	}
	for name, dir := range map[string]string{"registrarDir": c.RegistrarDir, "pluginDir": c.PluginDir, "cdiSpecDir": c.CDISpecDir, "sharedCacheDir": c.SharedCacheDir, "stateDir": c.StateDir} {
		if !path.IsAbs(dir) {
			return vgpu.InvalidField(name, dir, "must be an absolute path")
		}
	}
	if port, ok := configfile.Port(c.HealthAddress); c.HealthAddress != "" && (!ok || port < 1) {
		return vgpu.InvalidField("healthAddress", c.HealthAddress, `must be empty (no probe endpoints) or host:port with a port from 1 to 65535, e.g. ":8091"`)
	}
	if msgs := validation.IsDNS1123Label(c.HeartbeatNamespace); len(msgs) > 0 {
		return vgpu.InvalidField("heartbeatNamespace", c.HeartbeatNamespace, "must be a namespace name: "+msgs[0])
	}
	if c.LeaseRenew.Duration <= 0 || c.LeaseDuration.Duration <= c.LeaseRenew.Duration {
		return vgpu.InvalidField("leaseRenew", c.LeaseRenew.Duration.String(), fmt.Sprintf("must be above 0 and below leaseDuration (%s)", c.LeaseDuration.Duration))
	}
	if !handoff.ValidEnforcement(c.Enforcement.Enforcement) {
		return vgpu.InvalidField("enforcement", c.Enforcement.Enforcement, "must be auto, driver, hami-core, mps or none")
	}
	return nil
}

// LoadConfigFile reads a YAML or JSON file of Config fields over base:
// fields the file leaves out keep base's values. Unknown fields are errors.
// It does not validate the result.
func LoadConfigFile(path string, base Config) (Config, error) {
	return configfile.Load(path, base)
}
