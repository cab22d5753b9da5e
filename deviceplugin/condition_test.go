package deviceplugin

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuslice/gpuslice/deviceplugin/clientset"
	"github.com/gpuslice/gpuslice/node/publish"
	"github.com/gpuslice/gpuslice/vgpu"
)

func TestDesiredCondition(t *testing.T) {
	cfg := validConfig()
	inv, err := newInventory(cfg, testGPUs())
	if err != nil {
		t.Fatal(err)
	}
	healthy, _, _ := inv.snapshot()
	sick := healthy
	sick.GPUs = nil
	for _, g := range healthy.GPUs {
		g.Health = vgpu.Unhealthy
		sick.GPUs = append(sick.GPUs, g)
	}
	none := healthy
	none.GPUs = nil
	tests := []struct {
		name   string
		reg    registration
		node   vgpu.NodeInventory
		want   publish.Condition
		wantOK bool
	}{{
		name:   "registered with healthy GPUs",
		reg:    registration{Registered: true},
		node:   healthy,
		want:   publish.Condition{Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered, Message: "registered hami.io/gpu with the kubelet: 3 of 3 GPUs healthy, 10 devices each"},
		wantOK: true,
	}, {
		name: "registered with every GPU unhealthy",
		reg:  registration{Registered: true},
		node: sick,
		want: publish.Condition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonNoHealthyGPUs,
			Message: "registered hami.io/gpu with the kubelet, but all 3 GPUs are unhealthy (GPU-aaaaaaaa-0000-0000-0000-000000000000, GPU-aaaaaaaa-0000-0000-0000-000000000001, GPU-bbbbbbbb-0000-0000-0000-000000000002); see the GPUUnhealthy events"},
		wantOK: true,
	}, {
		name:   "registered with every GPU excluded",
		reg:    registration{Registered: true},
		node:   none,
		want:   publish.Condition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonNoHealthyGPUs, Message: "registered hami.io/gpu with the kubelet, but no GPU is advertised (excludeGPUs leaves none)"},
		wantOK: true,
	}, {
		name:   "a registration problem",
		reg:    registration{Problem: vgpu.ReasonRegisterFailed, Detail: "the kubelet did not accept the registration: boom"},
		node:   healthy,
		want:   publish.Condition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonRegisterFailed, Message: "the kubelet did not accept the registration: boom"},
		wantOK: true,
	}, {
		name: "nothing known yet",
		node: healthy,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := desiredCondition(cfg, tt.reg, tt.node)
			if ok != tt.wantOK {
				t.Fatalf("desiredCondition ok = %v, want %v", ok, tt.wantOK)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("desiredCondition (-want +got):\n%s", diff)
			}
		})
	}
}

// registeredCondition returns the Node's condition as status/reason.
func registeredCondition(n *corev1.Node) string {
	c, ok := vgpu.RegisteredCondition(n)
	if !ok {
		return "none"
	}
	return string(c.Status) + "/" + c.Reason
}

// TestPublisherCondition follows the condition through the plugin's states
// on client-go's fake API: a problem with no condition yet is written at
// once, registration turns it True, a later problem waits publish.ConditionGrace,
// a stop writes PluginStopped, and nothing is rewritten without a change.
func TestPublisherCondition(t *testing.T) {
	f := newPublishFixture(t)
	f.plugin.setProblem(vgpu.ReasonKubeletSocketMissing, "no kubelet.sock")
	f.start()
	f.waitFor("KubeletSocketMissing", func(n *corev1.Node, _ vgpu.PluginHeartbeat, _ time.Time) bool {
		return registeredCondition(n) == "False/KubeletSocketMissing"
	})
	f.plugin.setRegistration(registration{Registered: true, Since: f.clock.Now(), Socket: "gpuslice.sock"})
	f.waitFor("Registered", func(n *corev1.Node, _ vgpu.PluginHeartbeat, _ time.Time) bool {
		return registeredCondition(n) == "True/Registered"
	})
	writes := f.statusWrites()
	for range 2 {
		f.waitTimer()
		f.clock.Step(f.plugin.cfg.LeaseRenew.Duration)
	}
	if got := f.statusWrites(); got != writes {
		t.Errorf("condition written %d times without a change, want 0", got-writes)
	}

	// A kubelet restart: the problem is not written within the grace.
	f.plugin.setRegistration(registration{})
	f.plugin.setProblem(vgpu.ReasonKubeletSocketMissing, "no kubelet.sock")
	f.waitTimer()
	if got := f.statusWrites(); got != writes {
		t.Errorf("condition written %d times within the grace, want 0", got-writes)
	}
	f.clock.Step(publish.ConditionGrace)
	f.waitFor("KubeletSocketMissing after the grace", func(n *corev1.Node, _ vgpu.PluginHeartbeat, _ time.Time) bool {
		return registeredCondition(n) == "False/KubeletSocketMissing"
	})

	f.cancel()
	<-f.done
	f.waitFor("PluginStopped", func(n *corev1.Node, _ vgpu.PluginHeartbeat, _ time.Time) bool {
		return registeredCondition(n) == "False/PluginStopped"
	})
}

func TestReportStartFailure(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: corev1.NodeStatus{
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}},
	}})
	api := clientset.New(client)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for range 2 {
		if err := ReportStartFailure(context.Background(), api, "node-1", vgpu.ReasonDriverNotFound, "libnvidia-ml.so.1 not found", now); err != nil {
			t.Fatal(err)
		}
	}
	n, err := client.CoreV1().Nodes().Get(context.Background(), "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
		{Type: vgpu.ConditionRegistered, Status: corev1.ConditionFalse, Reason: vgpu.ReasonDriverNotFound, Message: "libnvidia-ml.so.1 not found",
			LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)},
	}
	byType := cmpopts.SortSlices(func(a, b corev1.NodeCondition) bool { return a.Type < b.Type })
	if diff := cmp.Diff(want, n.Status.Conditions, byType); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	patches := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" {
			patches++
		}
	}
	if patches != 1 {
		t.Errorf("%d patches for two identical reports, want 1", patches)
	}
}
