package scale

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Keys of the chart's scheduler ConfigMap.
const (
	chartSchedulerConfigKey = "scheduler-config.yaml"
	chartExtenderConfigKey  = "extender.yaml"
	// chartKubeVersion is the Kubernetes version the chart is rendered for: the cluster's.
	chartKubeVersion = "1.37.2"
)

// ChartProfile is the scheduler part of the chart as helm renders it.
type ChartProfile struct {
	// SchedulerConfig is the KubeSchedulerConfiguration of the chart's kube-scheduler
	// (its ConfigMap's scheduler-config.yaml).
	SchedulerConfig string
	// ExtenderConfig is the extender's configuration file (extender.yaml of the same ConfigMap).
	ExtenderConfig string
}

// RenderChart runs `helm template` of the chart in chartDir with helm (values set with set,
// each "key=value") and returns its scheduler ConfigMap's two files. Helm's folders are kept
// in a temporary folder that is removed again.
func RenderChart(ctx context.Context, helm, chartDir string, set ...string) (ChartProfile, error) {
	home, err := os.MkdirTemp("", "gs-helm-")
	if err != nil {
		return ChartProfile{}, fmt.Errorf("helm folder: %w", err)
	}
	defer func() { _ = os.RemoveAll(home) }()
	// Only the scheduler's files are read; the webhook would need a certificate made once, as
	// helm template has no cluster to keep a generated one in.
	args := []string{"template", "gpuslice", chartDir, "--namespace", "gpuslice-system", "--kube-version", chartKubeVersion, "--set", "webhook.enabled=false"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.CommandContext(ctx, helm, args...) //nolint:gosec // G204: the cluster's own helm
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return ChartProfile{}, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return chartProfile(out)
}

// chartProfile finds the ConfigMap holding scheduler-config.yaml in a helm template output.
func chartProfile(manifests []byte) (ChartProfile, error) {
	for _, doc := range bytes.Split(manifests, []byte("\n---")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil || meta.Kind != "ConfigMap" {
			continue
		}
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal(doc, &cm); err != nil {
			return ChartProfile{}, fmt.Errorf("rendered ConfigMap: %w", err)
		}
		if s, ok := cm.Data[chartSchedulerConfigKey]; ok {
			p := ChartProfile{SchedulerConfig: s, ExtenderConfig: cm.Data[chartExtenderConfigKey]}
			if p.ExtenderConfig == "" {
				return ChartProfile{}, fmt.Errorf("ConfigMap %s has %s but no %s", cm.Name, chartSchedulerConfigKey, chartExtenderConfigKey)
			}
			return p, nil
		}
	}
	return ChartProfile{}, fmt.Errorf("no ConfigMap with %s in the rendered chart (scheduler.enabled=false?)", chartSchedulerConfigKey)
}

// withDefaultProfile returns the chart's KubeSchedulerConfiguration with the stock
// default-scheduler profile added before the chart's own, so that one kube-scheduler process
// schedules plain pods and GPU pods with the same client, extenders and top-level settings, and
// with leader election off (one replica, and the chart's lock namespace does not exist here).
// A non-empty profilePatch (a JSON merge patch, RFC 7386) is applied to each of the chart's
// profiles, for experiments the chart has no value for (e.g. {"percentageOfNodesToScore":100}).
// Everything else is kept as the chart renders it.
func withDefaultProfile(config, profilePatch string) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(config), &doc); err != nil {
		return "", fmt.Errorf("chart scheduler configuration: %w", err)
	}
	var patch map[string]any
	if profilePatch != "" {
		if err := yaml.Unmarshal([]byte(profilePatch), &patch); err != nil {
			return "", fmt.Errorf("profile patch %q: want a JSON object: %w", profilePatch, err)
		}
		if patch == nil {
			return "", fmt.Errorf("profile patch %q: want a JSON object", profilePatch)
		}
	}
	profiles, _ := doc["profiles"].([]any)
	for i, p := range profiles {
		m, ok := p.(map[string]any)
		if !ok {
			return "", fmt.Errorf("chart scheduler configuration: profiles[%d] is a %T, want a mapping", i, p)
		}
		if m["schedulerName"] == corev1.DefaultSchedulerName {
			return "", errors.New("chart scheduler configuration: already has a default-scheduler profile")
		}
		if patch != nil {
			profiles[i] = mergePatch(m, patch)
		}
	}
	doc["profiles"] = append([]any{map[string]any{"schedulerName": corev1.DefaultSchedulerName}}, profiles...)
	doc["leaderElection"] = map[string]any{"leaderElect": false}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", fmt.Errorf("chart scheduler configuration: %w", err)
	}
	return string(out), nil
}

// withoutLeaderLease returns the chart's extender configuration without its leaderLease: the
// harness's one kube-scheduler runs no leader election (withDefaultProfile), so an extender
// following its Lease would never lead, and would neither ask for retries nor keep the nodes'
// registration conditions. Everything else is kept as the chart renders it.
func withoutLeaderLease(config string) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(config), &doc); err != nil {
		return "", fmt.Errorf("chart extender configuration: %w", err)
	}
	if _, ok := doc["leaderLease"]; !ok {
		return config, nil
	}
	delete(doc, "leaderLease")
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", fmt.Errorf("chart extender configuration: %w", err)
	}
	return string(out), nil
}

// mergePatch applies JSON merge patch (RFC 7386) patch to doc: objects merge key by key, null
// removes a key, anything else replaces.
func mergePatch(doc, patch map[string]any) map[string]any {
	if doc == nil {
		doc = map[string]any{}
	}
	for k, v := range patch {
		switch pv := v.(type) {
		case nil:
			delete(doc, k)
		case map[string]any:
			dv, _ := doc[k].(map[string]any)
			doc[k] = mergePatch(dv, pv)
		default:
			doc[k] = v
		}
	}
	return doc
}
