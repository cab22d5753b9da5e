package extender

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuslice/gpuslice/internal/configfile"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Defaults for Config, and the limits Validate enforces.
const (
	// DefaultAddress listens on the loopback address only: the extender
	// runs as a sidecar of the kube-scheduler that calls it (the chart's
	// setup), so nothing outside the pod can reach /bind.
	DefaultAddress = "127.0.0.1:8888"
	// DefaultHeartbeatMaxAge is HeartbeatMaxAge's default,
	// vgpu.DefaultHeartbeatMaxAge, which gpuslice why assumes too.
	DefaultHeartbeatMaxAge = vgpu.DefaultHeartbeatMaxAge
	// DefaultBindTimeout leaves room inside a kube-scheduler httpTimeout of
	// 10 s (see docs/extender.md) for the request itself.
	DefaultBindTimeout = 5 * time.Second
	// MaxBindTimeout bounds BindTimeout: kube-scheduler's httpTimeout caps
	// how long it waits anyway.
	MaxBindTimeout = 5 * time.Minute
	// DefaultBindOutcomeWait is kube-apiserver's default --request-timeout
	// (1 m), after which it no longer works on a request, plus 30 s for a
	// write it had already handed to etcd to be committed or dropped
	// (etcd's leader election takes about a second at its defaults).
	DefaultBindOutcomeWait = 90 * time.Second
	// MaxBindOutcomeWait bounds BindOutcomeWait: a pod whose Binding is
	// in doubt waits that long for its GPUs at most.
	MaxBindOutcomeWait = time.Hour
	// DefaultKubeAPIQPS and DefaultKubeAPIBurst are the extender's API
	// client rate limit. A bind is one request, so this matches a
	// kube-scheduler whose clientConnection allows as much.
	DefaultKubeAPIQPS   = 100
	DefaultKubeAPIBurst = 200
	// DefaultGCPercent is the extender's Go garbage-collection target
	// (GOGC): a collection starts when the heap has grown by this share
	// over what the last one kept. Go's default of 100 lets the heap
	// reach twice the live objects; the extender's live heap is its
	// caches, which change slowly, so half that costs little CPU (at
	// 5,000 nodes 0.3 ms more per GPU pod, 4.0 against 3.7 ms) and keeps
	// its memory near them (147 against 175 MiB; docs/configuration.md).
	DefaultGCPercent = 50
	// MaxRequestBytes bounds a request body: a Filter call without
	// nodeCacheCapable carries every candidate Node in full.
	MaxRequestBytes = 16 << 20
)

