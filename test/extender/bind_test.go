package extender

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/test/harness/apiserver"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

const (
	// gpuMiB is each node's one GPU; podMiB is what each pod asks of it,
	// so that two pods never fit on one GPU.
	gpuMiB = 16384
	podMiB = 10000
	// waitTimeout bounds each wait on the API server or the extender.
	waitTimeout = time.Minute
)

// env is a real API server, the proxy in front of it, and an extender
// that reaches the API server only through the proxy, on a fake clock.
type env struct {
	admin kubernetes.Interface
	proxy *holdingProxy
	clock *clocktesting.FakePassiveClock
	cfg   extender.Config
	s     *extender.Scheduler
}

// startEnv starts the API server with the Nodes of nodes (one GPU each,
// published as a healthy device plugin leaves them, heartbeat fresh), the
// proxy and the extender, and waits until the extender is ready.
func startEnv(t *testing.T, nodes ...string) *env {
	t.Helper()
	srv := apiserver.Start(t, apiserver.Options{})
	e := &env{admin: kubernetes.NewForConfigOrDie(srv.Config()), proxy: startProxy(t, srv.Config()), clock: clocktesting.NewFakePassiveClock(time.Now())}
	ctx := waitCtx(t)
	if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vgpu.DefaultHeartbeatNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, name := range nodes {
		node := vgputest.PublishedNode(vgputest.Node(name).GPU(gpuUUID(name), gpuMiB).Obj()).Obj()
		node.UID = ""
		created, err := e.admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = node.Status
		if _, err := e.admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.admin.CoordinationV1().Leases(vgpu.DefaultHeartbeatNamespace).Create(ctx, vgputest.HeartbeatLease(name, e.clock.Now()).Obj(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	e.cfg = extender.DefaultConfig()
	e.cfg.BindTimeout = metav1.Duration{Duration: 2 * time.Second}
	// The fake clock moves past the outcome wait: the heartbeats must
	// stay fresh all the same.
	e.cfg.HeartbeatMaxAge = metav1.Duration{Duration: 24 * time.Hour}
	e.cfg.Workload = extender.WorkloadDefault
	client, err := kubernetes.NewForConfig(&rest.Config{Host: e.proxy.url, QPS: 1000, Burst: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if e.s, err = extender.New(e.cfg, extender.Options{Client: client, Clock: e.clock}); err != nil {
		t.Fatal(err)
	}
	_, runCtx := ktesting.NewTestContext(t)
	runCtx, cancel := context.WithCancel(runCtx)
	done := make(chan error, 1)
	go func() { done <- e.s.WatchCluster(runCtx) }()
	// The API server stops after this (cleanups run last first), so the
	// extender's watches end first.
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchCluster: %v", err)
		}
	})
	waitUntil(t, "the extender ready", e.s.Ready)
	return e
}

// gpuUUID is the one GPU of node.
func gpuUUID(node string) string { return node + "-GPU-0" }

// createPod creates an unbound pod asking for podMiB of one GPU and
// returns it as the API server has it.
func (e *env) createPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pod := vgputest.Pod(name).Container("main").GPU(1).MemoryMiB(podMiB).Cores(10).Obj()
	pod.UID = ""
	pod.Spec.SchedulerName = "gpuslice-test" // no kube-scheduler runs; the test is the scheduler
	created, err := e.admin.CoreV1().Pods(pod.Namespace).Create(waitCtx(t), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// bind asks the extender to bind pod to node, as kube-scheduler does, and
// returns the result's Error ("" when bound).
func (e *env) bind(t *testing.T, pod *corev1.Pod, node string) string {
	t.Helper()
	res, err := e.s.Bind(context.Background(), &extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	return res.Error
}

// boundTo returns the names of the pods the API server has bound to node.
func (e *env) boundTo(t *testing.T, node string) []string {
	t.Helper()
	pods, err := e.admin.CoreV1().Pods(metav1.NamespaceDefault).List(waitCtx(t), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	return names
}

// checkNotOvercommitted fails t when the pods the API server has bound to
// node hold more of its GPU's memory, by their allocations, than it has.
func (e *env) checkNotOvercommitted(t *testing.T, node string) {
	t.Helper()
	pods, err := e.admin.CoreV1().Pods(metav1.NamespaceDefault).List(waitCtx(t), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	var holders []string
	for _, p := range pods.Items {
		alloc, err := vgpu.ParsePodAllocation(p.Annotations[vgpu.AnnotationPodAllocation])
		if err != nil {
			t.Errorf("pod %s bound to %s: %v", p.Name, node, err)
			continue
		}
		for _, c := range alloc.Containers {
			for _, g := range c.GPUs {
				if g.UUID == gpuUUID(node) {
					held += g.MemoryMiB
					holders = append(holders, p.Name)
				}
			}
		}
	}
	if held > gpuMiB {
		t.Errorf("GPU %s of %d MiB is given to pods %s, %d MiB in all", gpuUUID(node), gpuMiB, strings.Join(holders, " and "), held)
	}
}

// TestBindCommittedAfterTimeout posts a pod's Binding through a proxy that
// holds it until the extender's request has timed out, so that the
// extender cannot tell whether the pod is bound: its read of the pod finds
// it unbound while the Binding is still on its way. Another pod then asks
// for the same GPU. In "late commit" the held Binding reaches the API
// server after that, and is committed: the GPU must not have been given to
// the second pod too. In "never committed" the Binding is dropped: once
// the outcome wait has passed, a read that finds the pod still unbound
// frees the GPU, and the second pod gets it.
func TestBindCommittedAfterTimeout(t *testing.T) {
	e := startEnv(t, "n1", "n2")

	t.Run("late commit", func(t *testing.T) {
		first, second := e.createPod(t, "late-first"), e.createPod(t, "late-second")
		e.proxy.holdBindings(first.Name)
		if got := e.bind(t, first, "n1"); got == "" {
			t.Fatal("the first pod's bind succeeded though its Binding never reached the API server")
		}
		held := e.proxy.next(t)
		secondErr := e.bind(t, second, "n1")
		// The first Binding reaches the API server now, long after the
		// extender gave up on it, and binds the pod.
		code, err := e.proxy.commit(waitCtx(t), held)
		if err != nil || code != http.StatusCreated {
			t.Fatalf("the held Binding: status %d, %v; want %d", code, err, http.StatusCreated)
		}
		e.checkNotOvercommitted(t, "n1")
		if secondErr == "" {
			t.Errorf("the second pod was bound to n1 while the first pod's Binding was still on its way")
		} else if !strings.Contains(secondErr, "n1") {
			t.Errorf("the second pod's bind: %q, want a refusal naming node n1", secondErr)
		}
		if diff := fmt.Sprint(e.boundTo(t, "n1")); diff != "["+first.Name+"]" {
			t.Errorf("pods bound to n1: %s, want only %s", diff, first.Name)
		}
		// The informer sees the first pod bound: its allocation counts once.
		waitUntil(t, "the first pod counted once on n1", func() bool {
			return e.s.NodeUsage("n1").GPU(gpuUUID("n1")).MemoryMiB == podMiB && e.s.Ready()
		})
	})

	t.Run("never committed", func(t *testing.T) {
		first, second := e.createPod(t, "lost-first"), e.createPod(t, "lost-second")
		e.proxy.holdBindings(first.Name)
		if got := e.bind(t, first, "n2"); got == "" {
			t.Fatal("the first pod's bind succeeded though its Binding never reached the API server")
		}
		_ = e.proxy.next(t) // dropped: it never reaches the API server
		if got := e.bind(t, second, "n2"); got == "" {
			t.Error("the second pod was bound to n2 while the first pod's Binding might still land")
		}
		// Past the outcome wait, the extender reads the first pod again,
		// finds it still unbound and frees its GPU.
		e.clock.SetTime(e.clock.Now().Add(e.cfg.BindOutcomeWait.Duration + time.Second))
		var last string
		waitUntil(t, "the second pod bound to n2", func() bool {
			last = e.bind(t, second, "n2")
			return last == ""
		})
		if got := fmt.Sprint(e.boundTo(t, "n2")); got != "["+second.Name+"]" {
			t.Errorf("pods bound to n2: %s, want only %s", got, second.Name)
		}
		waitUntil(t, "only the second pod counted on n2", func() bool {
			return e.s.NodeUsage("n2").GPU(gpuUUID("n2")).MemoryMiB == podMiB
		})
	})
}

// waitCtx bounds a test's calls to the API server.
func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// waitUntil polls cond until it holds, failing t after waitTimeout.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, waitTimeout, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
