package inspect

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Keys of the chart's scheduler ConfigMap.
const (
	schedulerConfigKey = "scheduler-config.yaml"
	extenderConfigKey  = "extender.yaml"
)

// defaultSchedulerName is the profile the chart and the webhook use unless
// configured otherwise.
const defaultSchedulerName = "gpuslice-scheduler"

// schedulerFile is the part of a KubeSchedulerConfiguration doctor reads
// (the typed one lives in k8s.io/component-base, a module this tool does
// not otherwise need).
type schedulerFile struct {
	LeaderElection struct {
		LeaderElect       *bool  `json:"leaderElect"`
		ResourceNamespace string `json:"resourceNamespace"`
		ResourceName      string `json:"resourceName"`
	} `json:"leaderElection"`
	Profiles []struct {
		SchedulerName string `json:"schedulerName"`
	} `json:"profiles"`
	Extenders []struct {
		URLPrefix  string `json:"urlPrefix"`
		FilterVerb string `json:"filterVerb"`
		BindVerb   string `json:"bindVerb"`
	} `json:"extenders"`
}

// extenderFile is the part of the extender's configuration why reads:
// the settings that change its verdicts.
type extenderFile struct {
	NodePolicy      vgpu.Policy `json:"nodePolicy"`
	GPUPolicy       vgpu.Policy `json:"gpuPolicy"`
	HeartbeatMaxAge string      `json:"heartbeatMaxAge"`
}

// schedulerConfig is one scheduler ConfigMap, read.
type schedulerConfig struct {
	source string // "namespace/name" of the ConfigMap
	file   schedulerFile
	// leaderLease is "namespace/name" of the leader-election Lease; empty
	// without leader election.
	leaderLease string
	extender    extenderFile
}

func parseSchedulerConfig(cm *corev1.ConfigMap) (schedulerConfig, error) {
	sc := schedulerConfig{source: cm.Namespace + "/" + cm.Name}
	raw, ok := cm.Data[schedulerConfigKey]
	if !ok {
		return sc, fmt.Errorf("ConfigMap %s has no %s", sc.source, schedulerConfigKey)
	}
	if err := yaml.Unmarshal([]byte(raw), &sc.file); err != nil {
		return sc, fmt.Errorf("ConfigMap %s: %s: %w", sc.source, schedulerConfigKey, err)
	}
	if le := sc.file.LeaderElection; le.LeaderElect == nil || *le.LeaderElect {
		ns, name := le.ResourceNamespace, le.ResourceName
		if ns == "" {
			ns = "kube-system"
		}
		if name == "" {
			name = "kube-scheduler"
		}
		sc.leaderLease = ns + "/" + name
	}
	if raw, ok := cm.Data[extenderConfigKey]; ok {
		if err := yaml.Unmarshal([]byte(raw), &sc.extender); err != nil {
			return sc, fmt.Errorf("ConfigMap %s: %s: %w", sc.source, extenderConfigKey, err)
		}
	}
	return sc, nil
}

// schedulerNames returns the profiles of every scheduler ConfigMap that
// calls an extender; none means the default name.
func (s *Snapshot) schedulerNames() []string {
	var names []string
	for i := range s.ConfigMaps {
		sc, err := parseSchedulerConfig(&s.ConfigMaps[i])
		if err != nil || len(sc.file.Extenders) == 0 {
			continue
		}
		for _, p := range sc.file.Profiles {
			if p.SchedulerName != "" && p.SchedulerName != corev1.DefaultSchedulerName {
				names = append(names, p.SchedulerName)
			}
		}
	}
	if len(names) == 0 {
		names = []string{defaultSchedulerName}
	}
	return names
}

// clusterChecks checks the webhook, the scheduler and the pending GPU pods.
func (s *Snapshot) clusterChecks() []Check {
	checks := s.webhookChecks()
	checks = append(checks, s.schedulerChecks()...)
	return append(checks, s.pendingChecks()...)
}

