package deviceplugin

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/test/harness/apiserver"
	"github.com/gpuslice/gpuslice/test/harness/devicemanager"
	"github.com/gpuslice/gpuslice/vgpu"
)

// TestRegistrationCondition follows the node's GPUSliceRegistered condition
// and events on a real API server, with the real kubelet device manager:
// KubeletSocketMissing while no kubelet serves, Registered with a
// GPUSliceRegistered event once one does, a GPUSliceReregistered event
// after a kubelet restart, a GPUUnhealthy event naming the XID, and
// PluginStopped when the plugin stops.
func TestRegistrationCondition(t *testing.T) {
	t.Parallel()
	s := apiserver.Start(t, apiserver.Options{})
	admin := kubernetes.NewForConfigOrDie(s.Config())
	ctx := waitCtx(t, 3*waitLong)
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vgpu.DefaultHeartbeatNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	client, err := deviceplugin.NewAPI(s.Config())
	if err != nil {
		t.Fatal(err)
	}
	condition := func() corev1.NodeCondition {
		n, err := admin.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
		if err != nil {
			return corev1.NodeCondition{}
		}
		c, _ := vgpu.RegisteredCondition(n)
		return c
	}
	waitCondition := func(status corev1.ConditionStatus, reason string) corev1.NodeCondition {
		t.Helper()
		var c corev1.NodeCondition
		waitUntil(t, waitLong, "condition "+string(status)+"/"+reason, func() bool {
			c = condition()
			return c.Status == status && c.Reason == reason
		})
		return c
	}
	// nodeEvent waits for a Node event with reason whose message holds want.
	nodeEvent := func(reason, want string) {
		t.Helper()
		selector := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": nodeName, "reason": reason}.AsSelector().String()
		waitUntil(t, waitLong, "a "+reason+" Node event containing "+want, func() bool {
			list, err := admin.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{FieldSelector: selector})
			if err != nil {
				return false
			}
			for _, ev := range list.Items {
				if strings.Contains(ev.Message, want) {
					return true
				}
			}
			return false
		})
	}

	dir := t.TempDir()
	p := startPlugin(t, dir, client)
	c := waitCondition(corev1.ConditionFalse, vgpu.ReasonKubeletSocketMissing)
	if !strings.Contains(c.Message, dir) {
		t.Errorf("KubeletSocketMissing message %q does not name the folder %s", c.Message, dir)
	}

	m := devicemanager.Start(t, dir)
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, allDevices, allDevices); err != nil {
		t.Fatal(err)
	}
	c = waitCondition(corev1.ConditionTrue, vgpu.ReasonRegistered)
	if want := "3 of 3 GPUs healthy"; !strings.Contains(c.Message, want) {
		t.Errorf("Registered message %q, want it to contain %q", c.Message, want)
	}
	nodeEvent(deviceplugin.EventRegistered, "Registered hami.io/gpu with the kubelet")

	// A kubelet restart: re-registration is quick, so the condition stays
	// True (no flapping) and an event says what happened.
	m.Stop()
	m = devicemanager.Start(t, dir)
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, allDevices, allDevices); err != nil {
		t.Fatal(err)
	}
	nodeEvent(deviceplugin.EventReregistered, "again")
	if c := condition(); c.Status != corev1.ConditionTrue {
		t.Errorf("condition after a kubelet restart %s/%s, want True", c.Status, c.Reason)
	}

	waitUntil(t, waitLong, "the health watch on GPU 0", func() bool { return p.fake.Watched(0) })
	if err := p.fake.InjectXID(0, 79); err != nil {
		t.Fatal(err)
	}
	nodeEvent(deviceplugin.EventGPUUnhealthy, "XID 79")
	waitUntil(t, waitLong, "the condition to count the unhealthy GPU", func() bool {
		return strings.Contains(condition().Message, "2 of 3 GPUs healthy")
	})

	// Stop the plugin while the manager runs, then the manager.
	p.stop()
	waitCondition(corev1.ConditionFalse, vgpu.ReasonPluginStopped)
	m.Stop()
}
