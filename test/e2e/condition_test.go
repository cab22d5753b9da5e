package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// TestRegistrationVisible checks what kubectl describe shows of registration and placement, with
// the real kubelet and kube-scheduler: the node's GPUSliceRegistered condition is True/Registered
// with a GPUSliceRegistered Node event, a GPU pod gets a GPUsAssigned event naming its GPU, model,
// memory and cores, and when the plugin is killed (SIGKILL: it cannot say so itself) the extender
// turns the condition Unknown/HeartbeatStale once the heartbeat is older than its 3 s, and records
// a Node event. Real: every Kubernetes component and gpuslice's binaries. Fake: NVML and the
// container runtime.
func TestRegistrationVisible(t *testing.T) {
	opts := clusterOptions(cluster.NodeOptions{Name: "node-1", FakeGPUs: fakeGPUs, PluginArgs: []string{"--lease-renew=1s", "--lease-duration=2s"}})
	opts.ExtenderArgs = []string{"--heartbeat-max-age=3s"}
	c := startClusterWith(t, opts)
	n := c.Nodes[0]
	nodes := c.Client().CoreV1().Nodes()
	condition := func(ctx context.Context) (corev1.NodeCondition, error) {
		node, err := nodes.Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return corev1.NodeCondition{}, err
		}
		cond, _ := vgpu.RegisteredCondition(node)
		return cond, nil
	}
	waitCondition := func(status corev1.ConditionStatus, reason string) corev1.NodeCondition {
		t.Helper()
		var cond corev1.NodeCondition
		poll(t, registerTime, "condition "+string(status)+"/"+reason, func(ctx context.Context) (bool, string) {
			var err error
			cond, err = condition(ctx)
			return cond.Status == status && cond.Reason == reason, fmt.Sprintf("%s/%s %q, err %v", cond.Status, cond.Reason, cond.Message, err)
		})
		return cond
	}
	// event waits for an event on the object kind/name with reason whose message holds want.
	event := func(namespace, kind, name, reason, want string) {
		t.Helper()
		selector := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}.AsSelector().String()
		poll(t, registerTime, fmt.Sprintf("a %s event on %s %s containing %q", reason, kind, name, want), func(ctx context.Context) (bool, string) {
			list, err := c.Client().CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: selector})
			if err != nil {
				return false, err.Error()
			}
			var seen []string
			for _, ev := range list.Items {
				if strings.Contains(ev.Message, want) {
					return true, ev.Message
				}
				seen = append(seen, ev.Message)
			}
			return false, fmt.Sprintf("%q", seen)
		})
	}

	waitCondition(corev1.ConditionTrue, vgpu.ReasonRegistered)
	event(metav1.NamespaceDefault, "Node", n.Name, deviceplugin.EventRegistered, "Registered hami.io/gpu with the kubelet")

	pod := runGPUPod(t, c, "placed")
	alloc, err := vgpu.ParsePodAllocation(pod.Annotations[vgpu.AnnotationPodAllocation])
	if err != nil {
		t.Fatal(err)
	}
	slice := alloc.Containers[0].GPUs[0]
	_, inv, err := c.NodeInventory(context.Background(), n.Name)
	if err != nil {
		t.Fatal(err)
	}
	model := ""
	for _, g := range inv.GPUs {
		if g.UUID == slice.UUID {
			model = strings.TrimPrefix(g.Model, "NVIDIA ")
		}
	}
	event(pod.Namespace, "Pod", pod.Name, extender.EventGPUsAssigned, fmt.Sprintf("GPUs assigned: %s(%s) %d MiB, %d%%", slice.UUID, model, slice.MemoryMiB, slice.CoresPercent))

	if err := n.KillPlugin(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	cond := waitCondition(corev1.ConditionUnknown, vgpu.ReasonHeartbeatStale)
	t.Logf("Unknown %v after the plugin was killed: %s", time.Since(killed).Round(100*time.Millisecond), cond.Message)
	event(metav1.NamespaceDefault, "Node", n.Name, extender.EventNodeCondition, "is now Unknown (HeartbeatStale)")
}