// Config is the scheduler extender's configuration. Zero fields take the
// defaults of DefaultConfig when read from a file; call Validate before use
// (New does).
type Config struct {
	// Address is the host:port the HTTP(S) server listens on; an empty host
	// means every interface. A host other than a loopback address
	// (127.0.0.0/8, ::1, localhost) requires ClientCAFile and
	// AllowedClientNames: the API binds pods, so it is never served beyond
	// the pod without client certificates.
	Address string `json:"address"`
	// HealthAddress, when set, is a second host:port serving only /healthz,
	// /readyz and /metrics over plain HTTP, for kubelet probes and
	// Prometheus while Address stays on loopback or behind client
	// certificates. Empty serves them on Address only.
	HealthAddress string `json:"healthAddress,omitempty"`
	// TLSCertFile is the PEM serving certificate (leaf first). Empty serves
	// plain HTTP. When set, TLSKeyFile must be set too, and the pair is
	// read again whenever either file changes.
	TLSCertFile string `json:"tlsCertFile,omitempty"`
	// TLSKeyFile is the PEM private key of TLSCertFile.
	TLSKeyFile string `json:"tlsKeyFile,omitempty"`
	// ClientCAFile, when set, is a PEM bundle of the CAs whose client
	// certificates may call /filter, /prioritize and /bind (kube-scheduler's
	// extender tlsConfig certFile and keyFile), when their subject is in
	// AllowedClientNames; other callers get 403. /healthz and /readyz stay
	// open for probes. Requires TLSCertFile and AllowedClientNames. Read
	// once at start.
	ClientCAFile string `json:"clientCAFile,omitempty"`
	// AllowedClientNames are the client certificate subjects that may call
	// the API: a verified certificate passes when its subject common name
	// or one of its DNS names is listed. Required with ClientCAFile, so
	// that a CA shared with other clients does not let all of them bind.
	AllowedClientNames []string `json:"allowedClientNames,omitempty"`
	// NodePolicy ranks nodes for pods that set no hami.io/node-policy:
	// binpack, spread or fragmentation.
	NodePolicy vgpu.Policy `json:"nodePolicy"`
	// GPUPolicy chooses GPUs inside a node for pods that set no
	// hami.io/gpu-policy: binpack, spread or fragmentation.
	GPUPolicy vgpu.Policy `json:"gpuPolicy"`
	// HeartbeatMaxAge is how old the device plugin's heartbeat Lease
	// renewTime may be before its node counts as "plugin not ready".
	HeartbeatMaxAge metav1.Duration `json:"heartbeatMaxAge"`
	// HeartbeatNamespace is where the device plugins keep their heartbeat
	// Leases; it must match the plugins' heartbeatNamespace.
	HeartbeatNamespace string `json:"heartbeatNamespace"`
	// ResourceName is the extended resource the device plugins register;
	// a node whose allocatable lacks it (or has 0) is "plugin not ready".
	ResourceName string `json:"resourceName"`
	// BindTimeout bounds one Bind call's API requests (read the pod, write
	// the allocation, post the Binding). Keep it below the httpTimeout of
	// kube-scheduler's extender configuration.
	BindTimeout metav1.Duration `json:"bindTimeout"`
	// BindOutcomeWait is how long after a Binding whose outcome is unknown
	// (a timeout, a lost reply, a 5xx) its pod keeps the GPUs reserved
	// while the API server shows it unbound: the API server may still
	// commit the Binding until its own request deadline has passed. Set it
	// above kube-apiserver's --request-timeout, at least BindTimeout.
	BindOutcomeWait metav1.Duration `json:"bindOutcomeWait"`
	// KubeAPIQPS and KubeAPIBurst are the API client's sustained rate and
	// burst, in requests per second. Bind makes one request per pod; size
	// them at least as large as kube-scheduler's clientConnection qps and
	// burst, so that binding never limits scheduling.
	KubeAPIQPS   float32 `json:"kubeAPIQPS"`
	KubeAPIBurst int     `json:"kubeAPIBurst"`
	// MaxPendingBinds is how many binds may wait for the API client at
	// once; one more is refused at once with "extender overloaded" and
	// kube-scheduler retries the pod after its back-off, instead of every
	// bind waiting out BindTimeout. 0 means what the client can send in
	// half of BindTimeout (KubeAPIQPS × BindTimeout / 2, at least
	// KubeAPIBurst).
	MaxPendingBinds int `json:"maxPendingBinds"`
	// GCPercent is the Go garbage collector's target (GOGC) the extender
	// runs with, 10 to 1000; the GOGC environment variable, when set,
	// wins.
	GCPercent int `json:"gcPercent"`
	// PercentageOfNodesToScore is the percentageOfNodesToScore of the
	// kube-scheduler profile that calls the extender (0: kube-scheduler's
	// adaptive share). It tells the extender when the nodes it is sent are
	// a sample, so that a pod none of them has room for is retried when
	// another node has.
	PercentageOfNodesToScore int `json:"percentageOfNodesToScore"`
	// FilterResult is which nodes Filter passes for a pod that asks for GPUs: FilterResultBest
	// (the default) or FilterResultFeasible.
	FilterResult FilterResult `json:"filterResult"`
	// Workload is what the fragmentation policy measures free GPU
	// capacity against: WorkloadOnline (the default) learns it from the
	// pods the extender sees, as gpuslice simulate does; WorkloadDefault
	// is vgpu.DefaultWorkload whatever the cluster runs.
	Workload WorkloadSource `json:"workload"`
	// WorkloadHalfLife is how many pods later a pod counts half as much
	// in the online workload, so that it follows a cluster whose mix
	// changes.
	WorkloadHalfLife int `json:"workloadHalfLife"`
	// LeaderLease is kube-scheduler's leader-election Lease, as
	// "namespace/name" (its leaderElection resourceNamespace and
	// resourceName), which this extender follows: only while the Lease
	// names the kube-scheduler beside it (same host name) does it ask
	// kube-scheduler to retry pods and maintain the nodes'
	// vgpu.ConditionRegistered (Unknown when a plugin's heartbeat goes
	// stale, False when allocatable stays 0). Empty: it always does (a
	// single replica without leader election).
	LeaderLease string `json:"leaderLease,omitempty"`
	// DRA turns on the scoring of pods whose claims ask for gpuslice's DRA devices
	// (Scheduler.PrioritizeDRA, POST /dra/prioritize): the extender then also watches
	// ResourceSlices of the gpuslice driver, ResourceClaims and DeviceClasses
	// (resource.k8s.io/v1), which the cluster must serve.
	DRA bool `json:"dra,omitempty"`
}

