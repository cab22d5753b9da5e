package e2e

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/test/cluster"
)

// draClass is the DeviceClass the DRA tests claim from, as the chart installs it.
const draClass = "gpuslice.hami.io"

// createDeviceClass creates the DeviceClass of gpuslice's DRA driver.
func createDeviceClass(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	dc := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: draClass},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + cluster.DRADriverName + `"`},
		}}},
	}
	if _, err := c.Client().ResourceV1().DeviceClasses().Create(context.Background(), dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// claimTemplateName names the template of a slice of memMiB MiB and cores percent.
func claimTemplateName(memMiB, cores int64) string { return fmt.Sprintf("gpu-%dmi-%dc", memMiB, cores) }

// createClaimTemplate creates the ResourceClaimTemplate of one GPU slice of memMiB MiB and cores
// percent (0: no cores asked) in the default namespace; memMiB 0 asks for no capacity at all, which
// the driver's request policy makes a whole GPU.
func createClaimTemplate(t *testing.T, c *cluster.Cluster, memMiB, cores int64) string {
	t.Helper()
	req := map[resourcev1.QualifiedName]resource.Quantity{}
	if memMiB > 0 {
		req["memory"] = *resource.NewQuantity(memMiB<<20, resource.BinarySI)
	}
	if cores > 0 {
		req["cores"] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	var capacity *resourcev1.CapacityRequirements
	if len(req) > 0 {
		capacity = &resourcev1.CapacityRequirements{Requests: req}
	}
	name := claimTemplateName(memMiB, cores)
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: draClass,
				Capacity:        capacity,
			}}},
		}}},
	}
	if _, err := c.Client().ResourceV1().ResourceClaimTemplates(metav1.NamespaceDefault).Create(context.Background(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// claimPod returns a pod whose containers all use one claim made from template.
func claimPod(name, template string, containers ...string) *corev1.Pod {
	if len(containers) == 0 {
		containers = []string{"main"}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(template)}},
		},
	}
	for _, ctr := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
			Name: ctr, Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
		})
	}
	return p
}

// checkDRA returns the env mismatches of running against their claims and the over-commits of
// every device.
func checkDRA(t *testing.T, c *cluster.Cluster, running []corev1.Pod) (mismatches, overCommits []string) {
	t.Helper()
	ctx := context.Background()
	records, err := c.LatestRecords()
	if err != nil {
		t.Fatal(err)
	}
	devices, err := c.DRADevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range running {
		mismatches = append(mismatches, c.DRAClaimMismatches(ctx, &running[i], records, devices)...)
	}
	overCommits, err = c.DRAOverCommits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return mismatches, overCommits
}