func (s *Snapshot) webhookChecks() []Check {
	c := Check{Name: "webhook"}
	if len(s.Webhooks) == 0 {
		c.Result, c.Message = Fail, "no gpuslice MutatingWebhookConfiguration: GPU pods are neither checked nor steered to the gpuslice scheduler"
		c.Fix = "install the chart with its webhook (helm upgrade --install gpuslice charts/gpuslice -n gpuslice-system)"
		return []Check{c}
	}
	var checks []Check
	for _, cfg := range s.Webhooks {
		for _, w := range cfg.Webhooks {
			ref := w.ClientConfig.Service
			policy := "Fail"
			if w.FailurePolicy != nil {
				policy = string(*w.FailurePolicy)
			}
			checks = append(checks, Check{Name: "webhook", Result: Pass, Message: fmt.Sprintf("MutatingWebhookConfiguration %s: webhook %s, failurePolicy %s", cfg.Name, w.Name, policy)})
			if ref == nil {
				continue
			}
			checks = append(checks, s.endpointCheck(ref.Namespace, ref.Name))
		}
	}
	if s.DryRun != nil {
		checks = append(checks, s.admissionCheck())
	}
	return checks
}

// endpointCheck counts the ready endpoints of Service namespace/name.
func (s *Snapshot) endpointCheck(namespace, name string) Check {
	c := Check{Name: "webhook-endpoints"}
	found := false
	for _, svc := range s.Services {
		found = found || svc.Namespace == namespace && svc.Name == name
	}
	deploy := fmt.Sprintf("kubectl -n %s get pods -l %s=%s and kubectl -n %s describe deployment %s", namespace, LabelComponent, ComponentWebhook, namespace, name)
	if !found {
		c.Result, c.Message = Fail, fmt.Sprintf("Service %s/%s of the webhook does not exist", namespace, name)
		c.Fix = "reinstall the chart (helm upgrade --install) so its webhook Service comes back"
		return c
	}
	ready := 0
	for _, es := range s.EndpointSlices {
		if es.Namespace != namespace {
			continue
		}
		for _, e := range es.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				ready += len(e.Addresses)
			}
		}
	}
	if ready == 0 {
		c.Result, c.Message = Fail, fmt.Sprintf("Service %s/%s has no ready endpoint: no webhook pod is serving", namespace, name)
		c.Fix = deploy
		return c
	}
	c.Result, c.Message = Pass, fmt.Sprintf("Service %s/%s has %s", namespace, name, count(ready, "ready endpoint"))
	return c
}

// admissionCheck reads the dry-run pod: admitted and steered to a gpuslice
// profile.
func (s *Snapshot) admissionCheck() Check {
	c := Check{Name: "webhook-admission"}
	d := s.DryRun
	names := s.schedulerNames()
	logs := "read the webhook's log: kubectl -n <namespace> logs -l " + LabelComponent + "=" + ComponentWebhook
	if len(s.Webhooks) > 0 && len(s.Webhooks[0].Webhooks) > 0 && s.Webhooks[0].Webhooks[0].ClientConfig.Service != nil {
		ref := s.Webhooks[0].Webhooks[0].ClientConfig.Service
		logs = fmt.Sprintf("read the webhook's log: kubectl -n %s logs deployment/%s", ref.Namespace, ref.Name)
	}
	switch {
	case d.Forbidden:
		c.Result = Warn
		c.Message = fmt.Sprintf("cannot try a dry-run GPU pod in namespace %s: %s", d.Namespace, d.Err)
		c.Fix = "run doctor as a user who may create pods there, or name another namespace with -n"
	case d.Err != "":
		c.Result = Fail
		c.Message = fmt.Sprintf("the API server refused a dry-run GPU pod in namespace %s: %s", d.Namespace, d.Err)
		c.Fix = "the webhook is down or unreachable, and with failurePolicy Fail no GPU pod can be created until it answers: " + logs
	case d.Pod == nil:
		c.Result, c.Message = Warn, "no dry-run answer"
	case !slices.Contains(names, d.Pod.Spec.SchedulerName):
		c.Result = Fail
		c.Message = fmt.Sprintf("a dry-run GPU pod in namespace %s came back with schedulerName %q, not %s: the webhook did not mutate it", d.Namespace, d.Pod.Spec.SchedulerName, strings.Join(names, " or "))
		c.Fix = "with failurePolicy Ignore an unreachable webhook lets GPU pods through unchecked; " + logs + " (or the namespace is excluded by webhook.excludeNamespaces)"
	default:
		c.Result, c.Message = Pass, fmt.Sprintf("a dry-run GPU pod in namespace %s is admitted and steered to scheduler %s", d.Namespace, d.Pod.Spec.SchedulerName)
	}
	return c
}

