package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/kubeletstate"
	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// recreatedPodGetsItsOwnSlice is a StatefulSet's web-0 deleted and created again under its name
// (a new UID) while the device plugin's view of the node's pods lags, on n of c. The local
// cluster runs no StatefulSet controller; what it does is what the test does: delete the pod,
// wait until it is gone, create one of the same name. To the plugin that is all a StatefulSet is:
// the kubelet's PodResources API names pods by namespace and name only.
//
// The plugin is restarted talking to the API server through a loopback proxy that the test
// holds still (every connection's bytes wait) from before the deletion until Allocate of the new
// pod has prepared its CDI spec from the stale view: for the old pod, under the new container's
// name. Both pods' slices are on the same GPU (filler pods leave the node's other GPUs no room),
// so the devices fit either allocation. Once the proxy lets the bytes through, the new pod must reach Running
// with its own slice: its environment, as the runtime resolved its CDI device, is its own pod's
// allocation, not the old pod's.
func recreatedPodGetsItsOwnSlice(t *testing.T, c *cluster.Cluster, n *cluster.Node) {
	proxy := startPauseProxy(t, c.RESTConfig().Host)
	kubeconfig := filepath.Join(t.TempDir(), "plugin-via-proxy.kubeconfig")
	writeKubeconfigVia(t, c.State.Kubeconfig, kubeconfig, "https://"+proxy.Addr())
	if err := n.StopPlugin(); err != nil {
		t.Fatal(err)
	}
	n.PluginArgs = append(n.PluginArgs, "--kubeconfig="+kubeconfig)
	if err := n.StartPlugin(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := n.WaitPluginReady(ctx); err != nil {
		t.Fatal(err)
	}

	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	const oldMiB, newMiB = 40960, 24576 // neither fits the node's 16 GiB T4
	leaveOneGPU(t, c, n, newMiB, oldMiB)
	if _, err := pods.Create(ctx, slicePod("web-0", oldMiB, 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := waitRunningOn(t, c, "web-0", n.Name)
	gpu := onlyGPU(t, old)

	proxy.Pause()
	if err := pods.Delete(ctx, "web-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "the old web-0 gone from the API server and the kubelet", func(ctx context.Context) (bool, string) {
		_, err := pods.Get(ctx, "web-0", metav1.GetOptions{})
		listed, lerr := kubeletLists(ctx, n, "web-0")
		return apierrors.IsNotFound(err) && lerr == nil && !listed, fmt.Sprintf("get: %v; kubelet lists it: %v (%v)", err, listed, lerr)
	})
	created, err := pods.Create(ctx, slicePod("web-0", newMiB, 0), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "the new web-0 allocated, and its spec prepared from the plugin's stale view (the old pod's)", func(context.Context) (bool, string) {
		entries, err := kubeletstate.Read(n.DevicePluginDir())
		if err != nil {
			return false, err.Error()
		}
		for _, e := range entries {
			if e.PodUID != string(created.UID) || len(e.CDIDevices) == 0 {
				continue
			}
			uid := specPodUID(n.CDISpecDir(), e.CDIDevices[0])
			return uid == string(old.UID), fmt.Sprintf("the spec of %s names pod UID %q", e.CDIDevices[0], uid)
		}
		return false, "no entry for the new web-0 in the kubelet's device checkpoint"
	})
	proxy.Resume()
	resumed := time.Now()

	p := waitRunningOn(t, c, "web-0", n.Name)
	running := time.Since(resumed)
	if p.UID != created.UID {
		t.Fatalf("web-0 Running with UID %s, want the new pod's %s", p.UID, created.UID)
	}
	if g := onlyGPU(t, p); g != gpu {
		t.Fatalf("the new web-0 is on GPU %s, the old one was on %s: the scenario needs them on one GPU", g, gpu)
	}
	records, err := c.LatestRecords()
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range cluster.AllocationMismatches(p, records) {
		t.Errorf("the new web-0: %s", bad)
	}
	env := records[cluster.RecordKey(p.UID, "main")].Env
	t.Logf("the new web-0 (UID %s) Running %v after the proxy resumed, with %s=%s, %s=%s; the plugin took the prepared spec over %d time(s)", p.UID, running.Round(100*time.Millisecond),
		handoff.EnvPodUID, env[handoff.EnvPodUID], handoff.EnvMemoryLimitPrefix+"0", env[handoff.EnvMemoryLimitPrefix+"0"],
		strings.Count(n.Plugin.LogTail(400), "rewriting it for the container that starts"))
}

// onlyGPU returns the GPU of pod's one slice.
func onlyGPU(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	alloc, err := vgpu.ParsePodAllocation(pod.Annotations[vgpu.AnnotationPodAllocation])
	if err != nil || len(alloc.Containers) != 1 || len(alloc.Containers[0].GPUs) != 1 {
		t.Fatalf("pod %s: allocation %+v, %v; want one slice", pod.Name, alloc, err)
	}
	return alloc.Containers[0].GPUs[0].UUID
}

// leaveOneGPU runs filler pods on n until one GPU at most has room for a slice of minMiB, and
// fails t unless that one has room for bigMiB: web-0 and web-0 created again then share it.
func leaveOneGPU(t *testing.T, c *cluster.Cluster, n *cluster.Node, minMiB, bigMiB int64) {
	t.Helper()
	for i := 0; ; i++ {
		free := freeMiB(t, c, n)
		var fits []int64
		for _, f := range free {
			if f >= minMiB {
				fits = append(fits, f)
			}
		}
		slices.Sort(fits)
		switch {
		case len(fits) == 1 && fits[0] >= bigMiB:
			return
		case len(fits) <= 1 || i == 4:
			t.Fatalf("free GPU memory on %s: %v MiB; want one GPU with %d MiB free and none other with %d", n.Name, free, bigMiB, minMiB)
		}
		name := fmt.Sprintf("filler-%d", i)
		if _, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(context.Background(), slicePod(name, fits[0], 0), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitRunningOn(t, c, name, n.Name)
	}
}

// freeMiB returns the schedulable memory of each GPU of n that the slices of the pods bound there leave free.
func freeMiB(t *testing.T, c *cluster.Cluster, n *cluster.Node) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	_, inv, err := c.NodeInventory(ctx, n.Name)
	if err != nil {
		t.Fatal(err)
	}
	free := map[string]int64{}
	for _, g := range inv.GPUs {
		free[g.UUID] = cmp.Or(g.SchedulableMemoryMiB, g.TotalMemoryMiB)
	}
	list, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		alloc, err := vgpu.ParsePodAllocation(p.Annotations[vgpu.AnnotationPodAllocation])
		if err != nil {
			continue
		}
		for _, ca := range alloc.Containers {
			for _, s := range ca.GPUs {
				free[s.UUID] -= s.MemoryMiB
			}
		}
	}
	return free
}

// kubeletLists reports whether n's kubelet lists a pod of the default namespace named name in
// its PodResources API.
func kubeletLists(ctx context.Context, n *cluster.Node, name string) (bool, error) {
	conn, err := grpc.NewClient("unix://"+n.PodResourcesSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close() }()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(resp.GetPodResources(), func(p *podresourcesapi.PodResources) bool {
		return p.GetNamespace() == metav1.NamespaceDefault && p.GetName() == name
	}), nil
}

// specPodUID returns the pod UID (handoff.EnvPodUID) of the device qualified, a fully qualified
// CDI device name, in the spec files of dir; "" when no file defines it.
func specPodUID(dir, qualified string) string {
	_, name, _ := strings.Cut(qualified, "=")
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, file := range files {
		data, err := os.ReadFile(file) //nolint:gosec // G304: the node's CDI spec folder.
		if err != nil {
			continue
		}
		var spec struct {
			Devices []struct {
				Name           string `json:"name"`
				ContainerEdits struct {
					Env []string `json:"env"`
				} `json:"containerEdits"`
			} `json:"devices"`
		}
		if json.Unmarshal(data, &spec) != nil {
			continue
		}
		for _, d := range spec.Devices {
			if d.Name != name {
				continue
			}
			for _, kv := range d.ContainerEdits.Env {
				if v, ok := strings.CutPrefix(kv, handoff.EnvPodUID+"="); ok {
					return v
				}
			}
		}
	}
	return ""
}

// writeKubeconfigVia writes to path the kubeconfig at from with every cluster's server set to
// server.
func writeKubeconfigVia(t *testing.T, from, path, server string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range cfg.Clusters {
		cl.Server = server
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}

// pauseProxy is a loopback TCP proxy to one address whose connections can be held still: while
// paused, bytes read from either side wait before they are passed on, so an HTTP client behind it
// (a watch, a GET) sees nothing happen, and then everything at once when it resumes. TLS passes
// through untouched.
type pauseProxy struct {
	t        *testing.T
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	paused bool
	resume chan struct{} // closed at Resume; replaced at Pause
	conns  []net.Conn
	wg     sync.WaitGroup
}

// startPauseProxy proxies to the host and port of url until the end of the test.
func startPauseProxy(t *testing.T, url string) *pauseProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, hostPort, _ := strings.Cut(url, "://")
	p := &pauseProxy{t: t, ln: ln, upstream: hostPort, resume: make(chan struct{})}
	close(p.resume)
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *pauseProxy) Addr() string { return p.ln.Addr().String() }

// Pause holds every connection's bytes until Resume.
func (p *pauseProxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		p.paused, p.resume = true, make(chan struct{})
	}
}

// Resume passes on what was held and lets bytes flow again. Idempotent.
func (p *pauseProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		close(p.resume)
	}
}

// gate returns a channel that is closed once the proxy is not paused.
func (p *pauseProxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resume
}

func (p *pauseProxy) serve() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			p.t.Logf("proxy: dial %s: %v", p.upstream, err)
			_ = down.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, down)
		go p.pipe(down, up)
	}
}

// pipe copies from src to dst, waiting at the gate before each write, and closes both at the end.
func (p *pauseProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				p.t.Logf("proxy: %v", err)
			}
			return
		}
	}
}

// close stops accepting, ends every connection and waits for the copies.
func (p *pauseProxy) close() {
	p.Resume()
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
