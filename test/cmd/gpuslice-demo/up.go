package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// draNodeLabel is the label of the demo's DRA-mode node, as the chart's dra.nodeSelector.
var draNodeLabel = map[string]string{vgpu.LabelNodeMode: vgpu.NodeModeDRA}

// demoNodes returns the demo's simulated GPU nodes; with dra, a third node in DRA mode.
func demoNodes(dra bool) []cluster.NodeOptions {
	nodes := []cluster.NodeOptions{
		{Name: "gpu-a100", FakeGPUs: "8xA100-80GB"},
		{Name: "gpu-mixed", FakeGPUs: "4xT4-16GB,2xL4-24GB"},
	}
	if dra {
		nodes = append(nodes, cluster.NodeOptions{Name: "gpu-dra", FakeGPUs: "2xA100-80GB", DRA: true, Labels: draNodeLabel})
	}
	return nodes
}

// samplePod is one of the demo's pods: its name, GPU memory (MiB), compute percent, GPU model
// filter, or a number of whole GPUs instead of a slice.
type samplePod struct {
	name      string
	memoryMiB int64
	cores     int64
	model     string
	wholeGPUs int64
	// dra makes the pod select the DRA-mode node: the webhook turns it into a claim.
	dra bool
}

// samplePods returns the demo's pods: slices of several sizes that share GPUs, one pinned to a
// model, and one whole-GPU pod beside them.
func samplePods(dra bool) []samplePod {
	if dra {
		return append(samplePods(false),
			samplePod{name: "dra-train-0", memoryMiB: 40960, cores: 50, dra: true},
			samplePod{name: "dra-infer-0", memoryMiB: 10240, cores: 20, model: "A100", dra: true})
	}
	return []samplePod{
		{name: "train-0", memoryMiB: 40960, cores: 50},
		{name: "train-1", memoryMiB: 40960, cores: 50},
		{name: "infer-0", memoryMiB: 10240, cores: 20},
		{name: "infer-1", memoryMiB: 10240, cores: 20},
		{name: "infer-2", memoryMiB: 10240, cores: 20},
		{name: "notebook-0", memoryMiB: 4096, model: "T4"},
		{name: "notebook-1", memoryMiB: 4096, model: "T4"},
		{name: "exclusive-0", wholeGPUs: 1, model: "L4"},
	}
}

// up starts the cluster in dir, creates the sample pods, waits for them to run and prints a table,
// then "kubectl gpuslice status" when cliDir holds kubectl-gpuslice (make build).
func up(ctx context.Context, out io.Writer, dir, binDir, cliDir string, dra bool) error {
	statePath := filepath.Join(dir, "state.json")
	if _, err := os.Stat(statePath); err == nil {
		return fmt.Errorf("a demo cluster is already up (%s): run \"gpuslice-demo down\" first", statePath)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("check for a running demo: %w", err)
	}
	began := time.Now()
	fmt.Fprintf(out, "starting etcd, kube-apiserver, the gpuslice extender and webhook, kube-scheduler and %d GPU nodes in %s ...\n", len(demoNodes(dra)), dir)
	opts := cluster.Options{Dir: dir, BinDir: binDir, Nodes: demoNodes(dra)}
	if dra {
		// The resourceclaim controller makes the claims; the webhook turns the pods that select
		// the DRA node into claims.
		opts.ControllerManager, opts.WebhookArgs = true, []string{"--dra"}
	}
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return err
	}
	if dra {
		if err := createDeviceClass(ctx, c); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "cluster ready in %v\n\n", time.Since(began).Round(100*time.Millisecond))
	if err := printNodes(ctx, out, c); err != nil {
		return err
	}
	if err := runSamplePods(ctx, c, samplePods(dra)); err != nil {
		return fmt.Errorf("%w\n(the cluster is still up: \"gpuslice-demo down\" stops it)\n%s", err, c.LogTails(20))
	}
	if err := printPods(ctx, out, c); err != nil {
		return err
	}
	kubectl := filepath.Join(c.State.BinDir, "kubectl")
	if cliDir != "" {
		abs, err := filepath.Abs(cliDir)
		if err != nil {
			return err
		}
		cliDir = abs
		if err := printStatus(ctx, out, kubectl, c.State.Kubeconfig, cliDir); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "\nThe cluster keeps running. Use it with:\n  export KUBECONFIG=%s\n  %s get nodes,pods -o wide\n", c.State.Kubeconfig, kubectl)
	if cliDir != "" {
		fmt.Fprintf(out, "  export PATH=%s:$PATH  # kubectl-gpuslice, the kubectl plugin\n  %s gpuslice status|doctor|why POD\n", cliDir, kubectl)
	}
	fmt.Fprintf(out, "Logs are under %s. Stop everything with: make demo-down\n", dir)
	return nil
}

