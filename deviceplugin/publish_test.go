package deviceplugin

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/deviceplugin/clientset"
	"github.com/gpuslice/gpuslice/node/publish"
	"github.com/gpuslice/gpuslice/vgpu"
)

// The clientset adapter the tests run the plugin on is an API.
var _ API = (*clientset.API)(nil)

// publishFixture runs a publisher against client-go's fake clientset (a
// stateful in-memory API) with a fake clock.
type publishFixture struct {
	t      *testing.T
	client *fake.Clientset
	clock  *testingclock.FakeClock
	plugin *Plugin
	inv    *inventory
	cancel context.CancelFunc
	done   chan struct{}

	mu          sync.Mutex
	failing     bool // every API call fails, as if the API server were down
	nodeWrite   int  // patches of the Node's metadata
	statusWrite int  // patches of nodes/status (the registration condition)
}

// newPublishFixture starts the API with Node node-1 and objs.
func newPublishFixture(t *testing.T, objs ...runtime.Object) *publishFixture {
	f := &publishFixture{t: t, clock: testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), done: make(chan struct{})}
	f.client = fake.NewClientset(append([]runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "uid-1"}}}, objs...)...)
	f.client.PrependReactor("*", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.failing {
			return true, nil, errors.New("connection refused")
		}
		if action.GetResource().Resource == "nodes" && action.GetVerb() == "patch" {
			if action.GetSubresource() == "status" {
				f.statusWrite++
			} else {
				f.nodeWrite++
			}
		}
		return false, nil, nil
	})
	cfg := validConfig()
	var err error
	if f.inv, err = newInventory(cfg, testGPUs()); err != nil {
		t.Fatal(err)
	}
	if f.plugin, err = New(cfg, staticBackend{}, Options{Client: clientset.New(f.client), Clock: f.clock, PluginVersion: "v-test"}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *publishFixture) start() {
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), ktesting.NewLogger(f.t, ktesting.DefaultConfig)))
	f.cancel = cancel
	pub, err := publish.New(clientset.New(f.client), f.plugin.publishConfig(), publishSource{p: f.plugin, inv: f.inv}, f.clock)
	if err != nil {
		f.t.Fatal(err)
	}
	go func() {
		defer close(f.done)
		pub.Run(ctx)
	}()
	f.t.Cleanup(func() { cancel(); <-f.done })
}

func (f *publishFixture) setFailing(v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing = v
}

func (f *publishFixture) nodeWrites() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodeWrite
}

func (f *publishFixture) statusWrites() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.statusWrite
}

// waitFor polls cond with a deadline, advancing the fake clock past any
// retry timer the publisher waits on.
func (f *publishFixture) waitFor(what string, cond func(node *corev1.Node, heartbeat vgpu.PluginHeartbeat, renew time.Time) bool) {
	f.t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		f.mu.Lock()
		failing := f.failing
		f.mu.Unlock()
		if failing {
			return false, nil
		}
		node, err := f.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", "node-1")
		if err != nil {
			return false, nil //nolint:nilerr // not there yet
		}
		var hb vgpu.PluginHeartbeat
		var renew time.Time
		lease, err := f.client.CoordinationV1().Leases(vgpu.DefaultHeartbeatNamespace).Get(ctx, vgpu.HeartbeatLeaseName("node-1"), metav1.GetOptions{})
		if err == nil {
			hb, _ = vgpu.ParsePluginHeartbeat(lease.Annotations[vgpu.AnnotationPluginHeartbeat])
			renew = lease.Spec.RenewTime.Time
		}
		return cond(node.(*corev1.Node), hb, renew), nil
	})
	if err != nil {
		f.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitTimer waits until the publisher sleeps on the fake clock, so that a
// Step is seen by that sleep.
func (f *publishFixture) waitTimer() {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return f.clock.HasWaiters(), nil
	}); err != nil {
		f.t.Fatal("the publisher never waited on its timer")
	}
}

type staticBackend struct{ gpus []vgpu.GPU }

func (b staticBackend) GPUs() ([]vgpu.GPU, error) { return b.gpus, nil }
func (b staticBackend) WatchHealth(ctx context.Context, _ chan<- vgpu.HealthEvent) error {
	<-ctx.Done()
	return nil
}

