package extender

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

func TestJudgeRegistration(t *testing.T) {
	const maxAge = time.Minute
	registered := corev1.NodeCondition{Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered}
	fresh := cluster.Registration{Name: "n1", Condition: registered, Allocatable: 10, HasLease: true, RenewTime: now.Add(-10 * time.Second)}
	with := func(mutate func(r *cluster.Registration)) cluster.Registration {
		r := fresh
		mutate(&r)
		return r
	}
	tests := []struct {
		name       string
		r          cluster.Registration
		zeroSince  time.Time
		wantStatus corev1.ConditionStatus // "": no change
		wantReason string
		wantIn     string // a part of the message
	}{
		{name: "registered and fresh", r: fresh},
		{name: "stale heartbeat", r: with(func(r *cluster.Registration) { r.RenewTime = now.Add(-2 * maxAge) }),
			wantStatus: corev1.ConditionUnknown, wantReason: vgpu.ReasonHeartbeatStale, wantIn: "kube-node-lease/gpuslice-n1 was last renewed at 2026-03-14T09:28:00Z"},
		{name: "no heartbeat Lease", r: with(func(r *cluster.Registration) { r.HasLease = false }),
			wantStatus: corev1.ConditionUnknown, wantReason: vgpu.ReasonHeartbeatStale, wantIn: "kube-node-lease/gpuslice-n1 is missing"},
		{name: "stale, already Unknown", r: with(func(r *cluster.Registration) {
			r.HasLease, r.Condition = false, corev1.NodeCondition{Status: corev1.ConditionUnknown, Reason: vgpu.ReasonHeartbeatStale}
		})},
		{name: "stale after the plugin said it stopped", r: with(func(r *cluster.Registration) {
			r.HasLease, r.Condition = false, corev1.NodeCondition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonPluginStopped}
		})},
		{name: "stale after the plugin found no driver", r: with(func(r *cluster.Registration) {
			r.HasLease, r.Condition = false, corev1.NodeCondition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonDriverNotFound}
		})},
		{name: "stale after a registration problem", r: with(func(r *cluster.Registration) {
			r.RenewTime, r.Condition = now.Add(-2*maxAge), corev1.NodeCondition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonRegisterFailed}
		}), wantStatus: corev1.ConditionUnknown, wantReason: vgpu.ReasonHeartbeatStale, wantIn: "(it last reported RegisterFailed)"},
		{name: "allocatable 0 within the grace", r: with(func(r *cluster.Registration) { r.Allocatable = 0 }), zeroSince: now.Add(-maxAge / 2)},
		{name: "allocatable 0 for maxAge", r: with(func(r *cluster.Registration) { r.Allocatable = 0 }), zeroSince: now.Add(-maxAge),
			wantStatus: corev1.ConditionFalse, wantReason: vgpu.ReasonNoAllocatableGPUs, wantIn: "allocatable hami.io/gpu has been 0 for more than 1m0s"},
		{name: "allocatable 0 under a False condition", r: with(func(r *cluster.Registration) {
			r.Allocatable, r.Condition = 0, corev1.NodeCondition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonNoHealthyGPUs}
		}), zeroSince: now.Add(-2 * maxAge)},
		{name: "DRA node: allocatable 0 is its normal", r: with(func(r *cluster.Registration) { r.Allocatable, r.DRA = 0, true }), zeroSince: now.Add(-2 * maxAge)},
		{name: "DRA node: stale heartbeat", r: with(func(r *cluster.Registration) { r.Allocatable, r.DRA, r.RenewTime = 0, true, now.Add(-2*maxAge) }),
			wantStatus: corev1.ConditionUnknown, wantReason: vgpu.ReasonHeartbeatStale, wantIn: "the DRA driver's heartbeat Lease kube-node-lease/gpuslice-n1 was last renewed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, change := judgeRegistration(tt.r, now, tt.zeroSince, maxAge, vgpu.DefaultHeartbeatNamespace, string(vgpu.ResourceGPU))
			if change != (tt.wantStatus != "") {
				t.Fatalf("judgeRegistration change = %v (%+v), want %v", change, got, tt.wantStatus != "")
			}
			if got.Status != tt.wantStatus || got.Reason != tt.wantReason || !strings.Contains(got.Message, tt.wantIn) {
				t.Errorf("judgeRegistration = %+v, want %s/%s with %q", got, tt.wantStatus, tt.wantReason, tt.wantIn)
			}
		})
	}
}

