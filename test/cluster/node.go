package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/gpuslice/gpuslice/test/fakecri"
)

// Resource names and keys the nodes are checked with.
const (
	// ResourceGPU is the extended resource the device plugin registers.
	ResourceGPU corev1.ResourceName = "hami.io/gpu"
	// LabelGPUReady is the label the device plugin sets to "true" once registered.
	LabelGPUReady = "hami.io/gpu.ready"
	// taintNotReady is the taint every new Node carries until the (absent) node lifecycle
	// controller would remove it.
	taintNotReady = "node.kubernetes.io/not-ready"
)

// NodeOptions configures one simulated node.
type NodeOptions struct {
	// Name is the Node's name; required.
	Name string `json:"name"`
	// FakeGPUs is the device plugin's --fake-gpus value, e.g. "8xA100-80GB" or "4xT4-16GB,2xL4-24GB".
	FakeGPUs string `json:"fakeGPUs"`
	// PluginArgs are extra device-plugin flags, e.g. "--split-count=4"; with a chart they come
	// after the DaemonSet's arguments and override them.
	PluginArgs []string `json:"pluginArgs,omitempty"`
	// PluginProbes has the device plugin serve its probes and /metrics on a loopback port
	// picked just before it starts (NodeState.PluginHealthPort), so that no other component of
	// the cluster takes the port between the pick and the plugin's start. Always so with
	// Options.Prometheus; not with a chart (its port is the chart's) or DRA.
	PluginProbes bool `json:"pluginProbes,omitempty"`
	// DRA serves the node's GPUs with gpuslice's DRA driver instead of the device plugin.
	DRA bool `json:"dra,omitempty"`
	// NoPlugin leaves the device plugin stopped: start it with Node.StartPlugin.
	NoPlugin bool `json:"noPlugin,omitempty"`
	// Labels are the Node's labels (the kubelet's --node-labels); with a chart they pick the
	// device-plugin DaemonSet, whose configuration then decides the fake GPUs.
	Labels map[string]string `json:"labels,omitempty"`
	// CDIOnNotify makes the fake runtime resolve CDI devices as containerd 2.x does, from a cache
	// refreshed when inotify reports a change to the spec folder (fakecri.Options.CDIOnNotify),
	// instead of reading the folder at every CreateContainer.
	CDIOnNotify bool `json:"cdiOnNotify,omitempty"`
}

// NodeState is what the state file keeps of a node.
type NodeState struct {
	NodeOptions
	// Dir is the node's folder; Dir/varlib is /var/lib and Dir/log is /var/log in the kubelet's
	// mount namespace.
	Dir string `json:"dir"`
	// KubeletPort is the kubelet's HTTPS port on 127.0.0.1.
	KubeletPort int `json:"kubeletPort"`
	// PluginDaemonSet is the chart's DaemonSet the plugin was started from, empty without a
	// chart; PluginHealthPort the loopback port of its /readyz and /metrics, with a chart or a
	// Prometheus (Options.Prometheus), else 0.
	PluginDaemonSet  string `json:"pluginDaemonSet,omitempty"`
	PluginHealthPort int    `json:"pluginHealthPort,omitempty"`
	// PluginPod is the pod the plugin runs in on a real runtime with a chart (Plugin is then
	// nil): the DaemonSet's pod on this node, in the release's namespace.
	PluginPod string `json:"pluginPod,omitempty"`
}

// Node is one simulated node of a Cluster: kubelet, container runtime and device plugin.
type Node struct {
	NodeState
	c *Cluster

	// Kubelet, CRI (the fake CRI, or containerd on a real runtime) and Plugin (nil when the plugin
	// runs as a pod: see PluginPod) are the node's processes.
	Kubelet, CRI, Plugin *Process
}

// DevicePluginDir returns the host path of the folder the kubelet sees as
// /var/lib/kubelet/device-plugins.
func (n *Node) DevicePluginDir() string {
	return filepath.Join(n.Dir, "varlib", "kubelet", "device-plugins")
}