// FilterResult is which of the nodes where a GPU pod fits Filter passes on to kube-scheduler.
type FilterResult string

const (
	// FilterResultBest passes only the nodes of the best node-policy
	// score (vgpu.Score, compared by NodeScore.Compare: its Value 0..100,
	// then its Raw measure and Tie, as gpuslice simulate picks a node),
	// every node that ties it. kube-scheduler's own score plugins choose
	// among them, and its profile needs no prioritizeVerb: one HTTP round
	// trip per pod instead of two.
	FilterResultBest FilterResult = "best"
	// FilterResultFeasible passes every node where the pod fits; the profile's prioritizeVerb
	// scores them (0..10) and kube-scheduler adds its own plugins' scores to choose.
	FilterResultFeasible FilterResult = "feasible"
)

// pendingBinds is MaxPendingBinds with 0 resolved.
func (c Config) pendingBinds() int {
	if c.MaxPendingBinds > 0 {
		return c.MaxPendingBinds
	}
	return max(int(float64(c.KubeAPIQPS)*c.BindTimeout.Seconds()/2), c.KubeAPIBurst, 1)
}

// DefaultConfig returns the configuration used when nothing is set: plain
// HTTP on DefaultAddress (loopback only), binpack for nodes and GPUs.
func DefaultConfig() Config {
	return Config{
		Address:            DefaultAddress,
		NodePolicy:         vgpu.PolicyBinpack,
		GPUPolicy:          vgpu.PolicyBinpack,
		HeartbeatMaxAge:    metav1.Duration{Duration: DefaultHeartbeatMaxAge},
		HeartbeatNamespace: vgpu.DefaultHeartbeatNamespace,
		ResourceName:       string(vgpu.ResourceGPU),
		BindTimeout:        metav1.Duration{Duration: DefaultBindTimeout},
		BindOutcomeWait:    metav1.Duration{Duration: DefaultBindOutcomeWait},
		KubeAPIQPS:         DefaultKubeAPIQPS,
		KubeAPIBurst:       DefaultKubeAPIBurst,
		GCPercent:          DefaultGCPercent,
		FilterResult:       FilterResultBest,
		Workload:           WorkloadOnline,
		WorkloadHalfLife:   DefaultWorkloadHalfLife,
	}
}

// LoadConfigFile reads a YAML or JSON file of Config fields over base:
// fields the file leaves out keep base's values. Unknown fields are errors,
// so a misspelt key is reported rather than ignored. It does not validate.
func LoadConfigFile(path string, base Config) (Config, error) {
	return configfile.Load(path, base)
}

