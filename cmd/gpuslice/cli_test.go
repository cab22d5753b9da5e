package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// fakeCluster is a node with one A100 and a plugin that just renewed its heartbeat, a pod on it,
// a pending pod too big for it and a pod without GPUs, in a fake clientset.
func fakeCluster() connect {
	inv := vgputest.Node("gpu-a").GPU("GPU-a0", 81920).SplitCount(4).Obj()
	placed := vgputest.Pod("train").Container("main").GPU(1).MemoryMiB(40960).NodeName("gpu-a").Obj()
	a, err := vgpu.EncodePodAllocation(vgputest.Allocation("gpu-a").Container("main").Slice("GPU-a0", 40960, 0).Obj())
	if err != nil {
		panic(err)
	}
	placed.Annotations = map[string]string{vgpu.AnnotationPodAllocation: a}
	placed.Status.Phase = corev1.PodRunning
	big := vgputest.Pod("big").Container("main").GPU(1).MemoryMiB(90000).Obj()
	big.Status.Phase = corev1.PodPending
	plain := vgputest.Pod("web").Container("main").NodeName("gpu-a").Obj()
	objs := []runtime.Object{
		vgputest.PublishedNode(inv).Obj(), vgputest.NodeObject("cpu-1").Obj(),
		vgputest.HeartbeatLease("gpu-a", time.Now()).Obj(), placed, big, plain,
	}
	client := fake.NewClientset(objs...)
	return func(k kubeFlags) (kubernetes.Interface, string, error) {
		ns := k.namespace
		if ns == "" {
			ns = "default"
		}
		return client, ns, nil
	}
}

func TestStatusCommand(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := runWith(context.Background(), []string{"status", "-o", "json"}, &out, fakeCluster()); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Nodes []struct {
			Name string
			GPUs []struct {
				MemoryUsedMiB int64
				Pods          []string
			}
		}
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(got.Nodes) != 1 || got.Nodes[0].Name != "gpu-a" || got.Nodes[0].GPUs[0].MemoryUsedMiB != 40960 || strings.Join(got.Nodes[0].GPUs[0].Pods, ",") != "default/train" {
		t.Errorf("status -o json = %s, want gpu-a only with train's 40960 MiB", out.String())
	}
	out.Reset()
	if err := runWith(context.Background(), []string{"status", "--node", "gpu-a"}, &out, fakeCluster()); err != nil {
		t.Fatal(err)
	}
	if want := "[#####.....] 40960/81920 MiB"; !strings.Contains(out.String(), want) || strings.Contains(out.String(), "\x1b[") {
		t.Errorf("status lacks %q or has colours off a terminal:\n%s", want, out.String())
	}
}

func TestStatusWatchStopsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- runWith(ctx, []string{"status", "--watch", "--interval", "10ms"}, &out, fakeCluster()) }()
	deadline := time.After(time.Minute)
	for !strings.Contains(out.String(), "gpu-a") {
		select {
		case <-deadline:
			t.Fatalf("status --watch printed nothing:\n%s", out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("status --watch after cancel: %v", err)
	}
	// Unchanged state is printed once, not on every tick.
	if n := strings.Count(out.String(), "NODE"); n != 1 {
		t.Errorf("status --watch printed the unchanged table %d times, want 1:\n%s", n, out.String())
	}
}

func TestDoctorCommand(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := runWith(context.Background(), []string{"doctor", "gpu-a", "-o", "json"}, &out, fakeCluster())
	// No chart objects: no webhook (a FAIL), no scheduler ConfigMap and no plugin pod, though a
	// plugin heartbeats (WARNs).
	if !errors.Is(err, errChecksFailed) {
		t.Fatalf("doctor error = %v, want errChecksFailed\n%s", err, out.String())
	}
	var r struct {
		Checks []struct{ Node, Name, Result string }
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	results := map[string]string{}
	for _, c := range r.Checks {
		results[c.Node+"/"+c.Name] = c.Result
	}
	for key, want := range map[string]string{
		"gpu-a/heartbeat": "PASS", "gpu-a/inventory": "PASS", "gpu-a/plugin-pod": "WARN",
		"/webhook": "FAIL", "/scheduler-profile": "WARN",
	} {
		if results[key] != want {
			t.Errorf("doctor %s = %q, want %s (all: %v)", key, results[key], want, results)
		}
	}
}

func TestWhyCommand(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := runWith(context.Background(), []string{"why", "big", "-n", "default"}, &out, fakeCluster()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"cpu-1  rejected  NoInventory",
		"gpu-a  rejected  InsufficientMemory  insufficient memory: needs 90000 MiB, largest free 40960 MiB on GPU-a0",
		"closest fit: gpu-a",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("why lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCommandErrors(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		args []string
		want string
	}{
		"status format":   {[]string{"status", "-o", "xml"}, "-o=xml: must be one of wide, json, yaml"},
		"status argument": {[]string{"status", "gpu-a"}, "status takes no arguments"},
		"status node":     {[]string{"status", "--node", "cpu-1"}, "--node=cpu-1: no such GPU node"},
		"interval":        {[]string{"status", "--watch", "--interval", "0s"}, "--interval=0s: must be above 0"},
		"doctor format":   {[]string{"doctor", "-o", "wide"}, "-o=wide: must be one of json"},
		"doctor node":     {[]string{"doctor", "gpu-z"}, `node "gpu-z": not found`},
		"why no pod":      {[]string{"why"}, "why takes one pod name, got 0 arguments"},
		"why missing pod": {[]string{"why", "nope"}, `pod default/nope: pods "nope" not found`},
		"why format":      {[]string{"why", "big", "-o", "wide"}, "-o=wide: must be one of json, yaml"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			err := runWith(context.Background(), tt.args, &out, fakeCluster())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v: error = %v, want it to contain %q", tt.args, err, tt.want)
			}
		})
	}
}

const twoContexts = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: a
  context: {cluster: c, user: u, namespace: team-a}
- name: b
  context: {cluster: c, user: u, namespace: team-b}
current-context: a
`

// TestKubeconfigFlags loads kubeconfigs as kubectl does: --kubeconfig, else $KUBECONFIG;
// --context; -n over the context's namespace. Not parallel: it sets $KUBECONFIG.
func TestKubeconfigFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(path, []byte(twoContexts), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", path)
	for _, tt := range []struct {
		flags kubeFlags
		want  string
	}{
		{kubeFlags{}, "team-a"},
		{kubeFlags{context: "b"}, "team-b"},
		{kubeFlags{kubeconfig: path, context: "b", namespace: "x"}, "x"},
	} {
		_, ns, err := kubeconfigClient(tt.flags)
		if err != nil || ns != tt.want {
			t.Errorf("kubeconfigClient(%+v) namespace = %q, %v; want %q", tt.flags, ns, err, tt.want)
		}
	}
	if _, _, err := kubeconfigClient(kubeFlags{context: "nope"}); err == nil || !strings.Contains(err.Error(), `context "nope"`) {
		t.Errorf("kubeconfigClient(--context nope) error = %v, want it to name the context", err)
	}
	_, _, err := kubeconfigClient(kubeFlags{kubeconfig: "/nonexistent/kubeconfig"})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/kubeconfig") {
		t.Errorf("kubeconfigClient(missing file) error = %v, want it to name the file", err)
	}
}