func (s *Snapshot) schedulerChecks() []Check {
	var checks []Check
	for i := range s.ConfigMaps {
		sc, err := parseSchedulerConfig(&s.ConfigMaps[i])
		if err != nil {
			checks = append(checks, Check{Name: "scheduler-profile", Result: Fail, Message: err.Error(), Fix: "reinstall the chart (helm upgrade --install) so it rewrites the ConfigMap"})
			continue
		}
		checks = append(checks, profileCheck(sc))
		if sc.leaderLease != "" {
			checks = append(checks, s.leaderCheck(sc))
		}
	}
	if len(checks) == 0 {
		// Without the chart's scheduler the profile may still exist (a
		// scheduler configured by hand); the pending-pod and extender lines
		// then tell whether it works.
		return []Check{{Name: "scheduler-profile", Result: Warn,
			Message: "no gpuslice scheduler ConfigMap, so no profile to check: the chart's scheduler is disabled or gpuslice was installed otherwise",
			Fix:     "unless a kube-scheduler profile of your own calls the gpuslice extender, install the chart with scheduler.enabled=true"}}
	}
	return checks
}

func profileCheck(sc schedulerConfig) Check {
	c := Check{Name: "scheduler-profile"}
	var profiles []string
	for _, p := range sc.file.Profiles {
		profiles = append(profiles, p.SchedulerName)
	}
	for _, e := range sc.file.Extenders {
		if e.FilterVerb != "" && e.BindVerb != "" {
			c.Result = Pass
			c.Message = fmt.Sprintf("ConfigMap %s: profile %s calls the extender at %s (%s, %s)", sc.source, strings.Join(profiles, ","), e.URLPrefix, e.FilterVerb, e.BindVerb)
			return c
		}
	}
	c.Result, c.Message = Fail, fmt.Sprintf("ConfigMap %s: no extender with filterVerb and bindVerb: the extender neither filters nor binds GPU pods", sc.source)
	c.Fix = "reinstall the chart (helm upgrade --install) so it rewrites the ConfigMap"
	return c
}

// leaderCheck reads the gpuslice kube-scheduler's leader Lease.
func (s *Snapshot) leaderCheck(sc schedulerConfig) Check {
	c := Check{Name: "scheduler-leader"}
	ns, name, _ := strings.Cut(sc.leaderLease, "/")
	fix := fmt.Sprintf("kubectl -n %s get pods -l %s=%s; read kube-scheduler's log (kubectl -n %s logs deployment/%s -c kube-scheduler)", ns, LabelComponent, ComponentScheduler, ns, name)
	l, ok := s.SchedulerLeases[sc.leaderLease]
	if !ok || l.Spec.RenewTime == nil {
		c.Result, c.Message, c.Fix = Fail, "no leader Lease "+sc.leaderLease+": the gpuslice kube-scheduler is not running", fix
		return c
	}
	duration := 15 * time.Second
	if d := l.Spec.LeaseDurationSeconds; d != nil {
		duration = time.Duration(*d) * time.Second
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	age := s.Now.Sub(l.Spec.RenewTime.Time).Round(time.Second)
	if age > duration {
		c.Result = Fail
		c.Message = fmt.Sprintf("leader Lease %s renewed %s ago, longer than its %s duration: the gpuslice kube-scheduler is not running", sc.leaderLease, age, duration)
		c.Fix = fix
		return c
	}
	c.Result, c.Message = Pass, fmt.Sprintf("kube-scheduler leader %s renewed Lease %s %s ago", holder, sc.leaderLease, max(age, 0))
	return c
}
