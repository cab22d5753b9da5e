package deviceplugin

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/test/harness/apiserver"
	"github.com/gpuslice/gpuslice/test/harness/devicemanager"
	"github.com/gpuslice/gpuslice/vgpu"
)

// withdrawWindow is how long the plugin's not-ready write waits, in
// TestStopMarksNotReadyFirst, to see whether the kubelet loses the devices
// meanwhile: it must not, so the test waits all of it. It bounds a wait for
// something that must not happen, not a synchronisation.
const withdrawWindow = time.Second

// readinessEnv is a real API server holding the plugin's Node (with the
// kubelet's view of allocatable devices set by the test, as no kubelet
// posts the Node's status) and its heartbeat namespace.
type readinessEnv struct {
	admin kubernetes.Interface
	api   deviceplugin.API
}

func startReadinessEnv(t *testing.T) *readinessEnv {
	t.Helper()
	s := apiserver.Start(t, apiserver.Options{})
	e := &readinessEnv{admin: kubernetes.NewForConfigOrDie(s.Config())}
	ctx := waitCtx(t, waitLong)
	if _, err := e.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vgpu.DefaultHeartbeatNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	api, err := deviceplugin.NewAPI(s.Config())
	if err != nil {
		t.Fatal(err)
	}
	e.api = api
	return e
}

// setAllocatable writes the Node's capacity and allocatable GPU devices,
// as the kubelet's node status update does.
func (e *readinessEnv) setAllocatable(t *testing.T, devices int64) {
	t.Helper()
	ctx := waitCtx(t, waitLong)
	n, err := e.admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q := *resource.NewQuantity(devices, resource.DecimalSI)
	n.Status.Capacity = corev1.ResourceList{vgpu.ResourceGPU: q, corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("64Gi")}
	n.Status.Allocatable = n.Status.Capacity
	if _, err := e.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// readyLabel returns the Node's ready label as the API server holds it.
func (e *readinessEnv) readyLabel() string {
	n, err := e.admin.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return n.Labels[vgpu.LabelGPUReady]
}

// watchingAPI is the plugin's real API; once stopping is set, its write of
// the ready label "false" first waits up to withdrawWindow for the
// kubelet to lose the devices, and records whether it did.
type watchingAPI struct {
	deviceplugin.API
	m *devicemanager.Manager

	mu        sync.Mutex
	stopping  bool
	seen      bool // the not-ready write was made while stopping
	withdrawn bool // the kubelet had lost the devices before it
}

func (w *watchingAPI) PatchNode(ctx context.Context, name string, data []byte, opts metav1.PatchOptions) (*corev1.Node, error) {
	w.mu.Lock()
	stopping := w.stopping
	w.mu.Unlock()
	if stopping && bytes.Contains(data, []byte(`"`+vgpu.LabelGPUReady+`":"false"`)) {
		wctx, cancel := context.WithTimeout(ctx, withdrawWindow)
		err := w.m.WaitResource(wctx, resourceName, allDevices, 0)
		cancel()
		w.mu.Lock()
		w.seen, w.withdrawn = true, err == nil
		w.mu.Unlock()
	}
	return w.API.PatchNode(ctx, name, data, opts)
}

// TestStopMarksNotReadyFirst: a plugin that stops (SIGTERM, a rollout)
// marks its node not ready while it still serves the kubelet, so that no
// pod is sent to the node in the moment the kubelet has lost the devices
// and the Node still says ready (such a pod fails with
// UnexpectedAdmissionError).
func TestStopMarksNotReadyFirst(t *testing.T) {
	t.Parallel()
	e := startReadinessEnv(t)
	dir := t.TempDir()
	m := devicemanager.Start(t, dir)
	api := &watchingAPI{API: e.api, m: m}
	p := startPlugin(t, dir, api)
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, allDevices, allDevices); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, waitLong, "ready label true", func() bool { return e.readyLabel() == "true" })

	api.mu.Lock()
	api.stopping = true
	api.mu.Unlock()
	p.stop()
	api.mu.Lock()
	seen, withdrawn := api.seen, api.withdrawn
	api.mu.Unlock()
	switch {
	case !seen:
		t.Fatal("the stopping plugin never wrote the ready label false")
	case withdrawn:
		t.Error("the kubelet lost the devices before the stopping plugin had marked its node not ready")
	}
	if got := e.readyLabel(); got != "false" {
		t.Errorf("ready label %q after the plugin stopped, want false", got)
	}
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, allDevices, 0); err != nil {
		t.Errorf("plugin stopped: %v", err)
	}
}

