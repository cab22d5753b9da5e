package handoff

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuslice/gpuslice/vgpu"
)

// The environment of the driver-native and MPS mechanisms.
const (
	// EnvGPUMemoryRequest and EnvGPUMemoryLimit are read by the NVIDIA
	// container toolkit's CDI hook (nvidia-cdi-hook
	// apply-cuda-memory-limits), which sets them as the container cgroup's
	// soft and hard GPU memory limits through NVML, in MiB, for each of its
	// GPUs. Both are required by the hook.
	EnvGPUMemoryRequest = "NVIDIA_GPU_MEMORY_REQUEST"
	EnvGPUMemoryLimit   = "NVIDIA_GPU_MEMORY_LIMIT"
	// EnvMPSPipeDirectory is the folder of the MPS control daemon's pipes;
	// a CUDA client connects to the daemon found there.
	EnvMPSPipeDirectory = "CUDA_MPS_PIPE_DIRECTORY"
	// EnvMPSPinnedMemoryLimit is the client's device memory limit:
	// "<device ordinal>=<MiB>M".
	EnvMPSPinnedMemoryLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	// EnvMPSActiveThreadPercentage is the share of the GPU's threads the
	// client may use, in percent; set only when the slice reserves cores.
	EnvMPSActiveThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// Enforcement settings of Config.
const (
	// EnforcementAuto is the default Config.Enforcement: the strongest
	// mechanism the node qualifies for that is not disabled.
	EnforcementAuto = "auto"
	// DriverHookDetect is the default EnforcementConfig.DriverHook: the
	// node qualifies for driver only when the toolkit's CDI specs run
	// MemoryLimitHook for every GPU (NodeFacts.DriverHook).
	DriverHookDetect = "detect"
	// DriverHookAssume takes the operator's word that the hook runs (for a
	// runtime that applies the toolkit's edits some other way); the node's
	// driver mechanism is then reported unverified.
	DriverHookAssume = "assume"
	// DefaultMPSControl is the MPS control binary, looked up in PATH.
	DefaultMPSControl = "nvidia-cuda-mps-control"
	// DefaultMPSDir is the host folder of the MPS daemons' pipes and logs.
	DefaultMPSDir = "/run/gpuslice/mps"
	// MPSShmContainerPath is where an MPS client container gets the shared
	// memory folder of the daemons (<MPSDir>/shm): MPS servers and clients
	// share memory through /dev/shm, and the plugin's DaemonSet mounts the
	// same folder at its own /dev/shm.
	MPSShmContainerPath = "/dev/shm"
	// MinDriverMajorForMemoryLimits is the first NVIDIA driver branch
	// whose NVML sets per-cgroup GPU memory limits (R615).
	MinDriverMajorForMemoryLimits = 615
	// ReasonEnforced is the reason of the Normal event that names the
	// mechanism guarding a container, recorded on every start.
	ReasonEnforced = "GPUEnforcement"
)

// DefaultNVIDIACDISpecs are where the NVIDIA container toolkit writes its
// CDI specs (nvidia-ctk cdi generate, or its systemd unit).
func DefaultNVIDIACDISpecs() []string {
	return []string{"/etc/cdi/nvidia*.yaml", "/etc/cdi/nvidia*.json", "/var/run/cdi/nvidia*.yaml", "/var/run/cdi/nvidia*.json"}
}

// NodeFacts are what the node offers for enforcement, detected at start
// (DetectNodeFacts, or fake GPUs). The zero value offers nothing.
type NodeFacts struct {
	// DriverVersion is the NVIDIA driver's version, e.g. "615.20"; empty
	// when unknown.
	DriverVersion string
	// CgroupVersion is 1 or 2; 0 when unknown.
	CgroupVersion int
	// MPSControl is the path of nvidia-cuda-mps-control; empty when the
	// node has none.
	MPSControl string
	// DriverHook is what the NVIDIA toolkit's CDI specs offer the GPUs
	// (DetectDriverHook); the zero value offers no hook.
	DriverHook DriverHook
}

// DetectNodeFacts reads the node: the cgroup version from the file system
// mounted at cgroupRoot (cgroup v2 has cgroup.controllers at its root),
// and mpsControl (a path, or a name looked up in PATH). driverVersion is
// the driver's, as NVML reports it. Missing things are left empty; it
// never fails.
func DetectNodeFacts(driverVersion, cgroupRoot, mpsControl string) NodeFacts {
	f := NodeFacts{DriverVersion: driverVersion, CgroupVersion: CgroupVersion(cgroupRoot)}
	if mpsControl != "" {
		if p, err := exec.LookPath(mpsControl); err == nil {
			f.MPSControl = p
		}
	}
	return f
}

// CgroupVersion returns 2 when root is the root of a cgroup v2 file system,
// 1 when root exists without it (cgroup v1's tmpfs of controllers), and 0
// when root cannot be read.
func CgroupVersion(root string) int {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return 2
	}
	if _, err := os.Stat(root); err == nil {
		return 1
	}
	return 0
}