// TestConditionControllerPass runs passes of the controller over a fake
// API: a stale node turns Unknown once, with one Node event; a node whose
// allocatable stays 0 turns False after HeartbeatMaxAge; a fresh one is
// left alone.
func TestConditionControllerPass(t *testing.T) {
	inv1, _ := gpuNode("stale", 1, 16384)
	inv2, _ := gpuNode("zero", 1, 16384)
	inv3, _ := gpuNode("fresh", 1, 16384)
	objs := []runtime.Object{
		vgputest.PublishedNode(*inv1).Condition(vgpu.ConditionRegistered, corev1.ConditionTrue, vgpu.ReasonRegistered).Obj(),
		vgputest.HeartbeatLease("stale", now.Add(-2*DefaultHeartbeatMaxAge)).Obj(),
		vgputest.PublishedNode(*inv2).Allocatable(vgpu.ResourceGPU, 0).Condition(vgpu.ConditionRegistered, corev1.ConditionTrue, vgpu.ReasonRegistered).Obj(),
		vgputest.HeartbeatLease("zero", now).Obj(),
		vgputest.PublishedNode(*inv3).Condition(vgpu.ConditionRegistered, corev1.ConditionTrue, vgpu.ReasonRegistered).Obj(),
		vgputest.HeartbeatLease("fresh", now).Obj(),
	}
	client := fake.NewClientset(objs...)
	clk := clocktesting.NewFakePassiveClock(now)
	s, err := New(testConfig(), Options{Client: client, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Node:
			s.state.UpsertNodeMeta(trimmedNode(t, o))
		default:
			feed(t, s, o)
		}
	}
	_, ctx := ktesting.NewTestContext(t)
	c := newConditionController(s)
	statuses := func() map[string]string {
		got := map[string]string{}
		for _, name := range []string{"stale", "zero", "fresh"} {
			n, err := client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cond, _ := vgpu.RegisteredCondition(n)
			got[name] = string(cond.Status) + "/" + cond.Reason
		}
		return got
	}
	c.pass(ctx)
	c.pass(ctx) // the informer has not shown the write: no second write
	want := map[string]string{"stale": "Unknown/HeartbeatStale", "zero": "True/Registered", "fresh": "True/Registered"}
	if diff := cmp.Diff(want, statuses()); diff != "" {
		t.Errorf("after the first passes (-want +got):\n%s", diff)
	}
	clk.SetTime(now.Add(DefaultHeartbeatMaxAge))
	// The fresh and zero nodes renewed meanwhile.
	feed(t, s, vgputest.HeartbeatLease("zero", clk.Now()).Obj())
	feed(t, s, vgputest.HeartbeatLease("fresh", clk.Now()).Obj())
	c.pass(ctx)
	want["zero"] = "False/NoAllocatableGPUs"
	if diff := cmp.Diff(want, statuses()); diff != "" {
		t.Errorf("after HeartbeatMaxAge (-want +got):\n%s", diff)
	}
	patches := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" && a.GetSubresource() == "status" {
			patches++
		}
	}
	if patches != 2 {
		t.Errorf("%d status patches, want 2 (one per changed node)", patches)
	}
	if got := s.events.Waiting(); got != 2 {
		t.Errorf("%d Node events queued, want 2", got)
	}
}

// trimmedNode is n as the extender's informer keeps it.
func trimmedNode(t *testing.T, n *corev1.Node) *cluster.NodeMeta {
	t.Helper()
	out, err := trimmer(vgpu.ResourceGPU, nil)(n)
	if err != nil {
		t.Fatal(err)
	}
	return out.(*cluster.NodeMeta)
}

func TestPlacementMessage(t *testing.T) {
	models := map[string]string{"GPU-a": "NVIDIA A100-SXM4-80GB", "GPU-b": "Tesla T4"}
	tests := []struct {
		name  string
		alloc vgpu.PodAllocation
		want  string
	}{{
		name:  "one container, one GPU",
		alloc: vgpu.PodAllocation{Node: "n1", Containers: []vgpu.ContainerAllocation{{Name: "main", GPUs: []vgpu.GPUSlice{{UUID: "GPU-a", MemoryMiB: 10240, CoresPercent: 30}}}}},
		want:  "GPUs assigned: GPU-a(A100-SXM4-80GB) 10240 MiB, 30%",
	}, {
		name: "two containers, two GPUs and an unknown model",
		alloc: vgpu.PodAllocation{Node: "n1", Containers: []vgpu.ContainerAllocation{
			{Name: "train", GPUs: []vgpu.GPUSlice{{UUID: "GPU-a", MemoryMiB: 1024}, {UUID: "GPU-b", MemoryMiB: 2048, CoresPercent: 50}}},
			{Name: "eval", GPUs: []vgpu.GPUSlice{{UUID: "GPU-x", MemoryMiB: 512, CoresPercent: 10}}},
		}},
		want: "GPUs assigned: train: GPU-a(A100-SXM4-80GB) 1024 MiB, 0%, GPU-b(Tesla T4) 2048 MiB, 50%; eval: GPU-x 512 MiB, 10%",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, placementMessage(tt.alloc, models)); diff != "" {
				t.Errorf("placementMessage (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBindRecordsPlacement checks that a bind records the pod's
// GPUsAssigned event, written after the bind and apart from it.
func TestBindRecordsPlacement(t *testing.T) {
	_, n1 := gpuNode("n1", 1, 16384)
	e := newEnv(t, testConfig(), n1...)
	pod := slicePod("p", 4096)
	e.createPod(pod)
	if got := e.bind(pod, "n1"); got.Error != "" {
		t.Fatalf("bind: %s", got.Error)
	}
	var events []corev1.Event
	waitFor(t, "the placement event", func() bool {
		list, err := e.client.CoreV1().Events(pod.Namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		events = list.Items
		return len(events) > 0
	})
	ev := events[0]
	if ev.Reason != EventGPUsAssigned || ev.InvolvedObject.Name != "p" || ev.InvolvedObject.UID != pod.UID ||
		ev.Message != "GPUs assigned: n1-GPU-0(A100-SXM4-80GB) 4096 MiB, 10%" {
		t.Errorf("event = %s %s/%s %q, want %s on pod p: GPUs assigned: n1-GPU-0(A100-SXM4-80GB) 4096 MiB, 10%%", ev.Reason, ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Message, EventGPUsAssigned)
	}
}
