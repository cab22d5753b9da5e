package webhook

import (
	"errors"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuslice/gpuslice/vgpu"
)

// DefaultSchedulerName is the default Config.SchedulerName: the
// kube-scheduler profile that calls the gpuslice extender.
const DefaultSchedulerName = "gpuslice-scheduler"

// Config is the webhook's decision configuration, read by Mutate. Call
// Validate before use; Mutate calls it too.
type Config struct {
	// SchedulerName is written into spec.schedulerName of GPU pods that name
	// no scheduler or the stock one (corev1.DefaultSchedulerName, which the
	// API server fills in when the user names none). It must be a DNS-1123
	// subdomain and not corev1.DefaultSchedulerName.
	SchedulerName string `json:"schedulerName"`
	// ExcludedNamespaces are namespaces whose pods Mutate skips untouched,
	// so that system pods never wait on the webhook. Empty means none is
	// excluded. Each must be a namespace name (DNS-1123 label).
	ExcludedNamespaces []string `json:"excludedNamespaces,omitempty"`
	// HAMiCompat, when true, rewrites HAMi's resource names and pod
	// annotations (HAMiResources, HAMiAnnotations) to gpuslice's before
	// anything else, so that manifests written for HAMi run unchanged. Off
	// by default: nvidia.com/gpu is also NVIDIA's own device plugin's
	// resource. The webhook's match condition must then also send pods
	// with nvidia.com/ names (HAMiCompatMatchConditions).
	HAMiCompat bool `json:"hamiCompat,omitempty"`
	// DRA turns GPU pods bound for DRA-mode node pools into resource
	// claims (docs/dra.md). Off by default.
	DRA DRAConfig `json:"dra,omitempty"`
}

// DefaultConfig returns the configuration used when nothing is set: the
// gpuslice-scheduler profile, kube-system excluded.
func DefaultConfig() Config {
	return Config{
		SchedulerName:      DefaultSchedulerName,
		ExcludedNamespaces: []string{"kube-system"},
	}
}

// Validate checks every field and returns every problem at once
// (errors.Join of *vgpu.FieldError), or nil.
func (c Config) Validate() error {
	var errs []error
	switch {
	case c.SchedulerName == "":
		errs = append(errs, vgpu.InvalidField("schedulerName", "", "required: the scheduler profile that calls the gpuslice extender, e.g. "+DefaultSchedulerName))
	case c.SchedulerName == corev1.DefaultSchedulerName:
		errs = append(errs, vgpu.InvalidField("schedulerName", c.SchedulerName, "must not be the stock profile: GPU pods must reach the profile that calls the gpuslice extender"))
	case len(validation.IsDNS1123Subdomain(c.SchedulerName)) > 0:
		errs = append(errs, vgpu.InvalidField("schedulerName", c.SchedulerName, "must be a valid scheduler name ("+strings.Join(validation.IsDNS1123Subdomain(c.SchedulerName), "; ")+")"))
	}
	for _, ns := range c.ExcludedNamespaces {
		if len(validation.IsDNS1123Label(ns)) > 0 {
			errs = append(errs, vgpu.InvalidField("excludedNamespaces", ns, "each entry must be a namespace name (lower-case letters, digits and '-', at most 63)"))
		}
	}
	if c.DRA.DeviceClassName != "" && len(validation.IsDNS1123Subdomain(c.DRA.DeviceClassName)) > 0 {
		errs = append(errs, vgpu.InvalidField("dra.deviceClassName", c.DRA.DeviceClassName, "must be a DeviceClass name (DNS subdomain), e.g. "+DefaultDRADeviceClass))
	}
	for _, ns := range c.DRA.Namespaces {
		switch {
		case ns == "*" && len(c.DRA.Namespaces) > 1:
			errs = append(errs, vgpu.InvalidField("dra.namespaces", ns, `"*" (every namespace) must be the only entry`))
		case ns != "*" && len(validation.IsDNS1123Label(ns)) > 0:
			errs = append(errs, vgpu.InvalidField("dra.namespaces", ns, `each entry must be a namespace name (lower-case letters, digits and '-', at most 63) or "*" alone`))
		}
	}
	if len(c.DRA.Namespaces) > 0 && !c.DRA.Enabled {
		errs = append(errs, vgpu.InvalidField("dra.namespaces", strings.Join(c.DRA.Namespaces, ","), "needs dra.enabled: true"))
	}
	if c.DRA.Score && !c.DRA.Enabled {
		errs = append(errs, vgpu.InvalidField("dra.score", "true", "needs dra.enabled: true"))
	}
	if c.DRA.SteerClaims && !c.DRA.Score {
		errs = append(errs, vgpu.InvalidField("dra.steerClaims", "true", "needs dra.score: true (the profile's extender must score DRA pods)"))
	}
	return errors.Join(errs...)
}

// excluded reports whether Mutate skips pods of namespace ns.
func (c Config) excluded(ns string) bool {
	for _, e := range c.ExcludedNamespaces {
		if e == ns {
			return true
		}
	}
	return false
}
