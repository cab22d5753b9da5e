package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestMain(m *testing.M) {
	// The fake clientset's watchers panic once 100 events wait unread; the
	// bind race writes hundreds within milliseconds. A real API server
	// has no such limit.
	watch.DefaultChanSize = 100_000
	os.Exit(m.Run())
}

// now is the fixed time of the fake clock; heartbeats are fresh relative
// to it.
var now = time.Date(2026, 3, 14, 9, 30, 0, 0, time.UTC)

var podsResource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// env is a Scheduler on a fake clientset with real informers, served by an
// httptest server.
type env struct {
	t      testing.TB
	client *fake.Clientset
	clock  *clocktesting.FakePassiveClock
	s      *Scheduler
	srv    *httptest.Server
}

// newEnv starts a Scheduler with cfg over objs and waits for its informers.
func newEnv(t testing.TB, cfg Config, objs ...runtime.Object) *env {
	t.Helper()
	return startEnv(t, cfg, newFakeClient(objs...))
}

// newFakeClient is a fake clientset over objs that binds like an API server.
func newFakeClient(objs ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objs...)
	emulateBinding(c)
	return c
}

// startEnv starts a Scheduler on an existing clientset.
func startEnv(t testing.TB, cfg Config, client *fake.Clientset) *env {
	t.Helper()
	e := &env{t: t, client: client, clock: clocktesting.NewFakePassiveClock(now)}
	s, err := New(cfg, Options{Client: client, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	e.s = s
	// The Scheduler logs from goroutines of its own. A logger bound to a
	// testing.F must not be used once f.Fuzz runs (the race detector
	// catches its "ready" line racing with the fuzz target's start), so
	// fuzz tests discard the log.
	ctx := klog.NewContext(context.Background(), logr.Discard())
	if _, fuzz := t.(*testing.F); !fuzz {
		_, ctx = ktesting.NewTestContext(t)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.WatchCluster(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchCluster: %v", err)
		}
	})
	waitFor(t, "informers synced", s.Ready)
	e.srv = httptest.NewServer(s.Handler())
	t.Cleanup(e.srv.Close)
	return e
}

// emulateBinding makes the fake clientset act on pods/binding as the API
// server does: set spec.nodeName once, with a UID precondition, and copy
// the Binding's annotations onto the pod in the same update.
func emulateBinding(c *fake.Clientset) {
	c.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		create, ok := action.(k8stesting.CreateAction)
		if !ok || action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b, ok := create.GetObject().(*corev1.Binding)
		if !ok {
			return true, nil, apierrors.NewBadRequest("not a Binding")
		}
		obj, err := c.Tracker().Get(podsResource, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		switch {
		case b.UID != "" && b.UID != pod.UID:
			return true, nil, apierrors.NewConflict(podsResource.GroupResource(), b.Name, fmt.Errorf("UID precondition failed"))
		case pod.Spec.NodeName != "":
			return true, nil, apierrors.NewConflict(podsResource.GroupResource(), b.Name, fmt.Errorf("pod is already assigned to node %q", pod.Spec.NodeName))
		}
		pod.Spec.NodeName = b.Target.Name
		for k, v := range b.Annotations {
			if pod.Annotations == nil {
				pod.Annotations = map[string]string{}
			}
			pod.Annotations[k] = v
		}
		return true, b, c.Tracker().Update(podsResource, pod, b.Namespace)
	})
}

// waitFor waits up to 20 s for cond.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 2*time.Millisecond, 20*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// post sends v as JSON to path and decodes a 200 answer into out. It
// returns the status and, for other statuses, the body.
func (e *env) post(path string, v, out any) (int, string) {
	e.t.Helper()
	body, err := json.Marshal(v)
	if err != nil {
		e.t.Fatal(err)
	}
	return postRaw(e.t, e.srv.URL+path, "application/json", body, out)
}

func postRaw(t testing.TB, url, contentType string, body []byte, out any) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("POST %s: decode %s: %v", url, data, err)
		}
	}
	return resp.StatusCode, string(data)
}

// filter calls /filter with node names (nodeCacheCapable).
func (e *env) filter(pod *corev1.Pod, names ...string) extenderv1.ExtenderFilterResult {
	e.t.Helper()
	var out extenderv1.ExtenderFilterResult
	if code, body := e.post("/filter", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}, &out); code != http.StatusOK {
		e.t.Fatalf("/filter: HTTP %d: %s", code, body)
	}
	return out
}

// prioritize calls /prioritize with node names.
func (e *env) prioritize(pod *corev1.Pod, names ...string) extenderv1.HostPriorityList {
	e.t.Helper()
	var out extenderv1.HostPriorityList
	if code, body := e.post("/prioritize", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}, &out); code != http.StatusOK {
		e.t.Fatalf("/prioritize: HTTP %d: %s", code, body)
	}
	return out
}

// bind calls /bind for pod, as kube-scheduler does after choosing node.
func (e *env) bind(pod *corev1.Pod, node string) extenderv1.ExtenderBindingResult {
	e.t.Helper()
	var out extenderv1.ExtenderBindingResult
	args := extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node}
	if code, body := e.post("/bind", args, &out); code != http.StatusOK {
		e.t.Fatalf("/bind: HTTP %d: %s", code, body)
	}
	return out
}

// getPod reads a pod from the fake API server.
func (e *env) getPod(pod *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// createPod creates a pod on the fake API server.
func (e *env) createPod(pod *corev1.Pod) {
	e.t.Helper()
	if _, err := e.client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// settled waits until no reservation is left: every bind the informers
// will see has been seen.
func (e *env) settled() {
	e.t.Helper()
	waitFor(e.t, "reservations confirmed or released", func() bool { return e.s.state.Reservations() == 0 })
}

// gpuNode returns a published Node of gpus GPUs of memMiB each, named
// "<name>-GPU-<i>", and its fresh heartbeat Lease.
func gpuNode(name string, gpus int, memMiB int64) (*vgpu.NodeInventory, []runtime.Object) {
	b := vgputest.Node(name)
	for i := range gpus {
		b.GPU(fmt.Sprintf("%s-GPU-%d", name, i), memMiB)
	}
	inv := b.Obj()
	return &inv, []runtime.Object{
		vgputest.PublishedNode(inv).Obj(),
		vgputest.HeartbeatLease(name, now.Add(-5*time.Second)).Obj(),
	}
}

// objects flattens lists of objects.
func objects(lists ...[]runtime.Object) []runtime.Object {
	var out []runtime.Object
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// boundPod returns the pod of b bound to alloc.Node with alloc as its
// allocation annotation.
func boundPod(b *vgputest.PodBuilder, alloc vgpu.PodAllocation) *corev1.Pod {
	s, err := vgpu.EncodePodAllocation(alloc)
	if err != nil {
		panic(err)
	}
	return b.NodeName(alloc.Node).Annotation(vgpu.AnnotationPodAllocation, s).Obj()
}

// usageTable is node's usage of each of inv's GPUs, for comparison.
func usageTable(s *Scheduler, inv *vgpu.NodeInventory) map[string]vgpu.GPUUsage {
	u := s.NodeUsage(inv.Node)
	out := map[string]vgpu.GPUUsage{}
	for _, g := range inv.GPUs {
		if gu := u.GPU(g.UUID); gu != (vgpu.GPUUsage{}) {
			out[g.UUID] = gu
		}
	}
	return out
}

// testConfig is DefaultConfig with a port tests never bind.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Address = "127.0.0.1:0"
	return cfg
}
