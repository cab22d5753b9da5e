package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/test/demo"
	"github.com/gpuslice/gpuslice/test/harness/findup"
	"github.com/gpuslice/gpuslice/test/monitoring"
	"github.com/gpuslice/gpuslice/vgpu"
)

// demoScrapeInterval is how often the demo's Prometheus scrapes: faster than the chart's 30s, so
// that a newcomer sees the figures move.
const demoScrapeInterval = 5 * time.Second

// findChart returns charts/gpuslice in the working directory or its first parent that has it.
func findChart() (string, error) {
	dir, ok, err := findup.Dir(filepath.Join("charts", "gpuslice"), findup.Has("Chart.yaml"))
	if err != nil || ok {
		return dir, err
	}
	return "", errors.New("charts/gpuslice not found in the working directory or a parent (run the demo from the repository)")
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
	fmt.Fprintf(out, "starting etcd, kube-apiserver, the gpuslice extender and webhook, kube-scheduler and %d GPU nodes in %s ...\n", len(demo.Nodes(dra)), dir)
	opts := cluster.Options{Dir: dir, BinDir: binDir, Nodes: demo.Nodes(dra)}
	// A Prometheus scraping the cluster as the chart's ServiceMonitors say, with the chart's
	// alerts, when make prometheus installed one.
	install, promErr := monitoring.FindInstall()
	if promErr == nil {
		chartDir, err := findChart()
		if err != nil {
			return err
		}
		opts.Prometheus = &cluster.PrometheusOptions{Install: install, ChartDir: chartDir, ScrapeInterval: demoScrapeInterval}
	}
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
	if err := demo.RunSamplePods(ctx, c, demo.SamplePods(dra)); err != nil {
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
	if url := c.PrometheusURL(); url != "" {
		fmt.Fprintf(out, "Prometheus, scraping every component as the chart's ServiceMonitors say (every %v), with the chart's alerts:\n  %s\n", demoScrapeInterval, url)
		fmt.Fprintf(out, "  %s/classic/graph?g0.expr=%s&g0.tab=1  (GPU memory allocated per GPU)\n  %s/classic/alerts\n", url, neturl.QueryEscape("max by (node, gpu) (gpuslice_gpu_memory_allocated_mib)"), url)
	} else {
		fmt.Fprintf(out, "No Prometheus (make prometheus installs one, and make demo then starts it): %v\n", promErr)
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
