package cluster

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/test/fakecri"
)

// mebibyte is the unit of the containers' memory limits.
const mebibyte = 1 << 20

// DRADevices returns the devices gpuslice's DRA driver publishes, by "<pool>/<device>".
func (c *Cluster) DRADevices(ctx context.Context) (map[string]resourcev1.Device, error) {
	list, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorDriver + "=" + DRADriverName})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	out := map[string]resourcev1.Device{}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			out[s.Spec.Pool.Name+"/"+d.Name] = d
		}
	}
	return out, nil
}

// DRAClaimMismatches compares the environment each container of pod got at CreateContainer with
// the allocation of the claims it references: NVIDIA_VISIBLE_DEVICES must list the allocated
// GPUs' UUIDs, CUDA_DEVICE_MEMORY_LIMIT_<i> their consumed memory in MiB, CUDA_DEVICE_SM_LIMIT the
// consumed cores when above 0. It returns one line per mismatch.
func (c *Cluster) DRAClaimMismatches(ctx context.Context, pod *corev1.Pod, records map[string]fakecri.Record, devices map[string]resourcev1.Device) []string {
	claimOf := map[string]string{}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			claimOf[s.Name] = *s.ResourceClaimName
		}
	}
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			claimOf[rc.Name] = *rc.ResourceClaimName
		}
	}
	var bad []string
	for _, ctr := range pod.Spec.Containers {
		if len(ctr.Resources.Claims) == 0 {
			continue
		}
		r, ok := records[RecordKey(pod.UID, ctr.Name)]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s/%s: no CreateContainer record", pod.Name, ctr.Name))
			continue
		}
		for _, ref := range ctr.Resources.Claims {
			name, ok := claimOf[ref.Name]
			if !ok {
				bad = append(bad, fmt.Sprintf("%s/%s: claim %s has no ResourceClaim", pod.Name, ctr.Name, ref.Name))
				continue
			}
			claim, err := c.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s/%s: claim %s: %v", pod.Name, ctr.Name, name, err))
				continue
			}
			bad = append(bad, claimEnvMismatches(pod.Name+"/"+ctr.Name, claim, r, devices)...)
		}
	}
	return bad
}

// claimEnvMismatches checks one container's environment against claim's allocation.
func claimEnvMismatches(who string, claim *resourcev1.ResourceClaim, r fakecri.Record, devices map[string]resourcev1.Device) []string {
	if claim.Status.Allocation == nil {
		return []string{who + ": claim " + claim.Name + " is not allocated"}
	}
	var uuids, limits []string
	cores := ""
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.Driver != DRADriverName {
			continue
		}
		d, ok := devices[res.Pool+"/"+res.Device]
		if !ok {
			return []string{fmt.Sprintf("%s: claim %s allocated %s/%s, which no ResourceSlice lists", who, claim.Name, res.Pool, res.Device)}
		}
		uuid := d.Attributes["uuid"].StringValue
		if uuid == nil {
			return []string{fmt.Sprintf("%s: device %s/%s has no uuid attribute", who, res.Pool, res.Device)}
		}
		uuids = append(uuids, *uuid)
		mem := d.Capacity["memory"].Value
		if q, ok := res.ConsumedCapacity["memory"]; ok {
			mem = q
		}
		limits = append(limits, strconv.FormatInt(mem.Value()/mebibyte, 10)+"m")
		if q, ok := res.ConsumedCapacity["cores"]; ok && cores == "" && q.Value() > 0 {
			cores = strconv.FormatInt(q.Value(), 10)
		}
	}
	var bad []string
	check := func(key, want string) {
		if got := r.Env[key]; got != want {
			bad = append(bad, fmt.Sprintf("%s: %s=%q, claim %s says %q", who, key, got, claim.Name, want))
		}
	}
	check("NVIDIA_VISIBLE_DEVICES", strings.Join(uuids, ","))
	for i, l := range limits {
		check("CUDA_DEVICE_MEMORY_LIMIT_"+strconv.Itoa(i), l)
	}
	check("CUDA_DEVICE_SM_LIMIT", cores)
	return bad
}

// DRAOverCommits sums the capacity the allocated claims of every namespace consume per device
// and returns one line per device and capacity above what the device publishes, sorted.
func (c *Cluster) DRAOverCommits(ctx context.Context) ([]string, error) {
	devices, err := c.DRADevices(ctx)
	if err != nil {
		return nil, err
	}
	claims, err := c.client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	used := map[string]map[resourcev1.QualifiedName]*resource.Quantity{}
	for _, claim := range claims.Items {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, res := range claim.Status.Allocation.Devices.Results {
			if res.Driver != DRADriverName {
				continue
			}
			key := res.Pool + "/" + res.Device
			if used[key] == nil {
				used[key] = map[resourcev1.QualifiedName]*resource.Quantity{}
			}
			for name, q := range res.ConsumedCapacity {
				if used[key][name] == nil {
					used[key][name] = resource.NewQuantity(0, q.Format)
				}
				used[key][name].Add(q)
			}
		}
	}
	var bad []string
	for key, caps := range used {
		for name, q := range caps {
			limit := devices[key].Capacity[name].Value
			if q.Cmp(limit) > 0 {
				bad = append(bad, fmt.Sprintf("%s: %s consumed %s of %s", key, name, q.String(), limit.String()))
			}
		}
	}
	sort.Strings(bad)
	return bad, nil
}