// driverMajor returns the branch of a driver version ("615.20.01" → 615).
func driverMajor(version string) (int, bool) {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	return n, err == nil
}

// EnforcementConfig are the node agent's enforcement settings.
type EnforcementConfig struct {
	// Enforcement is EnforcementAuto or a vgpu.Enforcement to force.
	Enforcement string
	// DisabledEnforcement lists mechanisms auto must not pick.
	DisabledEnforcement []string
	// HostLibVGPU is the host path of HAMi-core's libvgpu.so; empty: none.
	HostLibVGPU string
	// MPSControl is the configured MPS control binary, named in errors.
	MPSControl string
	// DriverHook says how the node learns that the toolkit's memory-limit
	// hook runs: DriverHookDetect (or empty) from NodeFacts.DriverHook,
	// DriverHookAssume on the operator's word.
	DriverHook string
}

// DriverQualification says whether a node qualifies for the driver
// mechanism (QualifyDriver).
type DriverQualification struct {
	// Qualifies says the node may use driver.
	Qualifies bool
	// Unverified says it qualifies on the operator's word
	// (DriverHookAssume) with no CDI spec showing the hook.
	Unverified bool
	// Reason says, for a person, why it does not qualify, or why it is
	// unverified; empty when it qualifies and the hook was found.
	Reason string
}

// QualifyDriver says whether a node with facts f and configuration cfg
// qualifies for the driver mechanism: a driver of R615 or later, cgroup
// v2, and the toolkit's memory-limit hook for every GPU, found in its CDI
// specs (f.DriverHook) or assumed (cfg.DriverHook DriverHookAssume). Pure.
func QualifyDriver(cfg EnforcementConfig, f NodeFacts) DriverQualification {
	major, ok := driverMajor(f.DriverVersion)
	switch {
	case !ok:
		return DriverQualification{Reason: fmt.Sprintf("the NVIDIA driver version %q is unknown; driver needs R%d or later", f.DriverVersion, MinDriverMajorForMemoryLimits)}
	case major < MinDriverMajorForMemoryLimits:
		return DriverQualification{Reason: fmt.Sprintf("the NVIDIA driver %s is older than R%d", f.DriverVersion, MinDriverMajorForMemoryLimits)}
	case f.CgroupVersion != 2:
		return DriverQualification{Reason: fmt.Sprintf("the node runs cgroup v%d; driver needs cgroup v2", f.CgroupVersion)}
	}
	return qualifyDriverHook(cfg, f)
}

// qualifyDriverHook is QualifyDriver's answer about the hook alone.
func qualifyDriverHook(cfg EnforcementConfig, f NodeFacts) DriverQualification {
	if f.DriverHook.Found {
		return DriverQualification{Qualifies: true}
	}
	missing := f.DriverHook.Missing
	if missing == "" {
		missing = "the NVIDIA container toolkit CDI specs were not checked"
	}
	if cfg.DriverHook == DriverHookAssume {
		return DriverQualification{Qualifies: true, Unverified: true, Reason: "unverified: " + missing + "; enforcementDriverHook=assume takes the memory-limit hook on the operator's word"}
	}
	return DriverQualification{Reason: missing + ", so nothing applies the driver's memory limit (enforcementDriverHook=assume takes the operator's word that the runtime runs it)"}
}

// ValidDriverHook reports whether s is an EnforcementConfig.DriverHook
// value: empty, DriverHookDetect or DriverHookAssume.
func ValidDriverHook(s string) bool {
	return s == "" || s == DriverHookDetect || s == DriverHookAssume
}

// QualifiedEnforcements returns the mechanisms a node with facts f and
// configuration cfg can use, from the strongest, always ending with
// vgpu.EnforcementNone: driver when QualifyDriver says so, hami-core when
// cfg.HostLibVGPU is set, mps when the MPS control binary was found. Pure.
func QualifiedEnforcements(cfg EnforcementConfig, f NodeFacts) []vgpu.Enforcement {
	var out []vgpu.Enforcement
	if QualifyDriver(cfg, f).Qualifies {
		out = append(out, vgpu.EnforcementDriver)
	}
	if cfg.HostLibVGPU != "" {
		out = append(out, vgpu.EnforcementHAMiCore)
	}
	if f.MPSControl != "" {
		out = append(out, vgpu.EnforcementMPS)
	}
	return append(out, vgpu.EnforcementNone)
}

