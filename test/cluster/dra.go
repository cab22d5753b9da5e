package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DRA mode of the local cluster: kube-controller-manager with only the resourceclaim controller
// (it creates the ResourceClaims of pods that name a ResourceClaimTemplate), and nodes whose GPUs
// are served by gpuslice-dra-plugin instead of the device plugin. The kubelet's DRA manager is on
// by default in v1.37 (DynamicResourceAllocation is GA); it watches plugins_registry in its
// /var/lib/kubelet, and the driver, outside the kubelet's mount namespace like the device plugin,
// is pointed at the host paths of that folder and of its own socket folder.
const (
	// DRAPluginName is gpuslice's DRA driver command.
	DRAPluginName = "gpuslice-dra-plugin"
	// DRADriverName is the driver name the DRA nodes publish under.
	DRADriverName = "gpuslice.hami.io"
	// resourceClaimController is kube-controller-manager's name of the resourceclaim controller.
	resourceClaimController = "resourceclaim-controller"
)

// startControllerManager starts kube-controller-manager with the resourceclaim controller only
// and waits for its /healthz.
func (c *Cluster) startControllerManager(ctx context.Context) error {
	dir := filepath.Join(c.State.Dir, "kube-controller-manager")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create controller-manager folder: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	p, err := c.start("kube-controller-manager", filepath.Join(c.State.BinDir, "kube-controller-manager"), []string{
		"--kubeconfig=" + c.State.Kubeconfig,
		"--controllers=" + resourceClaimController,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--v=2",
	}, dir)
	if err != nil {
		return err
	}
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed loopback health probe
	url := "https://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	return c.waitFor(ctx, "kube-controller-manager /healthz", []*Process{p}, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, insecure, url), nil
	})
}

// DRARegistrarDir returns the host path of the kubelet's plugins_registry folder.
func (n *Node) DRARegistrarDir() string { return filepath.Join(n.KubeletRootDir(), "plugins_registry") }

// DRAPluginDir returns the host path of the DRA driver's socket folder.
func (n *Node) DRAPluginDir() string {
	return filepath.Join(n.KubeletRootDir(), "plugins", DRADriverName)
}

// startDRAPlugin starts the node's DRA driver with fake GPUs. It does not wait: see
// WaitPluginReady.
func (n *Node) startDRAPlugin() error {
	args := []string{
		"--fake-gpus=" + n.FakeGPUs,
		"--node-name=" + n.Name,
		"--registrar-dir=" + n.DRARegistrarDir(),
		"--plugin-dir=" + n.DRAPluginDir(),
		"--state-dir=" + filepath.Join(n.Dir, "dra-state"),
		"--cdi-spec-dir=" + n.CDISpecDir(),
		"--fake-gpu-faults-dir=" + n.FaultsDir(),
		"--kubeconfig=" + n.c.State.Kubeconfig,
		"--v=2",
	}
	p, err := n.c.start(n.Name+"/dra-plugin", n.c.State.DRAPluginPath, append(args, n.PluginArgs...), n.Dir)
	if err != nil {
		return err
	}
	n.Plugin = p
	return nil
}

// ResourceSlices returns the node's ResourceSlices of gpuslice's DRA driver.
func (n *Node) ResourceSlices(ctx context.Context) ([]resourcev1.ResourceSlice, error) {
	list, err := n.c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + n.Name + "," + resourcev1.ResourceSliceSelectorDriver + "=" + DRADriverName,
	})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// waitDRAReady waits until the node's DRA driver has published a ResourceSlice with at least one
// device (the driver publishes after its sockets serve; the kubelet registers it from its
// plugins_registry folder within about a second).
func (n *Node) waitDRAReady(ctx context.Context) error {
	return n.c.waitFor(ctx, "DRA driver of "+n.Name+" published", []*Process{n.Kubelet, n.Plugin}, func(ctx context.Context) (bool, error) {
		slices, err := n.ResourceSlices(ctx)
		if err != nil {
			return false, nil
		}
		for _, s := range slices {
			if len(s.Spec.Devices) > 0 {
				return true, nil
			}
		}
		return false, nil
	})
}
