package scale

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/simulate"
)

// Defaults of a hollow node.
const (
	// DefaultMaxPods is the kubelet's default maxPods.
	DefaultMaxPods = 110
	// DefaultSplitCount is the device plugin's default splitCount (and the chart's).
	DefaultSplitCount = deviceplugin.DefaultSplitCount
	// taintNotReady is the taint the API server's TaintNodesByCondition admission puts on every
	// new Node; the node lifecycle controller, which does not run here, would lift it.
	taintNotReady = "node.kubernetes.io/not-ready"
	// pluginVersion is the PluginVersion hollow nodes' heartbeats carry.
	pluginVersion = "hollow"
)

// NodeSpec is one hollow node: what its kubelet would report and what its device plugin would
// publish.
type NodeSpec struct {
	// Name is the Node's name.
	Name string
	// CPUMilli and MemoryMiB are the node's capacity and allocatable CPU (thousandths of a core)
	// and memory; MaxPods its pods capacity (0 means DefaultMaxPods).
	CPUMilli, MemoryMiB int64
	MaxPods             int64
	// Inventory is the GPU inventory the device plugin publishes; its Node must be Name. The
	// node's hami.io/gpu capacity is SplitCount × len(GPUs), as the plugin registers it.
	Inventory vgpu.NodeInventory
}

// FixedNodes returns n hollow nodes named prefix-00000 on, each with gpus GPUs and splitCount
// slices per GPU, taking the GPU model, CPU and memory of rows in turn (so the models mix as in
// the node list) but giving every node gpus GPUs. Rows without GPUs are skipped.
func FixedNodes(rows []simulate.Node, prefix string, n, gpus, splitCount int) ([]NodeSpec, error) {
	var models []simulate.Node
	for _, r := range rows {
		if r.GPUs > 0 {
			models = append(models, r)
		}
	}
	if len(models) == 0 {
		return nil, errors.New("node list: no row has GPUs")
	}
	specs := make([]NodeSpec, n)
	for i := range specs {
		row := models[i%len(models)]
		row.Name, row.GPUs = fmt.Sprintf("%s-%05d", prefix, i), gpus
		specs[i] = NodeSpec{Name: row.Name, CPUMilli: row.CPUMilli, MemoryMiB: row.MemoryMiB, Inventory: simulate.NodeInventory(row, splitCount)}
	}
	return specs, nil
}

// TraceNodes returns one hollow node per row with GPUs, as the row says (name, GPU model and
// count, CPU, memory), with the GPUs vgpu/simulate gives it and maxPods pods.
func TraceNodes(rows []simulate.Node, splitCount int, maxPods int64) []NodeSpec {
	var specs []NodeSpec
	for _, r := range rows {
		if r.GPUs == 0 {
			continue
		}
		specs = append(specs, NodeSpec{Name: r.Name, CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB, MaxPods: maxPods, Inventory: simulate.NodeInventory(r, splitCount)})
	}
	return specs
}

// node returns the Node object of s: labels, the inventory annotation, the ready label, status
// capacity and allocatable, and a Ready condition heartbeating now.
func (s NodeSpec) node(now time.Time) (*corev1.Node, error) {
	inventory, err := vgpu.EncodeNodeInventory(s.Inventory)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", s.Name, err)
	}
	maxPods := s.MaxPods
	if maxPods == 0 {
		maxPods = DefaultMaxPods
	}
	resources := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(s.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(s.MemoryMiB<<20, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(maxPods, resource.DecimalSI),
		vgpu.ResourceGPU:      *resource.NewQuantity(int64(s.Inventory.SplitCount*s.Inventory.Healthy()), resource.DecimalSI),
	}
	t := metav1.NewTime(now)
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name,
			Labels: map[string]string{
				corev1.LabelHostname:   s.Name,
				corev1.LabelOSStable:   "linux",
				corev1.LabelArchStable: "amd64",
				vgpu.LabelGPUReady:     vgpu.EncodeReadyLabel(true),
			},
			Annotations: map[string]string{vgpu.AnnotationNodeInventory: inventory},
		},
		Status: corev1.NodeStatus{
			Capacity:    resources,
			Allocatable: resources.DeepCopy(),
			Phase:       corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				Message: "hollow node: no kubelet", LastHeartbeatTime: t, LastTransitionTime: t,
			}},
		},
	}, nil
}

