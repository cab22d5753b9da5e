package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// demoNodes returns the demo's simulated GPU nodes.
func demoNodes() []cluster.NodeOptions {
	return []cluster.NodeOptions{
		{Name: "gpu-a100", FakeGPUs: "8xA100-80GB"},
		{Name: "gpu-mixed", FakeGPUs: "4xT4-16GB,2xL4-24GB"},
	}
}

// samplePods returns the names of the demo's pods, each asking for one hami.io/gpu device.
func samplePods() []string {
	return []string{"train-0", "train-1", "train-2", "infer-0", "infer-1", "notebook-0"}
}

// up starts the cluster in dir, creates the sample pods, waits for them to run and prints a table.
func up(ctx context.Context, out io.Writer, dir, binDir string) error {
	statePath := filepath.Join(dir, "state.json")
	if _, err := os.Stat(statePath); err == nil {
		return fmt.Errorf("a demo cluster is already up (%s): run \"gpuslice-demo down\" first", statePath)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("check for a running demo: %w", err)
	}
	began := time.Now()
	fmt.Fprintf(out, "starting etcd, kube-apiserver, kube-scheduler and %d GPU nodes in %s ...\n", len(demoNodes()), dir)
	c, err := cluster.Start(ctx, cluster.Options{Dir: dir, BinDir: binDir, Nodes: demoNodes()})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "cluster ready in %v\n\n", time.Since(began).Round(100*time.Millisecond))
	if err := printNodes(ctx, out, c); err != nil {
		return err
	}
	if err := runSamplePods(ctx, c); err != nil {
		return fmt.Errorf("%w\n(the cluster is still up: \"gpuslice-demo down\" stops it)\n%s", err, c.LogTails(20))
	}
	if err := printPods(ctx, out, c); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nThe cluster keeps running. Use it with:\n  export KUBECONFIG=%s\n  %s get nodes,pods -o wide\n", c.State.Kubeconfig, filepath.Join(c.State.BinDir, "kubectl"))
	fmt.Fprintf(out, "Logs are under %s. Stop everything with: make demo-down\n", dir)
	return nil
}

// nodeInventory reads a Node and the GPU inventory its device plugin published.
func nodeInventory(ctx context.Context, c *cluster.Cluster, name string) (*corev1.Node, vgpu.NodeInventory, error) {
	node, err := c.Client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, vgpu.NodeInventory{}, fmt.Errorf("get node %s: %w", name, err)
	}
	inv, err := vgpu.ParseNodeInventory(node.Annotations[vgpu.AnnotationNodeInventory])
	if err != nil {
		return nil, vgpu.NodeInventory{}, fmt.Errorf("node %s inventory: %w", name, err)
	}
	return node, inv, nil
}

// printNodes prints each node's GPUs and hami.io/gpu capacity.
func printNodes(ctx context.Context, out io.Writer, c *cluster.Cluster) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tGPUS\thami.io/gpu CAPACITY\tALLOCATABLE\tREADY LABEL")
	for _, n := range c.Nodes {
		node, inv, err := nodeInventory(ctx, c, n.Name)
		if err != nil {
			return err
		}
		models := map[string]int{}
		for _, g := range inv.GPUs {
			models[g.Model]++
		}
		var parts []string
		for m, k := range models {
			parts = append(parts, fmt.Sprintf("%d× %s", k, m))
		}
		sort.Strings(parts)
		capQ, allocQ := node.Status.Capacity[cluster.ResourceGPU], node.Status.Allocatable[cluster.ResourceGPU]
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", n.Name, strings.Join(parts, ", "), capQ.String(), allocQ.String(), node.Labels[cluster.LabelGPUReady])
	}
	fmt.Fprintln(w)
	return w.Flush()
}

// runSamplePods creates the sample pods and waits until all are Running.
func runSamplePods(ctx context.Context, c *cluster.Cluster) error {
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	for _, name := range samplePods() {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault, Labels: map[string]string{"app": "gpuslice-demo"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name:  "cuda",
				Image: "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					cluster.ResourceGPU: resource.MustParse("1"),
				}},
			}}},
		}
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create pod %s: %w", name, err)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=gpuslice-demo"})
		if err != nil {
			return false, nil
		}
		running := 0
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == len(samplePods()), nil
	})
	if err != nil {
		return fmt.Errorf("wait for the sample pods to run: %w", err)
	}
	return nil
}

// printPods prints pod, node and the GPU each container was given, read from the fake runtime's
// record of CreateContainer (what a real runtime would have received).
func printPods(ctx context.Context, out io.Writer, c *cluster.Cluster) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "POD\tNODE\tGPU\tMODEL\tGPU MEMORY\tMEMORY LIMIT\tCOMPUTE LIMIT")
	for _, n := range c.Nodes {
		_, inv, err := nodeInventory(ctx, c, n.Name)
		if err != nil {
			return err
		}
		byUUID := map[string]vgpu.GPU{}
		for _, g := range inv.GPUs {
			byUUID[g.UUID] = g
		}
		records, err := n.CRIRecords()
		if err != nil {
			return err
		}
		for _, r := range records {
			for _, uuid := range strings.Split(r.Env["NVIDIA_VISIBLE_DEVICES"], ",") {
				g, ok := byUUID[uuid]
				if !ok {
					continue
				}
				fmt.Fprintf(w, "%s\t%s\t%d (%s)\t%s\t%d MiB\tnone\tnone\n", r.Pod, n.Name, g.Index, g.UUID, g.Model, g.TotalMemoryMiB)
			}
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("print pods: %w", err)
	}
	fmt.Fprintln(out, "\nGPU is what the kubelet passed to the container runtime (NVIDIA_VISIBLE_DEVICES); nothing runs.")
	fmt.Fprintln(out, "Until the scheduler extender lands, the kubelet picks the GPU slice and sets no memory or compute")
	fmt.Fprintln(out, "limit: pods on the same GPU share it unbounded.")
	return nil
}