var (
	// ErrMPSUnavailable means enforcement mps was forced on a node without
	// the MPS control binary.
	ErrMPSUnavailable = errors.New("enforcement=mps: the MPS control binary was not found")
	// ErrDriverHookMissing means enforcement driver was forced on a node
	// whose NVIDIA toolkit CDI specs do not run the memory-limit hook, with
	// enforcementDriverHook other than assume.
	ErrDriverHookMissing = errors.New("enforcement=driver: nothing applies the driver's memory limit")
)

// ChooseEnforcement returns the node's mechanism: the forced one
// (cfg.Enforcement other than auto), or the first of
// QualifiedEnforcements that cfg.DisabledEnforcement does not list. A
// forced mps needs the MPS binary (ErrMPSUnavailable) and a forced driver
// the memory-limit hook, found or assumed (ErrDriverHookMissing); the
// driver version and cgroup of a forced driver are taken on the
// operator's word (qualified says whether detection agrees).
func ChooseEnforcement(cfg EnforcementConfig, f NodeFacts) (e vgpu.Enforcement, qualified bool, err error) {
	all := QualifiedEnforcements(cfg, f)
	if cfg.Enforcement != EnforcementAuto {
		e = vgpu.Enforcement(cfg.Enforcement)
		if e == vgpu.EnforcementMPS && f.MPSControl == "" {
			return "", false, fmt.Errorf("%w (mpsControl=%q)", ErrMPSUnavailable, cfg.MPSControl)
		}
		if h := qualifyDriverHook(cfg, f); e == vgpu.EnforcementDriver && !h.Qualifies {
			return "", false, fmt.Errorf("%w: %s", ErrDriverHookMissing, h.Reason)
		}
		return e, slices.Contains(all, e), nil
	}
	for _, e := range all {
		if !slices.Contains(cfg.DisabledEnforcement, string(e)) {
			return e, true, nil
		}
	}
	return vgpu.EnforcementNone, true, nil
}

// ValidEnforcement reports whether s is a Config.Enforcement value.
func ValidEnforcement(s string) bool {
	if s == EnforcementAuto {
		return true
	}
	_, err := vgpu.ParseEnforcement(s)
	return err == nil
}

// enforcementEdits adds to e what mechanism mech gives container ca on
// this node; it reports whether the container is guarded. The HAMi-core
// variables are always set (an image may bring its own libvgpu.so); the
// library is mounted only with hami-core. MPS guards containers on one
// GPU.
func (a *Builder) enforcementEdits(e *Edits, ca vgpu.ContainerAllocation, gpus []vgpu.GPU) bool {
	mech := a.Enforcement
	if !vgpu.GuardsContainer(mech, len(ca.GPUs)) {
		return false
	}
	switch mech {
	case vgpu.EnforcementDriver:
		mib := strconv.FormatInt(MinMemoryMiB(ca), 10)
		e.Env = append(e.Env, EnvVar{EnvGPUMemoryRequest, mib}, EnvVar{EnvGPUMemoryLimit, mib})
	case vgpu.EnforcementHAMiCore:
		e.Mounts = append(e.Mounts,
			HostMount{HostPath: a.HostLibVGPU, ContainerPath: LibVGPUContainerPath},
			HostMount{HostPath: filepath.Join(a.StateDir, PreloadFileName), ContainerPath: PreloadContainerPath},
		)
	case vgpu.EnforcementMPS:
		if len(ca.GPUs) == 0 {
			return true
		}
		s := ca.GPUs[0]
		pipe := MPSPipeDir(a.MPSDir, gpus[0].Index)
		e.Env = append(e.Env,
			EnvVar{EnvMPSPipeDirectory, pipe},
			EnvVar{EnvMPSPinnedMemoryLimit, "0=" + strconv.FormatInt(s.MemoryMiB, 10) + "M"},
		)
		if s.CoresPercent > 0 && s.CoresPercent < vgpu.MaxPercent {
			e.Env = append(e.Env, EnvVar{EnvMPSActiveThreadPercentage, strconv.Itoa(s.CoresPercent)})
		}
		e.Mounts = append(e.Mounts,
			HostMount{HostPath: pipe, ContainerPath: pipe, Writable: true},
			HostMount{HostPath: MPSShmDir(a.MPSDir), ContainerPath: MPSShmContainerPath, Writable: true},
		)
	}
	return true
}

// MinMemoryMiB is the smallest slice of ca: the driver's hook applies one
// limit to all of a container's GPUs, so no GPU gets more than its slice.
func MinMemoryMiB(ca vgpu.ContainerAllocation) int64 {
	var m int64
	for i, s := range ca.GPUs {
		if i == 0 || s.MemoryMiB < m {
			m = s.MemoryMiB
		}
	}
	return m
}