// Validate checks every field and returns every problem at once
// (errors.Join of *vgpu.FieldError), or nil. It does not read the
// certificate files: the server does when it starts.
func (c Config) Validate() error {
	var errs []error
	if err := validateAddress("address", c.Address); err != nil {
		errs = append(errs, err)
	}
	if c.HealthAddress != "" {
		if err := validateAddress("healthAddress", c.HealthAddress); err != nil {
			errs = append(errs, err)
		} else if c.HealthAddress == c.Address {
			errs = append(errs, vgpu.InvalidField("healthAddress", c.HealthAddress, "must differ from address (empty serves /healthz, /readyz and /metrics on address only)"))
		}
	}
	switch {
	case c.TLSCertFile != "" && c.TLSKeyFile == "":
		errs = append(errs, vgpu.InvalidField("tlsKeyFile", "", "required when tlsCertFile is set: the PEM private key of the serving certificate"))
	case c.TLSCertFile == "" && c.TLSKeyFile != "":
		errs = append(errs, vgpu.InvalidField("tlsCertFile", "", "required when tlsKeyFile is set: the PEM serving certificate"))
	}
	if c.ClientCAFile != "" && c.TLSCertFile == "" {
		errs = append(errs, vgpu.InvalidField("clientCAFile", c.ClientCAFile, "needs tlsCertFile and tlsKeyFile: client certificates are checked over HTTPS only"))
	}
	switch {
	case c.ClientCAFile != "" && len(c.AllowedClientNames) == 0:
		errs = append(errs, vgpu.InvalidField("allowedClientNames", "", "required with clientCAFile: the subject (common name or DNS name) of kube-scheduler's client certificate"))
	case c.ClientCAFile == "" && len(c.AllowedClientNames) > 0:
		errs = append(errs, vgpu.InvalidField("allowedClientNames", strings.Join(c.AllowedClientNames, ","), "needs clientCAFile: names are checked on verified client certificates only"))
	}
	for _, n := range c.AllowedClientNames {
		if strings.TrimSpace(n) == "" {
			errs = append(errs, vgpu.InvalidField("allowedClientNames", strings.Join(c.AllowedClientNames, ","), "entries must not be empty"))
			break
		}
	}
	if c.ClientCAFile == "" && !isLoopback(c.Address) {
		if _, ok := configfile.Port(c.Address); ok {
			errs = append(errs, vgpu.InvalidField("address", c.Address, "listens beyond the loopback address without client certificates, so anyone who reaches it could bind pods: "+
				"run the extender as a sidecar of kube-scheduler on "+DefaultAddress+" (recommended), or set clientCAFile and allowedClientNames"))
		}
	}
	allowedPolicy := "must be one of " + vgpu.PolicyList()
	if p, err := vgpu.ParsePolicy(string(c.NodePolicy)); err != nil || p == "" {
		errs = append(errs, vgpu.InvalidField("nodePolicy", string(c.NodePolicy), allowedPolicy))
	}
	if p, err := vgpu.ParsePolicy(string(c.GPUPolicy)); err != nil || p == "" {
		errs = append(errs, vgpu.InvalidField("gpuPolicy", string(c.GPUPolicy), allowedPolicy))
	}
	if c.LeaderLease != "" {
		ns, name, ok := strings.Cut(c.LeaderLease, "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			errs = append(errs, vgpu.InvalidField("leaderLease", c.LeaderLease, `must be empty (kube-scheduler runs no leader election) or "namespace/name" of kube-scheduler's leader-election Lease, e.g. "gpuslice-system/gpuslice-scheduler"`))
		}
	}
	if c.HeartbeatMaxAge.Duration < time.Second {
		errs = append(errs, vgpu.InvalidField("heartbeatMaxAge", c.HeartbeatMaxAge.String(), "must be a duration of at least 1s, longer than the device plugin's leaseRenew"))
	}
	if msgs := validation.IsDNS1123Label(c.HeartbeatNamespace); len(msgs) > 0 {
		errs = append(errs, vgpu.InvalidField("heartbeatNamespace", c.HeartbeatNamespace, "must be a namespace name (lower-case letters, digits and '-'), the device plugins' heartbeatNamespace"))
	}
	if !vgpu.IsExtendedResourceName(c.ResourceName) {
		errs = append(errs, vgpu.InvalidField("resourceName", c.ResourceName, "must be an extended resource name like hami.io/gpu (a domain outside kubernetes.io, a slash, a name)"))
	}
	minOutcomeWait := c.BindTimeout.Duration
	if d := c.BindTimeout.Duration; d < 100*time.Millisecond || d > MaxBindTimeout {
		errs = append(errs, vgpu.InvalidField("bindTimeout", c.BindTimeout.String(), "must be a duration from 100ms to "+MaxBindTimeout.String()+", below kube-scheduler's extender httpTimeout"))
		minOutcomeWait = 0 // reported once, as bindTimeout
	}
	if d := c.BindOutcomeWait.Duration; d < minOutcomeWait || d <= 0 || d > MaxBindOutcomeWait {
		errs = append(errs, vgpu.InvalidField("bindOutcomeWait", c.BindOutcomeWait.String(), "must be a duration from bindTimeout ("+c.BindTimeout.String()+") to "+MaxBindOutcomeWait.String()+", above kube-apiserver's --request-timeout (1m by default)"))
	}
	if !(c.KubeAPIQPS >= 1) || c.KubeAPIQPS > 100000 {
		errs = append(errs, vgpu.InvalidField("kubeAPIQPS", fmt.Sprint(c.KubeAPIQPS), "must be from 1 to 100000 requests per second"))
	}
	if c.KubeAPIBurst < 1 || c.KubeAPIBurst > 100000 {
		errs = append(errs, vgpu.InvalidField("kubeAPIBurst", fmt.Sprint(c.KubeAPIBurst), "must be from 1 to 100000 requests"))
	}
	if c.PercentageOfNodesToScore < 0 || c.PercentageOfNodesToScore > 100 {
		errs = append(errs, vgpu.InvalidField("percentageOfNodesToScore", fmt.Sprint(c.PercentageOfNodesToScore), "must be from 0 (kube-scheduler's adaptive share) to 100, the kube-scheduler profile's percentageOfNodesToScore"))
	}
	if c.MaxPendingBinds < 0 || c.MaxPendingBinds > 1000000 {
		errs = append(errs, vgpu.InvalidField("maxPendingBinds", fmt.Sprint(c.MaxPendingBinds), "must be from 0 (derived from kubeAPIQPS and bindTimeout) to 1000000"))
	}
	if c.GCPercent < 10 || c.GCPercent > 1000 {
		errs = append(errs, vgpu.InvalidField("gcPercent", fmt.Sprint(c.GCPercent), "must be from 10 to 1000 (the Go garbage collector's GOGC target, in percent)"))
	}
	if c.FilterResult != FilterResultBest && c.FilterResult != FilterResultFeasible {
		errs = append(errs, vgpu.InvalidField("filterResult", string(c.FilterResult), fmt.Sprintf("must be %q (only the nodes of the best score; the profile needs no prioritizeVerb) or %q (every node where the pod fits, scored by prioritizeVerb)", FilterResultBest, FilterResultFeasible)))
	}
	if c.Workload != WorkloadOnline && c.Workload != WorkloadDefault {
		errs = append(errs, vgpu.InvalidField("workload", string(c.Workload), fmt.Sprintf("must be %q (learnt from the pods the extender sees) or %q (vgpu's default workload)", WorkloadOnline, WorkloadDefault)))
	}
	if c.WorkloadHalfLife < 1 || c.WorkloadHalfLife > 10000000 {
		errs = append(errs, vgpu.InvalidField("workloadHalfLife", fmt.Sprint(c.WorkloadHalfLife), "must be from 1 to 10000000 pods"))
	}
	return errors.Join(errs...)
}

// isLoopback reports whether addr's host is a loopback address or
// localhost (an empty host is every interface).
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validateAddress returns a *vgpu.FieldError for field unless addr is
// host:port with a port from 0 to 65535 (0: any free port).
func validateAddress(field, addr string) error {
	const allowed = "must be host:port with a port from 0 to 65535, e.g. " + DefaultAddress
	if _, ok := configfile.Port(addr); !ok {
		return vgpu.InvalidField(field, addr, allowed)
	}
	return nil
}
