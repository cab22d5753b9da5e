package deviceplugin

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/metricstest"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// eventBackend serves fixed GPUs and forwards the health events a test
// sends.
type eventBackend struct {
	gpus   []vgpu.GPU
	events chan vgpu.HealthEvent
}

func (b *eventBackend) GPUs() ([]vgpu.GPU, error) { return b.gpus, nil }

func (b *eventBackend) WatchHealth(ctx context.Context, out chan<- vgpu.HealthEvent) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-b.events:
			select {
			case out <- ev:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// TestMetricsLifecycle runs a plugin against a kubelet that refuses its
// first Register, then scrapes /metrics of ProbeHandler: one failed and one
// successful registration, the registered gauge, and each GPU's health,
// which follows a device fault.
func TestMetricsLifecycle(t *testing.T) {
	dir := t.TempDir()
	newFakeKubelet(t, dir, 1, true)

	cfg := validConfig()
	cfg.DevicePluginDir, cfg.CDISpecDir, cfg.StateDir = dir, t.TempDir(), t.TempDir()
	cfg.PodResourcesSocket = filepath.Join(dir, "no-pod-resources.sock")
	backend := &eventBackend{gpus: testGPUs(), events: make(chan vgpu.HealthEvent)}
	p, err := New(cfg, backend, Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.ProbeHandler())
	defer srv.Close()
	scrape := func() map[string]float64 {
		return metricstest.Pick(metricstest.Scrape(t, srv.Client(), srv.URL+"/metrics"),
			MetricRegistrations, MetricRegistered, MetricGPUHealthy)
	}
	before := map[string]float64{
		`gpuslice_deviceplugin_registrations_total{result="success"}`: 0,
		`gpuslice_deviceplugin_registrations_total{result="failure"}`: 0,
		`gpuslice_deviceplugin_registered`:                            0,
	}
	if diff := cmp.Diff(before, scrape()); diff != "" {
		t.Errorf("metrics before Run (-want +got):\n%s", diff)
	}

	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), ktesting.NewLogger(t, ktesting.DefaultConfig)))
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitUntil(t, "registered", p.Registered)
	want := map[string]float64{
		`gpuslice_deviceplugin_registrations_total{result="success"}`:                       1,
		`gpuslice_deviceplugin_registrations_total{result="failure"}`:                       1,
		`gpuslice_deviceplugin_registered`:                                                  1,
		`gpuslice_deviceplugin_gpu_healthy{gpu="GPU-aaaaaaaa-0000-0000-0000-000000000000"}`: 1,
		`gpuslice_deviceplugin_gpu_healthy{gpu="GPU-aaaaaaaa-0000-0000-0000-000000000001"}`: 1,
		`gpuslice_deviceplugin_gpu_healthy{gpu="GPU-bbbbbbbb-0000-0000-0000-000000000002"}`: 1,
	}
	if diff := cmp.Diff(want, scrape()); diff != "" {
		t.Errorf("metrics once registered (-want +got):\n%s", diff)
	}

	backend.events <- vgpu.HealthEvent{UUID: "GPU-bbbbbbbb-0000-0000-0000-000000000002", Health: vgpu.Unhealthy, Reason: "XID 79"}
	series := `gpuslice_deviceplugin_gpu_healthy{gpu="GPU-bbbbbbbb-0000-0000-0000-000000000002"}`
	waitUntil(t, "the faulty GPU unhealthy in the metrics", func() bool { return scrape()[series] == 0 })
}

// TestMetricsHandoff counts Allocate and PreStartContainer results: success,
// a refusal by its event reason, other failures by gRPC code; and times
// every GetPreferredAllocation, Allocate and PreStartContainer call.
func TestMetricsHandoff(t *testing.T) {
	f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
	reg := prometheus.NewRegistry()
	p, err := New(f.cfg, staticBackend{}, Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	f.alloc.metrics = p.metrics
	good, missing, unheld := DeviceID(gpuA, 1), DeviceID(gpuA, 2), DeviceID(gpuB, 3)

	f.addPod(gpuPod("p", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0)), "main"))
	preferred := f.alloc.preferred(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: []string{good, unheld}, AllocationSize: 1,
	}}})
	if got := preferred.GetContainerResponses()[0].GetDeviceIDs(); !slices.Equal(got, []string{good}) {
		t.Fatalf("preferred = %v, want [%s]", got, good)
	}
	if _, err := f.allocate(good); err != nil {
		t.Fatal(err)
	}
	if _, err := f.allocate("nvidia0"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("allocate(nvidia0) = %v, want InvalidArgument", err)
	}
	f.addPod(gpuPod("bare", time.Now(), nil, "main"))
	f.podRes.hold("default", "p", "main", good)
	f.podRes.hold("default", "bare", "main", missing)
	for _, tt := range []struct {
		id   string
		want codes.Code
	}{{good, codes.OK}, {good, codes.OK}, {missing, codes.FailedPrecondition}, {unheld, codes.FailedPrecondition}, {"nvidia0", codes.InvalidArgument}} {
		if err := f.preStart(tt.id); status.Code(err) != tt.want {
			t.Fatalf("preStart(%s) = %v, want %v", tt.id, err, tt.want)
		}
	}

	srv := httptest.NewServer(p.ProbeHandler())
	defer srv.Close()
	samples := metricstest.Scrape(t, srv.Client(), srv.URL+"/metrics")
	got := metricstest.Pick(samples, MetricAllocate, MetricPreStart, MetricCallDuration+"_count")
	want := map[string]float64{
		MetricCallDuration + `_count{call="GetPreferredAllocation"}`:          1,
		MetricCallDuration + `_count{call="Allocate"}`:                        2,
		MetricCallDuration + `_count{call="PreStartContainer"}`:               5,
		`gpuslice_deviceplugin_allocate_total{result="success"}`:              1,
		`gpuslice_deviceplugin_allocate_total{result="InvalidArgument"}`:      1,
		`gpuslice_deviceplugin_prestart_total{result="success"}`:              2,
		`gpuslice_deviceplugin_prestart_total{result="GPUAllocationMissing"}`: 1,
		`gpuslice_deviceplugin_prestart_total{result="FailedPrecondition"}`:   1,
		`gpuslice_deviceplugin_prestart_total{result="InvalidArgument"}`:      1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	for _, call := range HandoffCalls() {
		if sum := samples[metricstest.Series(MetricCallDuration+"_sum", "call", call)]; !(sum > 0) {
			t.Errorf("%s calls took %v s in all, want more than 0", call, sum)
		}
	}
	if _, ok := samples["go_goroutines"]; ok {
		t.Error("a given Registry got the Go collector added")
	}
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
