package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/test/cluster"
)

// Device-plugin footprint: the target of the scale issue and the bound the test enforces, far
// enough above the measured figure that it does not flake, far enough below the 68 MiB measured
// before the plugin was slimmed that a return of the old costs fails.
const (
	pluginRSSTargetMiB = 30
	pluginRSSLimitMiB  = 45
)

// runtimeGauges are the Go runtime's figures, from the plugin's /metrics, that split its resident
// memory into heap, stacks and the rest (code and data of the binary, runtime structures).
var runtimeGauges = []string{
	"go_memstats_heap_inuse_bytes",
	"go_memstats_heap_idle_bytes",
	"go_memstats_heap_released_bytes",
	"go_memstats_stack_inuse_bytes",
	"go_memstats_sys_bytes",
	"go_goroutines",
}

// TestPluginFootprint measures the device plugin's resident memory (VmRSS) with 8 fake GPUs
// (dgxa100: 80 devices at the default split count), serving its probes and metrics as the chart
// runs it, once it has registered and eight GPU pods have reached Running through the webhook and
// the extender. It logs the figure beside the 30 MiB target with the Go runtime's split of it, for
// the plain go build and for one with the build tag grpcnotrace (gRPC without golang.org/x/net/trace,
// whose html/template keeps every exported method of the binary alive). Real: etcd,
// kube-apiserver, kube-scheduler, kubelet, the gpuslice extender, webhook and device plugin.
// Fake: NVML and the container runtime.
func TestPluginFootprint(t *testing.T) {
	requireHost(t)
	tests := []struct {
		name      string
		buildArgs []string // nil: the binary TestMain built
	}{
		{name: "go build"},
		{name: "go build -tags grpcnotrace", buildArgs: []string{"-tags", "grpcnotrace"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plugin := filepath.Join(binDir, "gpuslice-device-plugin")
			if tt.buildArgs != nil {
				plugin = filepath.Join(t.TempDir(), "gpuslice-device-plugin")
				args := append(append([]string{"build"}, tt.buildArgs...), "-o", plugin, "./cmd/gpuslice-device-plugin")
				build := exec.Command("go", args...)
				build.Dir = filepath.Join("..", "..") // the product module, from test/e2e
				if out, err := build.CombinedOutput(); err != nil {
					t.Fatalf("go %v: %v\n%s", args, err, out)
				}
			}
			measurePluginFootprint(t, plugin)
		})
	}
}

// measurePluginFootprint runs TestPluginFootprint's scenario with the plugin binary at path.
func measurePluginFootprint(t *testing.T, path string) {
	opts := clusterOptions(cluster.NodeOptions{Name: "node-1", FakeGPUs: "dgxa100", PluginProbes: true})
	opts.PluginPath = path
	c := startClusterWith(t, opts)
	n := c.Nodes[0]
	addr := fmt.Sprintf("127.0.0.1:%d", n.PluginHealthPort)
	registered, _, err := n.Plugin.Memory()
	if err != nil {
		t.Fatal(err)
	}

	var pods []*corev1.Pod
	for i := range 8 {
		pods = append(pods, slicePod(fmt.Sprintf("footprint-%d", i), 8192, 20))
	}
	createAll(t, c, pods)
	if out := waitSettled(t, c, "footprint-", len(pods), 2*time.Minute); len(out.running) != len(pods) {
		t.Fatalf("%d of %d pods Running", len(out.running), len(pods))
	}

	rss, peak, err := n.Plugin.Memory()
	if err != nil {
		t.Fatal(err)
	}
	gauges, err := scrapeGauges("http://"+addr+"/metrics", runtimeGauges)
	if err != nil {
		t.Fatal(err)
	}
	var split []string
	for _, name := range runtimeGauges {
		v := gauges[name]
		if strings.HasSuffix(name, "_bytes") {
			split = append(split, fmt.Sprintf("%s %.1f MiB", strings.TrimSuffix(strings.TrimPrefix(name, "go_memstats_"), "_bytes"), v/(1<<20)))
		} else {
			split = append(split, fmt.Sprintf("%s %.0f", name, v))
		}
	}
	t.Logf("device plugin with 8 fake GPUs: %d MiB resident after registering, %d MiB after %d pods, %d MiB peak (target %d MiB); runtime: %s",
		registered/1024, rss/1024, len(pods), peak/1024, pluginRSSTargetMiB, strings.Join(split, ", "))
	if rss/1024 > pluginRSSLimitMiB {
		t.Errorf("device plugin resident memory %d MiB, want at most %d MiB (target %d MiB)", rss/1024, pluginRSSLimitMiB, pluginRSSTargetMiB)
	}
}

// scrapeGauges reads the Prometheus text at url and returns the value of each unlabelled sample
// named in names; a name that is missing is an error.
func scrapeGauges(url string, names []string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: status %s", url, resp.Status)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	got := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !want[name] {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("scrape %s: %s: %w", url, name, err)
		}
		got[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	for _, n := range names {
		if _, ok := got[n]; !ok {
			return nil, fmt.Errorf("scrape %s: no sample %s", url, n)
		}
	}
	return got, nil
}