// lease returns the heartbeat Lease the device plugin of node keeps: registered, renewed now,
// owned by the Node.
func (s NodeSpec) lease(node *corev1.Node, namespace string, now time.Time) (*coordinationv1.Lease, error) {
	heartbeat, err := vgpu.EncodePluginHeartbeat(vgpu.PluginHeartbeat{
		Node: s.Name, PluginVersion: pluginVersion, ResourceName: string(vgpu.ResourceGPU),
		Registered: true, RegisteredAt: now, Socket: "gpuslice-hollow.sock",
	})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", s.Name, err)
	}
	t := metav1.NewMicroTime(now)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:            vgpu.HeartbeatLeaseName(s.Name),
			Namespace:       namespace,
			Labels:          map[string]string{vgpu.LabelHeartbeat: vgpu.LabelHeartbeatValue},
			Annotations:     map[string]string{vgpu.AnnotationPluginHeartbeat: heartbeat},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To("gpuslice-device-plugin/" + s.Name),
			LeaseDurationSeconds: ptr.To(int32(deviceplugin.DefaultLeaseDuration / time.Second)),
			AcquireTime:          &t,
			RenewTime:            &t,
		},
	}, nil
}

// createNodes creates the Node of every spec with workers requests in flight, lifts the
// not-ready taint the API server added, and creates each node's heartbeat Lease in namespace. It
// returns the Leases in spec order. The first error stops it.
func createNodes(ctx context.Context, client kubernetes.Interface, specs []NodeSpec, namespace string, workers int) ([]*coordinationv1.Lease, error) {
	leases := make([]*coordinationv1.Lease, len(specs))
	err := parallel(ctx, len(specs), workers, func(ctx context.Context, i int) error {
		s := specs[i]
		now := time.Now()
		n, err := s.node(now)
		if err != nil {
			return err
		}
		created, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create node %s: %w", s.Name, err)
		}
		kept := created.Spec.Taints[:0]
		for _, t := range created.Spec.Taints {
			if t.Key != taintNotReady {
				kept = append(kept, t)
			}
		}
		if len(kept) != len(created.Spec.Taints) {
			created.Spec.Taints = kept
			if created, err = client.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("node %s: remove %s taint: %w", s.Name, taintNotReady, err)
			}
		}
		l, err := s.lease(created, namespace, now)
		if err != nil {
			return err
		}
		if leases[i], err = client.CoordinationV1().Leases(namespace).Create(ctx, l, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("node %s: create heartbeat lease: %w", s.Name, err)
		}
		return nil
	})
	return leases, err
}

// parallel calls do for 0..n-1 from workers goroutines and returns the first error; after an
// error no new call starts. do's ctx ends when parallel returns.
func parallel(ctx context.Context, n, workers int, do func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range max(workers, 1) {
		wg.Go(func() {
			for i := range next {
				if err := do(ctx, i); err != nil {
					once.Do(func() { first = err; cancel(err) })
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return first
}

// nodeIndex maps node names to their spec.
func nodeIndex(specs []NodeSpec) map[string]NodeSpec {
	m := make(map[string]NodeSpec, len(specs))
	for _, s := range specs {
		m[s.Name] = s
	}
	return m
}

// gpuCount is the number of GPUs of specs, for reports.
func gpuCount(specs []NodeSpec) int {
	n := 0
	for _, s := range specs {
		n += len(s.Inventory.GPUs)
	}
	return n
}

// modelMix describes the GPU models of specs as "G2×4392, T4×…", most GPUs first.
func modelMix(specs []NodeSpec) string {
	count := map[string]int{}
	var order []string
	for _, s := range specs {
		for _, g := range s.Inventory.GPUs {
			if count[g.Model] == 0 {
				order = append(order, g.Model)
			}
			count[g.Model]++
		}
	}
	sortByCount(order, count)
	out := ""
	for i, m := range order {
		if i > 0 {
			out += ", "
		}
		out += m + "×" + strconv.Itoa(count[m])
	}
	return out
}
