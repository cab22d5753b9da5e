package monitoring

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// LabelComponent is the label of the chart's objects that names the component; a Pod's
// Component is matched against the selector of each Service by it.
const LabelComponent = "app.kubernetes.io/component"

// Pod is one running component that the chart's Services would select, as Kubernetes service
// discovery would report it.
type Pod struct {
	// Component is the chart's name of the component (LabelComponent): scheduler, device-plugin
	// or webhook.
	Component string
	// Name and Node are the pod's name and node; Node may be empty.
	Name, Node string
	// Address is host:port of the component's metrics port: what each Service's metrics port
	// resolves to for this pod.
	Address string
}

// ConfigOptions are the settings of the Prometheus configuration that are not the chart's.
type ConfigOptions struct {
	// ScrapeInterval, when set, replaces every endpoint's interval (the chart's 30s is slow for a
	// test); it is also the rules' evaluation interval. Zero keeps the endpoints' intervals and
	// evaluates every 30 s.
	ScrapeInterval time.Duration
	// RuleFiles are the rule files Prometheus loads.
	RuleFiles []string
}

// promConfig is the part of a Prometheus configuration file Config writes.
type promConfig struct {
	Global struct {
		ScrapeInterval     string `json:"scrape_interval"`
		ScrapeTimeout      string `json:"scrape_timeout"`
		EvaluationInterval string `json:"evaluation_interval"`
	} `json:"global"`
	RuleFiles     []string       `json:"rule_files,omitempty"`
	ScrapeConfigs []scrapeConfig `json:"scrape_configs"`
}

type scrapeConfig struct {
	JobName        string          `json:"job_name"`
	HonorLabels    bool            `json:"honor_labels,omitempty"`
	ScrapeInterval string          `json:"scrape_interval,omitempty"`
	ScrapeTimeout  string          `json:"scrape_timeout,omitempty"`
	MetricsPath    string          `json:"metrics_path,omitempty"`
	Scheme         string          `json:"scheme,omitempty"`
	TLSConfig      *tlsConfig      `json:"tls_config,omitempty"`
	StaticConfigs  []staticConfig  `json:"static_configs"`
	RelabelConfigs []relabelConfig `json:"relabel_configs"`
}

type tlsConfig struct {
	InsecureSkipVerify bool `json:"insecure_skip_verify"`
}

type staticConfig struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

