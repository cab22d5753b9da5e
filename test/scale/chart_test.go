package scale

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// renderedChart is the shape of helm template's output around the scheduler ConfigMap.
const renderedChart = `---
# Source: gpuslice/templates/rbac.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: gpuslice-scheduler
---
# Source: gpuslice/templates/scheduler-configmap.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: gpuslice-scheduler
data:
  scheduler-config.yaml: |
    apiVersion: kubescheduler.config.k8s.io/v1
    kind: KubeSchedulerConfiguration
    leaderElection:
      leaderElect: true
      resourceNamespace: gpuslice-system
    percentageOfNodesToScore: 100
    profiles:
      - schedulerName: gpuslice-scheduler
    extenders:
      - urlPrefix: http://127.0.0.1:8888
        bindVerb: bind
  extender.yaml: |
    address: 127.0.0.1:8888
    nodePolicy: binpack
    leaderLease: gpuslice-system/gpuslice-scheduler
`

func TestChartProfile(t *testing.T) {
	t.Parallel()
	p, err := chartProfile([]byte(renderedChart))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff("address: 127.0.0.1:8888\nnodePolicy: binpack\nleaderLease: gpuslice-system/gpuslice-scheduler\n", p.ExtenderConfig); diff != "" {
		t.Errorf("extender config (-want +got):\n%s", diff)
	}
	// The harness's kube-scheduler elects no leader: its extender must not wait for a Lease.
	ext, err := withoutLeaderLease(p.ExtenderConfig)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff("address: 127.0.0.1:8888\nnodePolicy: binpack\n", ext); diff != "" {
		t.Errorf("withoutLeaderLease (-want +got):\n%s", diff)
	}
	got, err := withDefaultProfile(p.SchedulerConfig, "")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(got), &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"apiVersion":               "kubescheduler.config.k8s.io/v1",
		"kind":                     "KubeSchedulerConfiguration",
		"leaderElection":           map[string]any{"leaderElect": false},
		"percentageOfNodesToScore": float64(100),
		"profiles":                 []any{map[string]any{"schedulerName": "default-scheduler"}, map[string]any{"schedulerName": "gpuslice-scheduler"}},
		"extenders":                []any{map[string]any{"urlPrefix": "http://127.0.0.1:8888", "bindVerb": "bind"}},
	}
	if diff := cmp.Diff(want, doc); diff != "" {
		t.Errorf("withDefaultProfile (-want +got):\n%s", diff)
	}
	if _, err := withDefaultProfile(got, ""); err == nil {
		t.Error("withDefaultProfile of a configuration with a default-scheduler profile: no error")
	}
	patched, err := withDefaultProfile(p.SchedulerConfig, `{"percentageOfNodesToScore":50,"plugins":{"score":{"disabled":[{"name":"*"}]}}}`)
	if err != nil {
		t.Fatal(err)
	}
	doc = nil
	if err := yaml.Unmarshal([]byte(patched), &doc); err != nil {
		t.Fatal(err)
	}
	wantProfiles := []any{
		map[string]any{"schedulerName": "default-scheduler"},
		map[string]any{"schedulerName": "gpuslice-scheduler", "percentageOfNodesToScore": float64(50),
			"plugins": map[string]any{"score": map[string]any{"disabled": []any{map[string]any{"name": "*"}}}}},
	}
	if diff := cmp.Diff(wantProfiles, doc["profiles"]); diff != "" {
		t.Errorf("withDefaultProfile with a patch: profiles (-want +got):\n%s", diff)
	}
	if _, err := withDefaultProfile(p.SchedulerConfig, "[1]"); err == nil {
		t.Error("withDefaultProfile with a patch that is no object: no error")
	}
	if _, err := chartProfile([]byte("kind: ConfigMap\ndata:\n  other: x\n")); err == nil {
		t.Error("chartProfile without the scheduler ConfigMap: no error")
	}
}