// printNodes prints each node's GPUs and hami.io/gpu capacity.
func printNodes(ctx context.Context, out io.Writer, c *cluster.Cluster) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tGPUS\thami.io/gpu CAPACITY\tALLOCATABLE\tREADY LABEL")
	for _, n := range c.Nodes {
		gpus, err := nodeGPUs(ctx, c, n)
		if err != nil {
			return err
		}
		node, err := c.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		models := map[string]int{}
		for _, g := range gpus {
			models[g.Model]++
		}
		var parts []string
		for m, k := range models {
			parts = append(parts, fmt.Sprintf("%d× %s", k, m))
		}
		sort.Strings(parts)
		if n.DRA {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", n.Name, strings.Join(parts, ", "), "- (DRA: ResourceSlice)", "-", "-")
			continue
		}
		capQ, allocQ := node.Status.Capacity[cluster.ResourceGPU], node.Status.Allocatable[cluster.ResourceGPU]
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", n.Name, strings.Join(parts, ", "), capQ.String(), allocQ.String(), node.Labels[cluster.LabelGPUReady])
	}
	fmt.Fprintln(w)
	return w.Flush()
}

// pod returns sp as a Pod. The webhook fills in hami.io/gpu: 1 for slices and the scheduler name.
func (sp samplePod) pod() *corev1.Pod {
	limits := corev1.ResourceList{}
	if sp.wholeGPUs > 0 {
		limits[vgpu.ResourceGPU] = *resource.NewQuantity(sp.wholeGPUs, resource.DecimalSI)
	} else {
		limits[vgpu.ResourceMemory] = *resource.NewQuantity(sp.memoryMiB, resource.DecimalSI)
	}
	if sp.cores > 0 {
		limits[vgpu.ResourceCores] = *resource.NewQuantity(sp.cores, resource.DecimalSI)
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: sp.name, Namespace: metav1.NamespaceDefault, Labels: map[string]string{"app": "gpuslice-demo"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:      "cuda",
			Image:     "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
			Resources: corev1.ResourceRequirements{Limits: limits},
		}}},
	}
	if sp.model != "" {
		p.Annotations = map[string]string{vgpu.AnnotationGPUModel: sp.model}
	}
	if sp.dra {
		p.Spec.NodeSelector = draNodeLabel
	}
	return p
}

// runSamplePods creates the sample pods and waits until all are Running.
func runSamplePods(ctx context.Context, c *cluster.Cluster, samples []samplePod) error {
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	for _, sp := range samples {
		if _, err := pods.Create(ctx, sp.pod(), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create pod %s: %w", sp.name, err)
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
		return running == len(samples), nil
	})
	if err != nil {
		return fmt.Errorf("wait for the sample pods to run: %w", err)
	}
	return nil
}

