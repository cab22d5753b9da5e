package deviceplugin

import (
	"context"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/test/harness/apiserver"
	"github.com/gpuslice/gpuslice/test/harness/devicemanager"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Scenario 6: the API server is unreachable when the plugin starts. The
// plugin registers with the kubelet anyway; the inventory annotation, the
// heartbeat Lease and the ready label appear once the API server answers.
func TestAPIServerUnreachableAtStart(t *testing.T) {
	t.Parallel()
	// Start the API server once to mint its certificate and admin token,
	// write the kubeconfig the plugin will use, then stop it: the plugin
	// starts with an API server that refuses connections.
	apiDir, port := t.TempDir(), apiserver.FreePort(t)
	first := apiserver.Start(t, apiserver.Options{Port: port, Dir: apiDir})
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := first.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	first.Stop()

	restCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := deviceplugin.NewAPI(restCfg)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	m := devicemanager.Start(t, dir)
	p := startPlugin(t, dir, client)
	all := int64(gpuCount * splitCount)
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, all, all); err != nil {
		t.Fatalf("registration with the API server down: %v", err)
	}
	// The kubelet can publish the devices a moment before its Register
	// answer reaches the plugin.
	waitUntil(t, waitLong, "the plugin to report itself registered", p.plugin.Registered)

	// The API server comes back (same port, same data); the kubelet would
	// create the Node, so the test does.
	second := apiserver.Start(t, apiserver.Options{Port: port, Dir: apiDir})
	// Stop the plugin first: the API server's graceful stop waits for open
	// watches, and the plugin watches the node's pods.
	t.Cleanup(p.stop)
	admin := kubernetes.NewForConfigOrDie(second.Config())
	ctx := waitCtx(t, waitLong)
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// kube-node-lease is one of the API server's own system namespaces.
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vgpu.DefaultHeartbeatNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	waitUntil(t, waitLong, "inventory, ready label and heartbeat", func() bool {
		node, err := admin.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		inv, err := vgpu.ParseNodeInventory(node.Annotations[vgpu.AnnotationNodeInventory])
		if err != nil || len(inv.GPUs) != gpuCount || inv.SplitCount != splitCount {
			return false
		}
		if node.Labels[vgpu.LabelGPUReady] != "true" {
			return false
		}
		lease, err := admin.CoordinationV1().Leases(vgpu.DefaultHeartbeatNamespace).Get(context.Background(), vgpu.HeartbeatLeaseName(nodeName), metav1.GetOptions{})
		if err != nil {
			return false
		}
		hb, err := vgpu.ParsePluginHeartbeat(lease.Annotations[vgpu.AnnotationPluginHeartbeat])
		return err == nil && hb.Registered && lease.Spec.RenewTime != nil && len(lease.OwnerReferences) == 1
	})

	// Losing the kubelet lifts the barrier.
	m.Stop()
	waitUntil(t, waitLong, "ready label false after the kubelet went away", func() bool {
		node, err := admin.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
		return err == nil && node.Labels[vgpu.LabelGPUReady] == "false"
	})
}
