package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChartRejectsBadValues checks that bad values fail both helm template and helm lint, with an
// error that names the value and what is allowed. Most are the schema's (values.schema.json);
// the rest are the chart's own checks (templates/validate.yaml), for what a schema cannot say.
func TestChartRejectsBadValues(t *testing.T) {
	h := requireHelm(t)
	tests := []struct {
		name   string
		values string
		want   []string // substrings of both errors
	}{{
		name:   "splitCount 0",
		values: "devicePlugin: {splitCount: 0}",
		want:   []string{"/devicePlugin/splitCount", "minimum: got 0, want 1"},
	}, {
		name:   "splitCount above 100",
		values: "devicePlugin: {splitCount: 101}",
		want:   []string{"/devicePlugin/splitCount", "maximum: got 101, want 100"},
	}, {
		name:   "unknown mode",
		values: "devicePlugin: {mode: magic}",
		want:   []string{"/devicePlugin/mode", "value must be one of 'cdi', 'env'"},
	}, {
		name:   "negative memoryScaling",
		values: "devicePlugin: {memoryScaling: -1}",
		want:   []string{"/devicePlugin/memoryScaling", "exclusiveMinimum: got -1, want 0"},
	}, {
		name:   "relative cdiSpecDir",
		values: "devicePlugin: {cdiSpecDir: var/run/cdi}",
		want:   []string{"/devicePlugin/cdiSpecDir", "does not match pattern '^/'"},
	}, {
		name:   "nodeConfigs name not a DNS label",
		values: "devicePlugin: {nodeConfigs: [{name: Bad_Name}]}",
		want:   []string{"/devicePlugin/nodeConfigs/0/name", "'Bad_Name' does not match pattern '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"},
	}, {
		name:   "nodeConfigs unknown setting",
		values: "devicePlugin: {nodeConfigs: [{name: a100, mode: env}]}",
		want:   []string{"/devicePlugin/nodeConfigs/0", "additional properties 'mode' not allowed"},
	}, {
		name:   "nodeConfigs names used twice",
		values: "devicePlugin: {nodeConfigs: [{name: a100}, {name: t4}, {name: a100}]}",
		want:   []string{"devicePlugin.nodeConfigs[2].name=a100: already used by devicePlugin.nodeConfigs[0]"},
	}, {
		name:   "dra nodeSelector dropped",
		values: "dra: {enabled: true, nodeSelector: null}",
		want:   []string{"/dra", "missing property 'nodeSelector'"},
	}, {
		name:   "dra nodeSelector emptied",
		values: "dra: {enabled: true, nodeSelector: {gpuslice.hami.io/mode: null}}",
		want:   []string{"/dra/nodeSelector", "minProperties"},
	}, {
		name:   "dra modelClasses reuse the driver's class",
		values: "dra: {modelClasses: [{name: gpuslice.hami.io, model: A100-80GB}]}",
		want:   []string{"/dra/modelClasses/0/name", "'not' failed"},
	}, {
		name:   "dra modelClasses without a model",
		values: "dra: {modelClasses: [{name: a100}]}",
		want:   []string{"/dra/modelClasses/0", "missing property 'model'"},
	}, {
		name:   "unknown nodePolicy",
		values: "scheduler: {extender: {nodePolicy: tight}}",
		want:   []string{"/scheduler/extender/nodePolicy", "value must be one of 'binpack', 'spread', 'fragmentation'"},
	}, {
		name:   "heartbeatMaxAge not a duration",
		values: "scheduler: {extender: {heartbeatMaxAge: 1minute}}",
		want:   []string{"/scheduler/extender/heartbeatMaxAge", "does not match pattern"},
	}, {
		name:   "stock scheduler name",
		values: "scheduler: {schedulerName: default-scheduler}",
		want:   []string{"scheduler.schedulerName=default-scheduler: must not be the stock profile", "gpuslice-scheduler"},
	}, {
		name:   "PodDisruptionBudget blocks every drain",
		values: "scheduler: {replicas: 3, podDisruptionBudget: {minAvailable: 3}}",
		want:   []string{"scheduler.podDisruptionBudget.minAvailable=3: must be from 0 to scheduler.replicas-1 (2)"},
	}, {
		name:   "replicas without leader election",
		values: "scheduler: {replicas: 2, leaderElection: {enabled: false}}",
		want:   []string{"scheduler.leaderElection.enabled=false: needs scheduler.replicas=1 (got 2)"},
	}, {
		name:   "percentageOfNodesToScore above 100",
		values: "scheduler: {percentageOfNodesToScore: 101}",
		want:   []string{"/scheduler/percentageOfNodesToScore", "maximum: got 101, want 100"},
	}, {
		name:   "negative percentageOfNodesToScore",
		values: "scheduler: {percentageOfNodesToScore: -1}",
		want:   []string{"/scheduler/percentageOfNodesToScore", "minimum: got -1, want 0"},
	}, {
		name:   "fractional percentageOfNodesToScore",
		values: "scheduler: {percentageOfNodesToScore: 12.5}",
		want:   []string{"/scheduler/percentageOfNodesToScore", "got number, want integer"},
	}, {
		name:   "kube-scheduler clientQPS 0",
		values: "scheduler: {kubeScheduler: {clientQPS: 0}}",
		want:   []string{"/scheduler/kubeScheduler/clientQPS", "minimum: got 0, want 1"},
	}, {
		name:   "kube-scheduler clientBurst above 100000",
		values: "scheduler: {kubeScheduler: {clientBurst: 100001}, extender: {kubeAPIBurst: 100001}}",
		want:   []string{"/scheduler/kubeScheduler/clientBurst", "/scheduler/extender/kubeAPIBurst", "maximum: got 100,001, want 100,000"},
	}, {
		name:   "extender kubeAPIQPS 0",
		values: "scheduler: {extender: {kubeAPIQPS: 0}}",
		want:   []string{"/scheduler/extender/kubeAPIQPS", "minimum: got 0, want 1"},
	}, {
		name:   "extender kubeAPIBurst not an integer",
		values: "scheduler: {extender: {kubeAPIBurst: 250.5}}",
		want:   []string{"/scheduler/extender/kubeAPIBurst", "got number, want integer"},
	}, {
		name:   "negative maxPendingBinds",
		values: "scheduler: {extender: {maxPendingBinds: -1}}",
		want:   []string{"/scheduler/extender/maxPendingBinds", "minimum: got -1, want 0"},
	}, {
		name:   "extender gcPercent below 10",
		values: "scheduler: {extender: {gcPercent: 5}}",
		want:   []string{"/scheduler/extender/gcPercent", "minimum: got 5, want 10"},
	}, {
		name:   "extender QPS below kube-scheduler's",
		values: "scheduler: {kubeScheduler: {clientQPS: 150.5}, extender: {kubeAPIQPS: 100}}",
		want:   []string{"scheduler.extender.kubeAPIQPS=100: must be at least scheduler.kubeScheduler.clientQPS (150.5)"},
	}, {
		name:   "extender burst below kube-scheduler's",
		values: "scheduler: {kubeScheduler: {clientBurst: 400}, extender: {kubeAPIBurst: 300}}",
		want:   []string{"scheduler.extender.kubeAPIBurst=300: must be at least scheduler.kubeScheduler.clientBurst (400)"},
	}, {
		name:   "webhook timeout above 30",
		values: "webhook: {timeoutSeconds: 60}",
		want:   []string{"/webhook/timeoutSeconds", "maximum: got 60, want 30"},
	}, {
		name:   "unknown failurePolicy",
		values: "webhook: {failurePolicy: Sometimes}",
		want:   []string{"/webhook/failurePolicy", "value must be one of 'Fail', 'Ignore'"},
	}, {
		name:   "allocationPolicy.enabled not a boolean",
		values: "allocationPolicy: {enabled: \"yes\"}",
		want:   []string{"/allocationPolicy/enabled", "got string, want boolean"},
	}, {
		name:   "issuerRef without name",
		values: "webhook: {tls: {cert: \"\", key: \"\", caCert: \"\"}, certManager: {enabled: true, issuerRef: {kind: ClusterIssuer}}}",
		want:   []string{"webhook.certManager.issuerRef.name: required when issuerRef is set"},
	}, {
		name:   "webhook certificate in part",
		values: "webhook: {tls: {key: \"\"}}",
		want:   []string{"webhook.tls: set caCert, cert and key together"},
	}, {
		name:   "webhook certificate and cert-manager",
		values: "webhook: {certManager: {enabled: true}}",
		want:   []string{"webhook.tls and webhook.certManager.enabled=true: choose one"},
	}, {
		name:   "kubeScheduler securePort below 1024",
		values: "scheduler: {kubeScheduler: {securePort: 443}}",
		want:   []string{"/scheduler/kubeScheduler/securePort", "minimum: got 443, want 1,024"},
	}, {
		name:   "kubeScheduler securePort on the extender's health port",
		values: "scheduler: {extender: {port: 9000}, kubeScheduler: {securePort: 9001}}",
		want:   []string{"scheduler.kubeScheduler.securePort=9001: the extender uses scheduler.extender.port (9000) and its health port"},
	}, {
		name:   "webhook hostNetwork not a boolean",
		values: "webhook: {hostNetwork: \"yes\"}",
		want:   []string{"/webhook/hostNetwork", "got string, want boolean"},
	}, {
		name:   "unknown pullPolicy",
		values: "image: {pullPolicy: Sometimes}",
		want:   []string{"/image/pullPolicy", "value must be one of 'Always', 'IfNotPresent', 'Never'"},
	}, {
		name:   "unknown top-level key",
		values: "bogus: 1",
		want:   []string{"additional properties 'bogus' not allowed"},
	}, {
		name:   "misspelt nested key",
		values: "webhook: {replica: 3}",
		want:   []string{"/webhook", "additional properties 'replica' not allowed"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(file, []byte(tt.values+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			for cmd, run := range map[string]func(string) ([]byte, error){"helm template": h.template, "helm lint --strict": h.lint} {
				_, err := run(file)
				if err == nil {
					t.Errorf("%s accepts %q", cmd, tt.values)
					continue
				}
				for _, want := range tt.want {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("%s error lacks %q:\n%v", cmd, want, err)
					}
				}
			}
		})
	}
}