// printPods prints, per container, the GPUs and limits the container runtime was given (read from
// the fake runtime's record of CreateContainer, after resolving the CDI device as containerd
// does), then how full each GPU is.
func printPods(ctx context.Context, out io.Writer, c *cluster.Cluster) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "POD\tNODE\tGPU\tMODEL\tMEMORY LIMIT\tCOMPUTE LIMIT")
	type fill struct {
		memMiB int64
		pods   []string
	}
	fills := map[string]*fill{}
	var gpus []vgpu.GPU
	gpuNode := map[string]string{}
	for _, n := range c.Nodes {
		nodeGPUList, err := nodeGPUs(ctx, c, n)
		if err != nil {
			return err
		}
		byUUID := map[string]vgpu.GPU{}
		for _, g := range nodeGPUList {
			byUUID[g.UUID] = g
			gpus = append(gpus, g)
			gpuNode[g.UUID] = n.Name
		}
		records, err := n.CRIRecords()
		if err != nil {
			return err
		}
		for _, r := range records {
			for i, uuid := range strings.Split(r.Env["NVIDIA_VISIBLE_DEVICES"], ",") {
				g, ok := byUUID[uuid]
				if !ok {
					continue
				}
				limit := r.Env[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)]
				cores := r.Env["CUDA_DEVICE_SM_LIMIT"]
				if cores == "" {
					cores = "-"
				} else {
					cores += "%"
				}
				fmt.Fprintf(w, "%s\t%s\t%d (%s)\t%s\t%s\t%s\n", r.Pod, n.Name, g.Index, g.UUID, g.Model, limit, cores)
				f := fills[uuid]
				if f == nil {
					f = &fill{}
					fills[uuid] = f
				}
				mib, _ := strconv.ParseInt(strings.TrimSuffix(limit, "m"), 10, 64)
				f.memMiB += mib
				f.pods = append(f.pods, r.Pod)
			}
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("print pods: %w", err)
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tGPU\tMODEL\tMEMORY USED\tPODS")
	for _, g := range gpus {
		f := fills[g.UUID]
		if f == nil {
			f = &fill{}
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%6d / %d MiB\t%s\n", gpuNode[g.UUID], g.Index, g.Model, f.memMiB, g.SchedulableMemoryMiB, strings.Join(f.pods, ","))
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("print GPUs: %w", err)
	}
	fmt.Fprintln(out, "\nLimits are what the container runtime received: the CDI spec the device plugin wrote for each")
	fmt.Fprintln(out, "container at its start (HAMi-core compatible env), or on a DRA-mode node the DRA driver wrote for")
	fmt.Fprintln(out, "the pod's claim. Several pods share one GPU; nothing runs.")
	return nil
}

// printStatus runs "kubectl gpuslice status" as a user would: kubectl finds the plugin
// kubectl-gpuslice in cliDir (absolute) on its PATH.
func printStatus(ctx context.Context, out io.Writer, kubectl, kubeconfig, cliDir string) error {
	if _, err := os.Stat(filepath.Join(cliDir, "kubectl-gpuslice")); err != nil {
		return fmt.Errorf("kubectl plugin: %w (make build makes it)", err)
	}
	fmt.Fprintf(out, "\n$ kubectl gpuslice status\n")
	cmd := exec.CommandContext(ctx, kubectl, "gpuslice", "status")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "PATH="+cliDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kubectl gpuslice status: %w", err)
	}
	return nil
}

// nodeGPUs returns n's GPUs: the device plugin's inventory, or on a DRA-mode node the devices of
// its ResourceSlices (uuid, model and index attributes, memory capacity in bytes).
func nodeGPUs(ctx context.Context, c *cluster.Cluster, n *cluster.Node) ([]vgpu.GPU, error) {
	if !n.DRA {
		_, inv, err := c.NodeInventory(ctx, n.Name)
		return inv.GPUs, err
	}
	slices, err := n.ResourceSlices(ctx)
	if err != nil {
		return nil, err
	}
	var out []vgpu.GPU
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			g := vgpu.GPU{}
			if a := d.Attributes["uuid"].StringValue; a != nil {
				g.UUID = *a
			}
			if a := d.Attributes["model"].StringValue; a != nil {
				g.Model = *a
			}
			if a := d.Attributes["index"].IntValue; a != nil {
				g.Index = int(*a)
			}
			mem := d.Capacity["memory"].Value
			g.SchedulableMemoryMiB = mem.Value() >> 20
			out = append(out, g)
		}
	}
	return out, nil
}

// createDeviceClass creates the DeviceClass of gpuslice's DRA driver, as the chart does.
func createDeviceClass(ctx context.Context, c *cluster.Cluster) error {
	dc := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: cluster.DRADriverName},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + cluster.DRADriverName + `"`},
		}}},
	}
	if _, err := c.Client().ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create DeviceClass %s: %w", dc.Name, err)
	}
	return nil
}