func TestPublisher(t *testing.T) {
	f := newPublishFixture(t)
	f.inv.node.Enforcement = vgpu.EnforcementMPS
	f.start()

	f.waitFor("inventory, labels ready false and enforcement mps, an unregistered heartbeat", func(n *corev1.Node, hb vgpu.PluginHeartbeat, _ time.Time) bool {
		inv, err := vgpu.ParseNodeInventory(n.Annotations[vgpu.AnnotationNodeInventory])
		return err == nil && len(inv.GPUs) == 3 && inv.Enforcement == vgpu.EnforcementMPS && n.Labels[vgpu.LabelGPUReady] == "false" &&
			n.Labels[vgpu.LabelEnforcement] == string(vgpu.EnforcementMPS) && hb.Node == "node-1" && !hb.Registered
	})
	f.plugin.setRegistration(registration{Registered: true, Since: f.clock.Now(), Socket: "gpuslice.sock"})
	f.waitFor("label true and a registered heartbeat", func(n *corev1.Node, hb vgpu.PluginHeartbeat, _ time.Time) bool {
		return n.Labels[vgpu.LabelGPUReady] == "true" && hb.Registered && hb.Socket == "gpuslice.sock" && hb.PluginVersion == "v-test"
	})
	writes := f.nodeWrites()

	// Renewals move the Lease only; the Node is never rewritten on a timer.
	for range 3 {
		f.waitTimer()
		f.clock.Step(f.plugin.cfg.LeaseRenew.Duration)
		now := f.clock.Now()
		f.waitFor("a renewed lease", func(_ *corev1.Node, _ vgpu.PluginHeartbeat, renew time.Time) bool { return !renew.Before(now) })
	}
	if got := f.nodeWrites(); got != writes {
		t.Errorf("node written %d times during lease renewals, want 0", got-writes)
	}

	// A health change rewrites the inventory once.
	f.inv.setHealth(vgpu.HealthEvent{UUID: testGPUs()[0].UUID, Health: vgpu.Unhealthy})
	f.waitFor("the unhealthy GPU in the inventory", func(n *corev1.Node, _ vgpu.PluginHeartbeat, _ time.Time) bool {
		inv, err := vgpu.ParseNodeInventory(n.Annotations[vgpu.AnnotationNodeInventory])
		return err == nil && inv.GPUs[1].Health == vgpu.Unhealthy
	})
	if got := f.nodeWrites(); got != writes+1 {
		t.Errorf("node written %d times for one health change, want 1", got-writes)
	}

	// Stopping lifts the barrier.
	f.cancel()
	<-f.done
	f.waitFor("label false after stop", func(n *corev1.Node, hb vgpu.PluginHeartbeat, _ time.Time) bool {
		return n.Labels[vgpu.LabelGPUReady] == "false" && !hb.Registered
	})
}

// TestPublisherLeaseLabel checks that the heartbeat Lease carries
// vgpu.LabelHeartbeat whether the plugin creates it or adopts one an older
// plugin wrote without it, and that other labels survive.
func TestPublisherLeaseLabel(t *testing.T) {
	oldLease := func(labels map[string]string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: vgpu.HeartbeatLeaseName("node-1"), Namespace: vgpu.DefaultHeartbeatNamespace, Labels: labels,
				Annotations: map[string]string{vgpu.AnnotationPluginHeartbeat: `{"version":1}`},
			},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(publish.HolderIdentity(fieldManager, "node-1")), RenewTime: &metav1.MicroTime{}},
		}
	}
	tests := []struct {
		name       string
		objs       []runtime.Object
		wantLabels map[string]string
	}{{
		name:       "created",
		wantLabels: map[string]string{vgpu.LabelHeartbeat: vgpu.LabelHeartbeatValue},
	}, {
		name:       "adopted without labels",
		objs:       []runtime.Object{oldLease(nil)},
		wantLabels: map[string]string{vgpu.LabelHeartbeat: vgpu.LabelHeartbeatValue},
	}, {
		name:       "adopted with a wrong value and another label",
		objs:       []runtime.Object{oldLease(map[string]string{vgpu.LabelHeartbeat: "false", "team": "ml"})},
		wantLabels: map[string]string{vgpu.LabelHeartbeat: vgpu.LabelHeartbeatValue, "team": "ml"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newPublishFixture(t, tt.objs...)
			f.start()
			var lease *coordinationv1.Lease
			f.waitFor("a heartbeat written by this plugin", func(_ *corev1.Node, hb vgpu.PluginHeartbeat, _ time.Time) bool {
				l, err := f.client.CoordinationV1().Leases(vgpu.DefaultHeartbeatNamespace).Get(context.Background(), vgpu.HeartbeatLeaseName("node-1"), metav1.GetOptions{})
				lease = l
				return err == nil && hb.Node == "node-1"
			})
			if diff := cmp.Diff(tt.wantLabels, lease.Labels); diff != "" {
				t.Errorf("Lease labels (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPublisherRetriesWhileAPIServerDown(t *testing.T) {
	f := newPublishFixture(t)
	f.setFailing(true)
	f.plugin.setRegistration(registration{Registered: true, Since: f.clock.Now(), Socket: "gpuslice.sock"})
	f.start()
	// Let the publisher fail a few times, stepping through its back-off.
	for range 5 {
		f.waitTimer()
		f.clock.Step(publish.RetryMax)
	}
	f.setFailing(false)
	for range 100 {
		if f.nodeWrites() > 0 {
			break
		}
		f.clock.Step(publish.RetryMax)
		_ = wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 50*time.Millisecond, true, func(context.Context) (bool, error) {
			return f.nodeWrites() > 0, nil
		})
	}
	f.waitFor("label true once the API server answers", func(n *corev1.Node, hb vgpu.PluginHeartbeat, _ time.Time) bool {
		return n.Labels[vgpu.LabelGPUReady] == "true" && hb.Registered
	})
}
