package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// draModeLabel is the label of DRA-mode nodes (vgpu.LabelNodeMode=vgpu.NodeModeDRA).
var draModeLabel = map[string]string{vgpu.LabelNodeMode: vgpu.NodeModeDRA}

// legacyPod is a pod written for gpuslice's device-plugin mode: hami.io/gpu 1, memMiB of memory
// and cores percent, a model annotation; onDRA makes it select the DRA pool.
func legacyPod(name string, memMiB, cores int64, onDRA bool) *corev1.Pod {
	p := slicePod(name, memMiB, cores)
	p.Spec.Containers[0].Resources.Limits[vgpu.ResourceGPU] = *resource.NewQuantity(1, resource.DecimalSI)
	p.Annotations = map[string]string{vgpu.AnnotationGPUModel: "A100"}
	if onDRA {
		p.Spec.NodeSelector = draModeLabel
	}
	return p
}

// TestDRAMixed runs both modes in one cluster, one node each: the device plugin on dp-1, the DRA
// driver on dra-1 (labelled gpuslice.hami.io/mode=dra). Pods written with hami.io limits land on
// dp-1; the same pods selecting the DRA pool are turned into claims by the webhook and land on
// dra-1 with the environment their claim's allocation gives; native claims land on dra-1 only;
// gpuslice status and doctor show both nodes.
func TestDRAMixed(t *testing.T) {
	opts := clusterOptions(
		cluster.NodeOptions{Name: "dp-1", FakeGPUs: "2xA100-80GB"},
		cluster.NodeOptions{Name: "dra-1", FakeGPUs: "2xA100-80GB", DRA: true, Labels: draModeLabel},
	)
	opts.ControllerManager = true
	opts.WebhookArgs = []string{"--dra"}
	c := startClusterWith(t, opts)
	ctx := context.Background()
	createDeviceClass(t, c)
	native := createClaimTemplate(t, c, 8192, 10)

	var pods []*corev1.Pod
	for i, size := range []int64{4096, 10240, 20480} {
		pods = append(pods, legacyPod("legacy-dp-"+string(rune('a'+i)), size, 20, false), legacyPod("legacy-dra-"+string(rune('a'+i)), size, 20, true))
	}
	pods = append(pods, claimPod("native-a", native), claimPod("native-b", native))
	began := time.Now()
	createAll(t, c, pods)
	out := waitSettled(t, c, "", len(pods), 2*time.Minute)
	if len(out.running) != len(pods) {
		t.Fatalf("%d of %d pods Running; pending %v", len(out.running), len(pods), names(out.pending))
	}
	t.Logf("FIGURE dra mixed: %d pods (3 legacy per mode, 2 native claims) Running in %v", len(pods), time.Since(began).Round(time.Millisecond))

	var onDP, onDRA []corev1.Pod
	for _, p := range out.running {
		wantDRA := !strings.HasPrefix(p.Name, "legacy-dp-")
		if got := p.Spec.NodeName == "dra-1"; got != wantDRA {
			t.Errorf("pod %s on %s; want %s", p.Name, p.Spec.NodeName, map[bool]string{true: "dra-1", false: "dp-1"}[wantDRA])
		}
		if wantDRA {
			onDRA = append(onDRA, p)
		} else {
			onDP = append(onDP, p)
		}
	}
	if bad := checkExact(t, c, onDP); len(bad) > 0 {
		t.Errorf("device-plugin pods: %v", bad)
	}
	mism, over := checkDRA(t, c, onDRA)
	if len(mism)+len(over) > 0 {
		t.Errorf("DRA pods: mismatches %v, over-commits %v", mism, over)
	}
	t.Logf("FIGURE dra mixed: %d device-plugin pods exact, %d DRA pods (legacy and native) with 0 mismatches and %d over-commits", len(onDP), len(onDRA), len(over))

	// The converted pod: no hami.io resources left, one claim from a webhook template, the
	// stock scheduler, and the slice it asked for in its environment.
	p, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "legacy-dra-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if vgpu.AsksForGPU(p) || len(p.Spec.ResourceClaims) != 1 || p.Spec.SchedulerName != corev1.DefaultSchedulerName {
		t.Errorf("converted pod: resources %v, claims %v, scheduler %q; want no hami.io resource, one claim, %s",
			p.Spec.Containers[0].Resources, p.Spec.ResourceClaims, p.Spec.SchedulerName, corev1.DefaultSchedulerName)
	}
	records, err := c.LatestRecords()
	if err != nil {
		t.Fatal(err)
	}
	if env := records[cluster.RecordKey(p.UID, "main")].Env; env["CUDA_DEVICE_MEMORY_LIMIT_0"] != "10240m" || env["CUDA_DEVICE_SM_LIMIT"] != "20" {
		t.Errorf("converted pod env %v, want CUDA_DEVICE_MEMORY_LIMIT_0=10240m and CUDA_DEVICE_SM_LIMIT=20", env)
	}

	// Bad input bound for the DRA pool is refused at creation, naming the field.
	bad := legacyPod("legacy-dra-bad", 1024, 0, true)
	delete(bad.Spec.Containers[0].Resources.Limits, vgpu.ResourceMemory)
	bad.Spec.Containers[0].Resources.Limits[vgpu.ResourceMemoryPercentage] = *resource.NewQuantity(50, resource.DecimalSI)
	if _, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, bad, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "hami.io/gpumem-percentage=50: is not served on DRA-mode nodes") {
		t.Errorf("pod with hami.io/gpumem-percentage on the DRA pool: %v, want a denial naming the resource", err)
	}

	// status and doctor show both nodes, each in its mode.
	raw, code := cli(t, c, "status", "-o", "json")
	var status struct {
		Nodes []struct {
			Name string
			Mode string
			GPUs []struct {
				MemoryUsedMiB int64
				Pods          []string
			}
		}
	}
	if err := json.Unmarshal([]byte(raw), &status); err != nil || code != 0 {
		t.Fatalf("gpuslice status -o json (exit %d): %v\n%s", code, err, raw)
	}
	used := map[string]int64{}
	for _, n := range status.Nodes {
		for _, g := range n.GPUs {
			used[n.Name+" "+n.Mode] += g.MemoryUsedMiB
		}
	}
	// dp-1: 4 + 10 + 20 GiB; dra-1 the same legacy pods plus two native 8 GiB claims.
	want := map[string]int64{"dp-1 device-plugin": 34816, "dra-1 dra": 34816 + 2*8192}
	for k, v := range want {
		if used[k] != v {
			t.Errorf("status: %s memory used %d MiB, want %d (all %v)", k, used[k], v, used)
		}
	}
	table, _ := cli(t, c, "status")
	t.Logf("gpuslice status:\n%s", table)
	checks, _ := doctor(t, c)
	if ch, ok := find(checks, "dra-1", "dra-driver"); !ok || ch.Result != "PASS" {
		t.Errorf("doctor dra-1 dra-driver: %+v (found %v), want PASS", ch, ok)
	}
	if ch, ok := find(checks, "dp-1", "plugin-ready"); ok && ch.Result == "FAIL" {
		t.Errorf("doctor dp-1 plugin-ready: %+v", ch)
	}
	if _, ok := find(checks, "dra-1", "inventory"); ok {
		t.Error("doctor runs device-plugin checks on the DRA node dra-1")
	}
}

// names returns the pods' names.
func names(pods []corev1.Pod) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}
