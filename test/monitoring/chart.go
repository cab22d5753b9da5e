package monitoring

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// DashboardKey is the key of the dashboard's JSON in the chart's dashboard ConfigMap.
const DashboardKey = "gpuslice.json"

// Chart is the monitoring of one render of the chart: its metrics Services, its ServiceMonitors,
// the pod templates of its workloads (which name the containers behind the Services), the alert
// groups of its PrometheusRule and its Grafana dashboard. A part the render left out is empty.
type Chart struct {
	Services        []corev1.Service
	ServiceMonitors []ServiceMonitor
	// PodTemplates are the pod templates of the render's Deployments and DaemonSets.
	PodTemplates []corev1.PodTemplateSpec
	// RuleGroups are the PrometheusRule's spec.groups.
	RuleGroups []RuleGroup
	// DashboardConfigMap is the ConfigMap holding the dashboard under DashboardKey, nil without one.
	DashboardConfigMap *corev1.ConfigMap
	Dashboard          Dashboard
}

// ServiceMonitor is the part of a monitoring.coreos.com/v1 ServiceMonitor that Config
// translates. Parse decodes it strictly, so a field the chart starts to set and Config does not
// translate fails the parse instead of being left out silently.
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ServiceMonitorSpec `json:"spec"`
}

// ServiceMonitorSpec selects the Services and says how to scrape their endpoints.
type ServiceMonitorSpec struct {
	Selector          metav1.LabelSelector `json:"selector"`
	NamespaceSelector NamespaceSelector    `json:"namespaceSelector"`
	Endpoints         []Endpoint           `json:"endpoints"`
}

// NamespaceSelector names the namespaces whose Services are selected; empty means the
// ServiceMonitor's own.
type NamespaceSelector struct {
	MatchNames []string `json:"matchNames,omitempty"`
}

// Endpoint is one port of the selected Services to scrape.
type Endpoint struct {
	Port        string          `json:"port"`
	Path        string          `json:"path,omitempty"`
	Scheme      string          `json:"scheme,omitempty"`
	Interval    string          `json:"interval,omitempty"`
	HonorLabels bool            `json:"honorLabels,omitempty"`
	TLSConfig   *TLSConfig      `json:"tlsConfig,omitempty"`
	Relabelings []RelabelConfig `json:"relabelings,omitempty"`
}

// TLSConfig is how an HTTPS endpoint is verified.
type TLSConfig struct {
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// RelabelConfig is one relabeling of a target, as the ServiceMonitor CRD spells it.
type RelabelConfig struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    string   `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// prometheusRule is the part of a monitoring.coreos.com/v1 PrometheusRule that Parse reads.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []RuleGroup `json:"groups"`
	} `json:"spec"`
}

// RuleGroup is a group of alerting rules, as a Prometheus rule file holds it.
type RuleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []Rule `json:"rules"`
}

// Rule is one alerting rule.
type Rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// RuleFile returns the chart's rule groups as a Prometheus rule file (the document
// {groups: [...]} that promtool and Prometheus read).
func (c *Chart) RuleFile() ([]byte, error) {
	b, err := yaml.Marshal(map[string][]RuleGroup{"groups": c.RuleGroups})
	if err != nil {
		return nil, fmt.Errorf("encode rule file: %w", err)
	}
	return b, nil
}

// Alerts returns every alerting rule of the chart, in file order.
func (c *Chart) Alerts() []Rule {
	var out []Rule
	for _, g := range c.RuleGroups {
		out = append(out, g.Rules...)
	}
	return out
}

// Dashboard is the part of a Grafana dashboard the tests read.
type Dashboard struct {
	Title  string  `json:"title"`
	Panels []Panel `json:"panels"`
}

// Panel is one dashboard panel and its queries.
type Panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Targets []Query `json:"targets"`
}

// Query is one PromQL query of a panel.
type Query struct {
	RefID        string `json:"refId"`
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
	Format       string `json:"format,omitempty"`
	Instant      bool   `json:"instant,omitempty"`
}

// legendLabel is one {{label}} of a Grafana legend format.
var legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// LegendLabels returns the label names the legend format shows ("{{node}} {{gpu}}": node, gpu),
// each once, in order; none for a table or a fixed legend.
func (q Query) LegendLabels() []string {
	var out []string
	for _, m := range legendLabel.FindAllStringSubmatch(q.LegendFormat, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}

// Parse reads the monitoring out of a render of the chart (helm template's output, a stream of
// YAML documents). Documents of other kinds are skipped; a ServiceMonitor, PrometheusRule,
// Service, Deployment, DaemonSet or the dashboard that does not decode strictly is an error.
func Parse(render []byte) (*Chart, error) {
	c := &Chart{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(render)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return c, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read render: %w", err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("read render: %w", err)
		}
		if err := c.add(tm, doc); err != nil {
			return nil, err
		}
	}
}

// add decodes one document of the render into c when it is one of the kinds c holds.
func (c *Chart) add(tm metav1.TypeMeta, doc []byte) error {
	strict := func(into any) error {
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			return fmt.Errorf("decode %s: %w", tm.Kind, err)
		}
		return nil
	}
	switch tm.APIVersion + "/" + tm.Kind {
	case "monitoring.coreos.com/v1/ServiceMonitor":
		var sm ServiceMonitor
		if err := strict(&sm); err != nil {
			return err
		}
		c.ServiceMonitors = append(c.ServiceMonitors, sm)
	case "monitoring.coreos.com/v1/PrometheusRule":
		var pr prometheusRule
		if err := strict(&pr); err != nil {
			return err
		}
		c.RuleGroups = append(c.RuleGroups, pr.Spec.Groups...)
	case "v1/Service":
		var s corev1.Service
		if err := strict(&s); err != nil {
			return err
		}
		c.Services = append(c.Services, s)
	case "apps/v1/Deployment":
		var d appsv1.Deployment
		if err := strict(&d); err != nil {
			return err
		}
		c.PodTemplates = append(c.PodTemplates, d.Spec.Template)
	case "apps/v1/DaemonSet":
		var d appsv1.DaemonSet
		if err := strict(&d); err != nil {
			return err
		}
		c.PodTemplates = append(c.PodTemplates, d.Spec.Template)
	case "v1/ConfigMap":
		var cm corev1.ConfigMap
		if err := strict(&cm); err != nil {
			return err
		}
		data, ok := cm.Data[DashboardKey]
		if !ok {
			return nil
		}
		dec := json.NewDecoder(bytes.NewReader([]byte(data)))
		var d Dashboard
		if err := dec.Decode(&d); err != nil {
			return fmt.Errorf("dashboard %s of ConfigMap %s: %w", DashboardKey, cm.Name, err)
		}
		c.DashboardConfigMap, c.Dashboard = &cm, d
	}
	return nil
}