// PodResourcesSocket returns the host path of the socket the kubelet serves the PodResources API
// on (/var/lib/kubelet/pod-resources/kubelet.sock in its namespace).
func (n *Node) PodResourcesSocket() string {
	return filepath.Join(n.KubeletRootDir(), "pod-resources", "kubelet.sock")
}

// KubeletRootDir returns the host path of the kubelet's /var/lib/kubelet.
func (n *Node) KubeletRootDir() string { return filepath.Join(n.Dir, "varlib", "kubelet") }

// CRIRecordPath returns the file the fake CRI appends CreateContainer records to.
func (n *Node) CRIRecordPath() string { return filepath.Join(n.Dir, "cri-records.jsonl") }

// CRIRecords returns the node's CreateContainer records so far, in call order.
// On a real runtime they are read back from the logs of containers that ran PrintEnvAndMounts:
// what each container saw once runc started it.
func (n *Node) CRIRecords() ([]fakecri.Record, error) {
	if n.c.State.Runtime != nil {
		return n.runtimeRecords()
	}
	return fakecri.ReadRecords(n.CRIRecordPath())
}

// AddNode starts a node: its fake CRI (or containerd), its kubelet (waiting for the Node to be Ready, then removing
// the not-ready taint) and, unless opts.NoPlugin, its device plugin (waiting for the ready label).
func (c *Cluster) AddNode(ctx context.Context, opts NodeOptions) (*Node, error) {
	if opts.Name == "" {
		return nil, fmt.Errorf("node options: name is required")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	n := &Node{c: c, NodeState: NodeState{NodeOptions: opts, Dir: filepath.Join(c.State.Dir, opts.Name), KubeletPort: port}}
	for _, d := range []string{n.KubeletRootDir(), filepath.Join(n.Dir, "log"), n.CDISpecDir(), n.FaultsDir(), n.ProcDir()} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("node %s: create folder: %w", n.Name, err)
		}
	}
	c.mu.Lock()
	c.State.Nodes = append(c.State.Nodes, n.NodeState)
	c.Nodes = append(c.Nodes, n)
	c.mu.Unlock()

	startCRI := n.startCRI
	if c.State.Runtime != nil {
		startCRI = n.startContainerd
	}
	if err := startCRI(ctx); err != nil {
		return nil, err
	}
	if err := n.StartKubelet(ctx); err != nil {
		return nil, err
	}
	if (c.prometheus || opts.PluginProbes) && !opts.DRA && c.chart == nil {
		if n.PluginHealthPort, err = pluginHealthPort(opts.PluginArgs); err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.State.Nodes[len(c.State.Nodes)-1] = n.NodeState
		c.mu.Unlock()
	}
	if !opts.NoPlugin {
		if err := n.StartPlugin(); err != nil {
			return nil, err
		}
		if err := n.WaitPluginReady(ctx); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// CDISpecDir returns the node's CDI spec folder (the runtime's /var/run/cdi): the device plugin
// writes specs there and the fake CRI, or containerd, resolves CDI devices from it.
func (n *Node) CDISpecDir() string {
	if n.c.State.Runtime != nil {
		return filepath.Join(n.runDir(), "cdi") // /var/run/cdi in the node's mount namespace
	}
	return filepath.Join(n.Dir, "cdi")
}

// ProcDir returns the folder the node's device plugin reads processes' cgroups from instead of
// the host's /proc (--proc-dir; not with a chart): the fake GPUs' processes are not the host's,
// so SetGPUProcesses writes their <pid>/cgroup files here.
func (n *Node) ProcDir() string { return filepath.Join(n.Dir, "proc") }

// FaultsDir returns the folder the node's device plugin takes fake GPU faults from
// (--fake-gpu-faults-dir; see nvidia.WriteFakeFault). Not used with a chart.
func (n *Node) FaultsDir() string { return filepath.Join(n.Dir, "faults") }

// criSocket returns the fake CRI's socket path.
func (n *Node) criSocket() string { return filepath.Join(n.Dir, "cri.sock") }

// startCRI starts the fake CRI and waits for its socket.
func (n *Node) startCRI(ctx context.Context) error {
	refresh := "create"
	if n.CDIOnNotify {
		refresh = "notify"
	}
	p, err := n.c.start(n.Name+"/fake-cri", "gpuslice-fake-cri", []string{
		"--socket=" + n.criSocket(),
		"--record-file=" + n.CRIRecordPath(),
		"--cdi-spec-dirs=" + n.CDISpecDir(),
		"--cdi-refresh=" + refresh,
	}, n.Dir)
	if err != nil {
		return err
	}
	n.CRI = p
	return n.c.waitFor(ctx, n.Name+" fake CRI socket", []*Process{p}, func(context.Context) (bool, error) {
		_, err := os.Stat(n.criSocket())
		return err == nil, nil
	})
}

// kubeletConfig is the KubeletConfiguration FIELD.md §4 found to work on a cgroup-v1 host without
// touching host cgroups; nodeStatusUpdateFrequency is short so that capacity changes reach the Node
// within a second or two. Every node shares the host's disk with whatever else runs there, so the
// kubelet's default disk thresholds (imagefs.available<15%, nodefs.available<10%) would turn another
// program's files into DiskPressure and reject pods: those two are 1% instead, the others the
// kubelet's defaults.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
failSwapOn: false
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%s
nodeStatusUpdateFrequency: 1s
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 5%%
  imagefs.available: 1%%
  imagefs.inodesFree: 5%%
`

// kubeletScript runs as sh -c inside the new mount namespace: bind the node's folders over /var/lib
// and /var/log, then become the kubelet. /var/lib (not /var/lib/kubelet, which need not exist on
// the host) is covered, so nothing is created on the host.
const kubeletScript = `set -e; mount --bind "$1" /var/lib; mount --bind "$2" /var/log; shift 2; exec "$@"`

// StartKubelet starts the node's kubelet in a new mount namespace and waits until its Node is
// Ready (a heartbeat newer than the start), then removes the not-ready taint. It is used by AddNode
// and to restart a stopped kubelet.
func (n *Node) StartKubelet(ctx context.Context) error {
	prog, args, err := n.kubeletCommand()
	if err != nil {
		return err
	}
	socket := n.criSocket()
	if n.c.State.Runtime != nil {
		socket = n.containerdSocket()
	}
	cfg := filepath.Join(n.Dir, "kubelet-config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(kubeletConfig, n.KubeletPort, socket)), 0o600); err != nil {
		return fmt.Errorf("node %s: write kubelet config: %w", n.Name, err)
	}
	args = append(args,
		filepath.Join(n.c.State.BinDir, "kubelet"),
		"--config="+cfg,
		"--kubeconfig="+n.c.State.Kubeconfig,
		"--hostname-override="+n.Name,
		"--v=2",
	)
	if len(n.Labels) > 0 {
		var kv []string
		for k, v := range n.Labels {
			kv = append(kv, k+"="+v)
		}
		sort.Strings(kv)
		args = append(args, "--node-labels="+strings.Join(kv, ","))
	}
	startedAt := time.Now()
	p, err := n.c.start(n.Name+"/kubelet", prog, args, n.Dir)
	if err != nil {
		return err
	}
	n.Kubelet = p
	// Nothing marks a stopped kubelet's Node NotReady here (no controller-manager): only a Ready
	// heartbeat newer than this start (whole seconds on the wire) shows that this kubelet is up.
	err = n.c.waitFor(ctx, "Node "+n.Name+" Ready", []*Process{p}, func(ctx context.Context) (bool, error) {
		node, err := n.c.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue && cond.LastHeartbeatTime.After(startedAt), nil
			}
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	return n.removeNotReadyTaint(ctx)
}

// removeNotReadyTaint removes the node.kubernetes.io/not-ready taints from the Node.
func (n *Node) removeNotReadyTaint(ctx context.Context) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := n.c.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		kept := node.Spec.Taints[:0]
		for _, t := range node.Spec.Taints {
			if t.Key != taintNotReady {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(node.Spec.Taints) {
			return nil
		}
		node.Spec.Taints = kept
		_, err = n.c.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("node %s: remove %s taint: %w", n.Name, taintNotReady, err)
	}
	return err
}

// StopKubelet stops the kubelet (SIGTERM, then SIGKILL); its mount namespace goes with it.
func (n *Node) StopKubelet() error { return n.Kubelet.Stop() }

// KillKubelet kills the kubelet with SIGKILL, as a crash would; StartKubelet starts it again.
func (n *Node) KillKubelet() error { return n.Kubelet.Kill() }

// StartPlugin starts the node's device plugin with fake GPUs, pointed at the host path of the
// node's device-plugin folder and taking fake GPU faults from FaultsDir; with a chart, as the
// DaemonSet that selects the node says. It does not wait: see WaitPluginReady.
func (n *Node) StartPlugin() error {
	if n.DRA {
		return n.startDRAPlugin()
	}
	if n.c.chart != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return n.startChartPlugin(ctx)
	}
	args := []string{
		"--fake-gpus=" + n.FakeGPUs,
		"--node-name=" + n.Name,
		"--device-plugin-dir=" + n.DevicePluginDir(),
		"--pod-resources-socket=" + n.PodResourcesSocket(),
		"--cdi-spec-dir=" + n.CDISpecDir(),
		"--fake-gpu-faults-dir=" + n.FaultsDir(),
		"--proc-dir=" + n.ProcDir(),
		"--kubeconfig=" + n.c.State.Kubeconfig,
		"--v=2",
	}
	if n.PluginHealthPort != 0 {
		args = append(args, "--health-address=127.0.0.1:"+strconv.Itoa(n.PluginHealthPort))
	}
	p, err := n.c.start(n.Name+"/device-plugin", n.c.State.PluginPath, append(args, n.PluginArgs...), n.Dir)
	if err != nil {
		return err
	}
	n.Plugin = p
	return nil
}

// WaitPluginReady waits until the Node has the label hami.io/gpu.ready=true and a non-zero
// hami.io/gpu allocatable; on a DRA node, until its ResourceSlice lists devices.
func (n *Node) WaitPluginReady(ctx context.Context) error {
	if n.DRA {
		return n.waitDRAReady(ctx)
	}
	return n.c.waitFor(ctx, "device plugin of "+n.Name+" registered", []*Process{n.Kubelet, n.Plugin}, func(ctx context.Context) (bool, error) {
		node, err := n.c.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		q := node.Status.Allocatable[ResourceGPU]
		return node.Labels[LabelGPUReady] == "true" && !q.IsZero(), nil
	})
}

// KillPlugin kills the device plugin with SIGKILL, as a crash would.
func (n *Node) KillPlugin() error { return n.Plugin.Kill() }

// PausePlugin freezes the device plugin (SIGSTOP): it stays registered with the kubelet and its
// label stays, but it renews nothing until ResumePlugin.
func (n *Node) PausePlugin() error { return n.Plugin.Pause() }

// ResumePlugin lets a paused device plugin run again.
func (n *Node) ResumePlugin() { n.Plugin.Resume() }

// StopPlugin stops the device plugin with SIGTERM (SIGKILL after a timeout).
func (n *Node) StopPlugin() error { return n.Plugin.Stop() }

// String names the node and its GPUs.
func (n *Node) String() string {
	return n.Name + "(" + n.FakeGPUs + ", kubelet :" + strconv.Itoa(n.KubeletPort) + ", " + strings.TrimPrefix(n.Dir, n.c.State.Dir+"/") + ")"
}