type relabelConfig struct {
	SourceLabels []string `json:"source_labels,omitempty"`
	Separator    string   `json:"separator,omitempty"`
	TargetLabel  string   `json:"target_label,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// Config returns the Prometheus configuration (YAML) that scrapes pods as the chart's
// ServiceMonitors say: for each endpoint of each ServiceMonitor one job
// "serviceMonitor/<namespace>/<name>/<index>" with its path, scheme, TLS settings, honorLabels
// and interval, whose targets are every pod behind every port of every Service of the selected
// namespaces (the targets Kubernetes service discovery's endpoints role would list), labelled
// with that role's meta labels; its relabelings are the Operator's (keep the Services the
// selector matches and the port the endpoint names; set namespace, service, pod, container, job
// and endpoint), then the endpoint's own. Prometheus applies them, so a ServiceMonitor that
// selects nothing scrapes nothing. A pod's container is the container of the pod template
// (Deployment or DaemonSet) whose labels the Service selects that declares the port the Service
// targets. It is an error when a Service has more than one port (a Pod has one address), or a
// Service that a pod's component matches names a port no pod template declares.
func (c *Chart) Config(pods []Pod, opts ConfigOptions) ([]byte, error) {
	var cfg promConfig
	interval, timeout := "30s", "10s"
	if opts.ScrapeInterval > 0 {
		interval, timeout = model(opts.ScrapeInterval), model(min(opts.ScrapeInterval, 10*time.Second))
	}
	cfg.Global.ScrapeInterval, cfg.Global.ScrapeTimeout, cfg.Global.EvaluationInterval = interval, timeout, interval
	cfg.RuleFiles = opts.RuleFiles
	for _, sm := range c.ServiceMonitors {
		namespaces := sm.Spec.NamespaceSelector.MatchNames
		if len(namespaces) == 0 {
			namespaces = []string{sm.Namespace}
		}
		var targets []staticConfig
		for _, svc := range c.Services {
			if !slices.Contains(namespaces, svc.Namespace) {
				continue
			}
			t, err := c.serviceTargets(svc, pods)
			if err != nil {
				return nil, err
			}
			targets = append(targets, t...)
		}
		for i, ep := range sm.Spec.Endpoints {
			job := scrapeConfig{
				JobName:        jobName(sm, i),
				HonorLabels:    ep.HonorLabels,
				MetricsPath:    ep.Path,
				Scheme:         ep.Scheme,
				ScrapeInterval: ep.Interval,
				StaticConfigs:  targets,
			}
			if opts.ScrapeInterval > 0 {
				job.ScrapeInterval, job.ScrapeTimeout = interval, timeout
			}
			if ep.TLSConfig != nil {
				job.TLSConfig = &tlsConfig{InsecureSkipVerify: ep.TLSConfig.InsecureSkipVerify}
			}
			relabels, err := operatorRelabelings(sm, ep)
			if err != nil {
				return nil, err
			}
			job.RelabelConfigs = relabels
			if job.StaticConfigs == nil {
				job.StaticConfigs = []staticConfig{}
			}
			cfg.ScrapeConfigs = append(cfg.ScrapeConfigs, job)
		}
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encode Prometheus configuration: %w", err)
	}
	return b, nil
}

// model writes d as a Prometheus duration (whole milliseconds at most: 1s, 500ms, 1m30s).
func model(d time.Duration) string {
	if d%time.Second != 0 {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return fmt.Sprintf("%ds", int64(d/time.Second))
}

// serviceTargets returns the targets the endpoints role lists for svc: one per pod of a
// component the Service's selector matches, with the meta labels of the Service, its port, and
// the pod.
func (c *Chart) serviceTargets(svc corev1.Service, pods []Pod) ([]staticConfig, error) {
	selector := labels.SelectorFromSet(svc.Spec.Selector)
	var out []staticConfig
	for _, p := range pods {
		if len(svc.Spec.Selector) == 0 || svc.Spec.Selector[LabelComponent] != p.Component {
			continue
		}
		if len(svc.Spec.Ports) != 1 {
			return nil, fmt.Errorf("service %s/%s has %d ports: a pod of the local cluster has one metrics address", svc.Namespace, svc.Name, len(svc.Spec.Ports))
		}
		port := svc.Spec.Ports[0]
		container := ""
		for _, t := range c.PodTemplates {
			if !selector.Matches(labels.Set(t.Labels)) {
				continue
			}
			for _, ctr := range t.Spec.Containers {
				for _, cp := range ctr.Ports {
					if (port.TargetPort.StrVal != "" && cp.Name == port.TargetPort.StrVal) || (port.TargetPort.StrVal == "" && cp.ContainerPort == port.TargetPort.IntVal) {
						container = ctr.Name
					}
				}
			}
		}
		if container == "" {
			return nil, fmt.Errorf("service %s/%s: no pod template it selects declares its target port %s", svc.Namespace, svc.Name, port.TargetPort.String())
		}
		meta := map[string]string{
			"__meta_kubernetes_namespace":                    svc.Namespace,
			"__meta_kubernetes_service_name":                 svc.Name,
			"__meta_kubernetes_endpoint_port_name":           port.Name,
			"__meta_kubernetes_endpoint_address_target_kind": "Pod",
			"__meta_kubernetes_endpoint_address_target_name": p.Name,
			"__meta_kubernetes_pod_name":                     p.Name,
			"__meta_kubernetes_pod_container_name":           container,
			"__meta_kubernetes_pod_phase":                    string(corev1.PodRunning),
			"__meta_kubernetes_endpoint_ready":               "true",
			"__meta_kubernetes_pod_container_port_name":      port.TargetPort.String(),
		}
		if p.Node != "" {
			meta["__meta_kubernetes_pod_node_name"] = p.Node
		}
		for k, v := range svc.Labels {
			meta["__meta_kubernetes_service_label_"+sanitize(k)] = v
			meta["__meta_kubernetes_service_labelpresent_"+sanitize(k)] = "true"
		}
		out = append(out, staticConfig{Targets: []string{p.Address}, Labels: meta})
	}
	return out, nil
}

// invalidLabelChar is what Prometheus replaces by "_" in a Kubernetes label name to make a
// label name of it.
var invalidLabelChar = regexp.MustCompile(`[^a-zA-Z0-9_]`)

func sanitize(name string) string { return invalidLabelChar.ReplaceAllString(name, "_") }

// operatorRelabelings returns the relabelings the Prometheus Operator gives the job of one
// ServiceMonitor endpoint (endpoints role), then the endpoint's own.
func operatorRelabelings(sm ServiceMonitor, ep Endpoint) ([]relabelConfig, error) {
	if len(sm.Spec.Selector.MatchExpressions) > 0 {
		return nil, fmt.Errorf("ServiceMonitor %s: matchExpressions are not translated", sm.Name)
	}
	if ep.Port == "" {
		return nil, fmt.Errorf("ServiceMonitor %s: an endpoint without a port name is not translated", sm.Name)
	}
	str := func(s string) *string { return &s }
	var out []relabelConfig
	for _, k := range slices.Sorted(maps.Keys(sm.Spec.Selector.MatchLabels)) {
		out = append(out, relabelConfig{
			Action:       "keep",
			SourceLabels: []string{"__meta_kubernetes_service_label_" + sanitize(k), "__meta_kubernetes_service_labelpresent_" + sanitize(k)},
			Regex:        "(" + regexp.QuoteMeta(sm.Spec.Selector.MatchLabels[k]) + ");true",
		})
	}
	target := []string{"__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"}
	out = append(out,
		relabelConfig{Action: "keep", SourceLabels: []string{"__meta_kubernetes_endpoint_port_name"}, Regex: regexp.QuoteMeta(ep.Port)},
		relabelConfig{SourceLabels: target, Separator: ";", Regex: "Node;(.*)", Replacement: str("${1}"), TargetLabel: "node"},
		relabelConfig{SourceLabels: target, Separator: ";", Regex: "Pod;(.*)", Replacement: str("${1}"), TargetLabel: "pod"},
		relabelConfig{SourceLabels: []string{"__meta_kubernetes_namespace"}, TargetLabel: "namespace"},
		relabelConfig{SourceLabels: []string{"__meta_kubernetes_service_name"}, TargetLabel: "service"},
		relabelConfig{SourceLabels: []string{"__meta_kubernetes_pod_name"}, TargetLabel: "pod"},
		relabelConfig{SourceLabels: []string{"__meta_kubernetes_pod_container_name"}, TargetLabel: "container"},
		relabelConfig{Action: "drop", SourceLabels: []string{"__meta_kubernetes_pod_phase"}, Regex: "(Failed|Succeeded)"},
		relabelConfig{SourceLabels: []string{"__meta_kubernetes_service_name"}, TargetLabel: "job", Replacement: str("${1}")},
		relabelConfig{TargetLabel: "endpoint", Replacement: str(ep.Port)},
	)
	for _, r := range ep.Relabelings {
		rc := relabelConfig(r) // the same fields, spelt as a Prometheus configuration spells them
		rc.Action = strings.ToLower(rc.Action)
		out = append(out, rc)
	}
	return out, nil
}

// Jobs returns the names of the jobs Config writes, sorted.
func (c *Chart) Jobs() []string {
	var out []string
	for _, sm := range c.ServiceMonitors {
		for i := range sm.Spec.Endpoints {
			out = append(out, jobName(sm, i))
		}
	}
	sort.Strings(out)
	return out
}

// jobName is the Prometheus Operator's name of the job of endpoint i of sm.
func jobName(sm ServiceMonitor, i int) string {
	return fmt.Sprintf("serviceMonitor/%s/%s/%d", sm.Namespace, sm.Name, i)
}