// TestKubeletRestartRefusesNode follows what the extender's Filter says of
// a node through a kubelet restart, on a real API server with the real
// kubelet device manager, plugin and extender: the node is accepted while
// the plugin is registered; refused as not ready the moment the kubelet
// goes (the plugin's ListAndWatch stream ends, it publishes not
// registered); refused while allocatable is 0, as the restarted kubelet
// reports it until the plugin has registered again and its status is
// posted, even once the plugin says registered; accepted once both hold.
func TestKubeletRestartRefusesNode(t *testing.T) {
	t.Parallel()
	e := startReadinessEnv(t)
	e.setAllocatable(t, allDevices)
	dir := t.TempDir()
	m := devicemanager.Start(t, dir)
	startPlugin(t, dir, e.api)
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, allDevices, allDevices); err != nil {
		t.Fatal(err)
	}

	s, err := extender.New(extender.DefaultConfig(), extender.Options{Client: e.admin})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))))
	watched := make(chan error, 1)
	go func() { watched <- s.WatchCluster(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-watched; err != nil {
			t.Errorf("extender WatchCluster: %v", err)
		}
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "slice", Namespace: metav1.NamespaceDefault, UID: "uid-slice"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			vgpu.ResourceGPU: resource.MustParse("1"), vgpu.ResourceMemory: resource.MustParse("1024"),
		}}}}},
	}
	// filter returns "" when the extender's Filter accepts the node, else
	// why it refuses it.
	filter := func() string {
		res, err := s.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{nodeName}})
		switch {
		case err != nil:
			return err.Error()
		case res.Error != "":
			return res.Error
		case res.NodeNames != nil && slices.Contains(*res.NodeNames, nodeName):
			return ""
		case res.FailedAndUnresolvableNodes[nodeName] != "":
			return res.FailedAndUnresolvableNodes[nodeName]
		}
		return res.FailedNodes[nodeName]
	}
	waitFilter := func(what string, ok func(why string) bool) {
		t.Helper()
		var why string
		err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, waitLong, true, func(context.Context) (bool, error) {
			why = filter()
			return ok(why), nil
		})
		if err != nil {
			t.Fatalf("waiting for the extender's Filter to %s: last said %q: %v", what, why, err)
		}
	}
	accepts := func(why string) bool { return why == "" }
	refusesFor := func(want string) func(string) bool {
		return func(why string) bool { return strings.Contains(why, want) }
	}
	waitFilter("accept the registered node", accepts)

	// The kubelet exits; while it is away the node is refused.
	m.Stop()
	waitFilter("refuse the node while the kubelet is away", refusesFor(vgpu.NotReadyPrefix+"label "+vgpu.LabelGPUReady+` is "false"`))

	// A kubelet starts again and posts allocatable 0 until the plugin has
	// registered with it; the plugin registers within milliseconds.
	e.setAllocatable(t, 0)
	m = devicemanager.Start(t, dir)
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, allDevices, allDevices); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, waitLong, "ready label true again", func() bool { return e.readyLabel() == "true" })
	waitFilter("refuse the node while its allocatable is 0", refusesFor(vgpu.NotReadyPrefix+"allocatable "+string(vgpu.ResourceGPU)+" is 0"))
	e.setAllocatable(t, allDevices)
	waitFilter("accept the node once its allocatable is back", accepts)
}
