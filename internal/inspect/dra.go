package inspect

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/vgpu"
)

// DRA-mode nodes publish no inventory annotation or ready label, only the node condition and the
// heartbeat Lease: their GPUs are the
// devices of the gpuslice DRA driver's ResourceSlices and what pods hold is the allocation of
// their ResourceClaims, which kube-scheduler wrote. Status and Doctor read both.

// DRADriverName is the gpuslice DRA driver whose ResourceSlices and claims are read.
const DRADriverName = "gpuslice.hami.io"

// Node modes of NodeStatus.Mode.
const (
	ModeDevicePlugin = "device-plugin"
	ModeDRA          = "dra"
)

// mebibyte is the unit of the driver's memory capacity (bytes) in MiB.
const mebibyte = 1 << 20

// loadDRA reads the driver's ResourceSlices and every allocated ResourceClaim. A cluster that
// does not serve resource.k8s.io/v1, or a caller who may not list ResourceSlices, gets neither:
// DRA-mode nodes are then left out, as before DRA mode existed.
func (s *Snapshot) loadDRA(ctx context.Context, client kubernetes.Interface) error {
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorDriver + "=" + DRADriverName})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
		return nil
	case err != nil:
		return fmt.Errorf("list ResourceSlices of driver %s: %w", DRADriverName, err)
	}
	s.ResourceSlices = slices.Items
	claims, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ResourceClaims: %w", err)
	}
	for _, c := range claims.Items {
		if c.Status.Allocation != nil {
			s.ResourceClaims = append(s.ResourceClaims, c)
		}
	}
	return nil
}

// draDevices returns the devices the driver publishes for node, in slice and device order.
func (s *Snapshot) draDevices(node string) ([]resourcev1.Device, bool) {
	var out []resourcev1.Device
	found := false
	for _, sl := range s.ResourceSlices {
		if sl.Spec.NodeName != nil && *sl.Spec.NodeName == node {
			found = true
			out = append(out, sl.Spec.Devices...)
		}
	}
	return out, found
}

// IsDRANode reports whether the driver publishes a ResourceSlice for n.
func (s *Snapshot) IsDRANode(n *corev1.Node) bool {
	_, ok := s.draDevices(n.Name)
	return ok
}

func stringAttr(d resourcev1.Device, name string) string {
	if a, ok := d.Attributes[resourcev1.QualifiedName(name)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func intAttr(d resourcev1.Device, name string) int {
	if a, ok := d.Attributes[resourcev1.QualifiedName(name)]; ok && a.IntValue != nil {
		return int(*a.IntValue)
	}
	return 0
}

// draNodeStatus is nodeStatus for a DRA-mode node: one GPU per device, used capacity summed over
// the allocated claims' results on it, pods from the claims' reservedFor.
func (s *Snapshot) draNodeStatus(n *corev1.Node) NodeStatus {
	devices, _ := s.draDevices(n.Name)
	ns := NodeStatus{Name: n.Name, Mode: ModeDRA, Ready: len(devices) > 0, GPUs: []GPUStatus{}}
	byDevice := map[string]*GPUStatus{}
	for _, d := range devices {
		mem := d.Capacity["memory"].Value
		cores := d.Capacity["cores"].Value
		g := GPUStatus{
			Index: intAttr(d, "index"), UUID: stringAttr(d, "uuid"), Model: stringAttr(d, "model"), Health: vgpu.Healthy,
			MemoryMiB: mem.Value() / mebibyte, CoresPercent: int(cores.Value()), Pods: []string{},
		}
		if len(d.Taints) > 0 {
			g.Health = vgpu.Unhealthy
		}
		ns.GPUs = append(ns.GPUs, g)
	}
	for i, d := range devices {
		byDevice[d.Name] = &ns.GPUs[i]
	}
	for _, c := range s.ResourceClaims {
		pods := claimPods(c)
		for _, r := range c.Status.Allocation.Devices.Results {
			g, ok := byDevice[r.Device]
			if r.Driver != DRADriverName || r.Pool != n.Name || !ok {
				continue
			}
			g.Slices++
			if q, ok := r.ConsumedCapacity["memory"]; ok {
				g.MemoryUsedMiB += q.Value() / mebibyte
			} else {
				g.MemoryUsedMiB = g.MemoryMiB // no consumed capacity: the whole device
				g.Exclusive = true
			}
			if q, ok := r.ConsumedCapacity["cores"]; ok {
				g.CoresUsedPercent += int(q.Value())
			}
			for _, p := range pods {
				if !slices.Contains(g.Pods, p) {
					g.Pods = append(g.Pods, p)
				}
			}
		}
	}
	return ns
}

// claimPods returns the "namespace/name" of the pods a claim is reserved for.
func claimPods(c resourcev1.ResourceClaim) []string {
	var out []string
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			out = append(out, c.Namespace+"/"+r.Name)
		}
	}
	return out
}

// draNodeChecks are doctor's checks of a DRA-mode node: the driver publishes its GPUs, none is
// tainted, and its node condition and heartbeat Lease (node/publish, as the device plugin's)
// say it is registered and alive.
func (s *Snapshot) draNodeChecks(n *corev1.Node) []Check {
	devices, _ := s.draDevices(n.Name)
	fix := fmt.Sprintf("kubectl get resourceslices --field-selector spec.nodeName=%s,spec.driver=%s -o yaml; read the DRA driver's log on %s (kubectl -n <release namespace> logs -l %s=dra-plugin --field-selector spec.nodeName=%s)",
		n.Name, DRADriverName, n.Name, LabelComponent, n.Name)
	if len(devices) == 0 {
		return []Check{{Name: "dra-driver", Result: Fail, Message: "the DRA driver's ResourceSlice lists no GPU: claims cannot be allocated here", Fix: fix}}
	}
	var tainted []string
	for _, d := range devices {
		for _, t := range d.Taints {
			tainted = append(tainted, d.Name+" ("+t.Key+"="+t.Value+")")
		}
	}
	checks := []Check{{Name: "dra-driver", Result: Pass, Message: fmt.Sprintf("DRA mode: the driver publishes %s", count(len(devices), "GPU"))}}
	health := Check{Name: "dra-health", Result: Pass, Message: "no GPU is tainted"}
	if len(tainted) > 0 {
		health = Check{Name: "dra-health", Result: Warn, Message: "tainted (no new claims there): " + strings.Join(tainted, ", "),
			Fix: "see the GPU's XIDs in the driver's log and docs/health.md; the taint goes when the GPU recovers"}
	}
	lease, hasLease := s.Leases[n.Name]
	return append(checks, health, checkCondition(n, "DRA driver"), s.checkHeartbeat(n, lease, hasLease, nil, "DRA driver").Check)
}

// draSummary is the SLICES cell of a DRA-mode GPU: its allocations, which no split count bounds.
func draSummary(g GPUStatus) string {
	if g.Exclusive {
		return "whole"
	}
	return strconv.Itoa(g.Slices) + " claims"
}
