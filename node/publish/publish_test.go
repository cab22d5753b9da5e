package publish_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuslice/gpuslice/node/publish"
	"github.com/gpuslice/gpuslice/node/publish/clientset"
	"github.com/gpuslice/gpuslice/vgpu"
)

// source is a publish.Source whose state a test sets.
type source struct {
	mu  sync.Mutex
	reg publish.Registration
	sig chan struct{}
}

func (s *source) Inventory() (vgpu.NodeInventory, <-chan struct{}) {
	return vgpu.NodeInventory{Node: "node-a", GPUs: []vgpu.GPU{{UUID: "GPU-0", Health: vgpu.Healthy}}}, nil
}

func (s *source) Registration() (publish.Registration, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reg, s.sig
}

func (s *source) Condition(reg publish.Registration, _ vgpu.NodeInventory) (publish.Condition, bool) {
	if !reg.Registered {
		return publish.Condition{Status: corev1.ConditionFalse, Reason: reg.Problem, Message: reg.Detail}, reg.Problem != ""
	}
	return publish.Condition{Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered, Message: "ok"}, true
}

func draConfig() publish.Config {
	return publish.Config{
		NodeName: "node-a", Mode: vgpu.NodeModeDRA, ResourceName: "gpuslice.hami.io", Version: "v1", FieldManager: "gpuslice-dra-plugin",
		HeartbeatNamespace: "kube-node-lease", LeaseDuration: 40 * time.Second, LeaseRenew: 10 * time.Second,
		Stopped: publish.Registration{Problem: vgpu.ReasonPluginStopped, Detail: "stopped"},
	}
}

// TestPublisherWithoutInventory checks the DRA driver's use: the condition and a heartbeat that
// says DRA mode are written, the Node's labels and annotations are left alone (the extender
// would read a ready label as a device-plugin node's), and a stop writes Config.Stopped.
func TestPublisherWithoutInventory(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "uid-a"}})
	src := &source{reg: publish.Registration{Registered: true, Since: time.Now(), Socket: "/plugins/dra.sock"}, sig: make(chan struct{})}
	pub, err := publish.New(clientset.New(client), draConfig(), src, clocktesting.NewFakeClock(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); pub.Run(ctx) }()

	var node *corev1.Node
	condition := func(want corev1.ConditionStatus, reason string) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			node, err = client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			c, ok := vgpu.RegisteredCondition(node)
			return ok && c.Status == want && c.Reason == reason, nil
		}); err != nil {
			t.Fatalf("condition never %s/%s: %+v", want, reason, node.Status.Conditions)
		}
	}
	condition(corev1.ConditionTrue, vgpu.ReasonRegistered)
	if len(node.Labels)+len(node.Annotations) > 0 {
		t.Errorf("node labels %v, annotations %v: want none written without Config.NodeInventory", node.Labels, node.Annotations)
	}
	lease, err := client.CoordinationV1().Leases("kube-node-lease").Get(context.Background(), vgpu.HeartbeatLeaseName("node-a"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := vgpu.ParsePluginHeartbeat(lease.Annotations[vgpu.AnnotationPluginHeartbeat])
	if err != nil {
		t.Fatal(err)
	}
	if h.Mode != vgpu.NodeModeDRA || !h.Registered || h.ResourceName != "gpuslice.hami.io" || *lease.Spec.HolderIdentity != "gpuslice-dra-plugin/node-a" {
		t.Errorf("heartbeat %+v, holder %s: want DRA mode, registered, gpuslice.hami.io, gpuslice-dra-plugin/node-a", h, *lease.Spec.HolderIdentity)
	}

	cancel()
	<-done
	condition(corev1.ConditionFalse, vgpu.ReasonPluginStopped)
}

func TestConfigValidate(t *testing.T) {
	c := draConfig()
	c.NodeName, c.LeaseRenew = "", time.Minute
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "NodeName is required") || !strings.Contains(err.Error(), "LeaseRenew 1m0s must be above 0 and below LeaseDuration 40s") {
		t.Errorf("Validate: %v, want NodeName and LeaseRenew named", err)
	}
	if _, err := publish.New(nil, c, nil, nil); err == nil {
		t.Error("New accepted an invalid Config")
	}
}
