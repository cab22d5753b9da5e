package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	componentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpuslice/gpuslice/extender"
)

// TestSchedulerConfigLikeChart checks that the cluster's own kube-scheduler configuration sets
// what the chart sets as the chart's defaults do (charts/gpuslice/values.yaml), and that the
// extender it runs with its own defaults may bind as fast as kube-scheduler's client sends.
func TestSchedulerConfigLikeChart(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "charts", "gpuslice", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Scheduler struct {
			SchedulerName            string `json:"schedulerName"`
			PercentageOfNodesToScore int32  `json:"percentageOfNodesToScore"`
			KubeScheduler            struct {
				ClientQPS   float32 `json:"clientQPS"`
				ClientBurst int32   `json:"clientBurst"`
			} `json:"kubeScheduler"`
			Extender struct {
				KubeAPIQPS   float32 `json:"kubeAPIQPS"`
				KubeAPIBurst int     `json:"kubeAPIBurst"`
				DRAWeight    int64   `json:"draWeight"`
			} `json:"extender"`
		} `json:"scheduler"`
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatalf("chart values: %v", err)
	}
	var cfg kubeschedulerconfigv1.KubeSchedulerConfiguration
	if err := yaml.UnmarshalStrict([]byte(schedulerConfig("/kubeconfig", 8888, true, nil)), &cfg); err != nil {
		t.Fatal(err)
	}
	// The DRA scoring entry (Options.DRAScore) as the chart's with dra.enabled.
	if len(cfg.Extenders) != 2 || cfg.Extenders[1].PrioritizeVerb != "dra/prioritize" || cfg.Extenders[1].Weight != values.Scheduler.Extender.DRAWeight ||
		len(cfg.Extenders[1].ManagedResources) != 0 || !cfg.Extenders[1].Ignorable {
		t.Errorf("extenders %+v; want the filter and bind entry, then dra/prioritize at weight %d, no managedResources, ignorable", cfg.Extenders, values.Scheduler.Extender.DRAWeight)
	}

	type settings struct {
		QPS        float32
		Burst      int32
		Percentage map[string]*int32 // by profile
	}
	s := values.Scheduler
	want := settings{
		QPS: s.KubeScheduler.ClientQPS, Burst: s.KubeScheduler.ClientBurst,
		Percentage: map[string]*int32{"default-scheduler": nil, s.SchedulerName: &s.PercentageOfNodesToScore},
	}
	got := settings{QPS: cfg.ClientConnection.QPS, Burst: cfg.ClientConnection.Burst, Percentage: map[string]*int32{}}
	for _, p := range cfg.Profiles {
		got.Percentage[*p.SchedulerName] = p.PercentageOfNodesToScore
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kube-scheduler configuration against the chart's defaults (-want +got):\n%s", diff)
	}

	// The extender runs here without --kube-api-qps or --kube-api-burst.
	x := extender.DefaultConfig()
	if diff := cmp.Diff([]any{s.Extender.KubeAPIQPS, s.Extender.KubeAPIBurst}, []any{x.KubeAPIQPS, x.KubeAPIBurst}); diff != "" {
		t.Errorf("extender defaults against the chart's scheduler.extender values (-want +got):\n%s", diff)
	}
	if x.KubeAPIQPS < cfg.ClientConnection.QPS || int64(x.KubeAPIBurst) < int64(cfg.ClientConnection.Burst) {
		t.Errorf("extender client %v QPS, burst %d is below kube-scheduler's %v, %d", x.KubeAPIQPS, x.KubeAPIBurst, cfg.ClientConnection.QPS, cfg.ClientConnection.Burst)
	}
}

func TestPointSchedulerConfig(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		in      string
		want    map[string]any
		wantErr string
	}{
		"kubeconfig and extender set, rest kept": {
			in: "kind: KubeSchedulerConfiguration\nclientConnection:\n  qps: 200\npercentageOfNodesToScore: 100\nextenders:\n- urlPrefix: http://127.0.0.1:8888\n  bindVerb: bind\n",
			want: map[string]any{
				"kind":                     "KubeSchedulerConfiguration",
				"clientConnection":         map[string]any{"qps": float64(200), "kubeconfig": "/k"},
				"percentageOfNodesToScore": float64(100),
				"extenders":                []any{map[string]any{"urlPrefix": "http://127.0.0.1:4242", "bindVerb": "bind"}},
			},
		},
		"no client connection, no extenders": {
			in:   "kind: KubeSchedulerConfiguration\n",
			want: map[string]any{"kind": "KubeSchedulerConfiguration", "clientConnection": map[string]any{"kubeconfig": "/k"}},
		},
		"empty":           {in: "", wantErr: "empty document"},
		"extender no map": {in: "extenders:\n- x\n", wantErr: "extenders[0] is a string"},
		"not a mapping":   {in: "- a\n", wantErr: "scheduler configuration"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := pointSchedulerConfig(tc.in, "/k", 4242)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := yaml.Unmarshal([]byte(out), &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("pointSchedulerConfig (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSchedulerConfigLeaderElection checks the leader election the scheduler pairs run with
// (Options.Schedulers above 1): kube-scheduler's configuration names the Lease and the durations,
// and a single pair has none.
func TestSchedulerConfigLeaderElection(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	le := LeaderElection{LeaseDuration: 6 * time.Second, RenewDeadline: 4 * time.Second}.withDefaults() // retryPeriod: the default
	for _, tc := range []struct {
		name   string
		leader *LeaderElection
		want   componentbaseconfigv1alpha1.LeaderElectionConfiguration
	}{
		{name: "single pair", want: componentbaseconfigv1alpha1.LeaderElectionConfiguration{LeaderElect: &no}},
		{name: "pairs", leader: &le, want: componentbaseconfigv1alpha1.LeaderElectionConfiguration{
			LeaderElect: &yes, ResourceNamespace: LeaderLeaseNamespace, ResourceName: LeaderLeaseName,
			LeaseDuration: metav1.Duration{Duration: 6 * time.Second}, RenewDeadline: metav1.Duration{Duration: 4 * time.Second}, RetryPeriod: metav1.Duration{Duration: 2 * time.Second},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg kubeschedulerconfigv1.KubeSchedulerConfiguration
			if err := yaml.UnmarshalStrict([]byte(schedulerConfig("/kubeconfig", 8888, false, tc.leader)), &cfg); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, cfg.LeaderElection); diff != "" {
				t.Errorf("leaderElection (-want +got):\n%s", diff)
			}
		})
	}
}
