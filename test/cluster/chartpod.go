package cluster

import (
	"context"
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// pluginContainer is the name of the device plugin's container in the chart's DaemonSet.
const pluginContainer = "device-plugin"

// rootCAConfigMap is the ConfigMap every namespace gets from kube-controller-manager (which does
// not run here): the CA of the API server, for the projected ServiceAccount volume.
const rootCAConfigMap = "kube-root-ca.crt"

// startChartPluginPod runs n's device plugin as the chart's DaemonSet would, as a real container of
// the gpuslice image on n's containerd: it creates the DaemonSet's pod on n, as the DaemonSet
// controller (which does not run here) would. Only what this machine needs is changed, and said:
// the pod uses the host's network (the pod network here reaches nothing, the API server
// included), the API server is reached as adaptPod says, and, since all nodes share one host
// network, the plugin's health endpoint gets a port of its own on the host's address, where the
// kubelet's probes reach it. The kubelet mounts every volume of the template and the
// ServiceAccount's projected token, so the chart's mounts, RBAC and node policy are what the
// plugin runs with. It does not wait: see WaitPluginReady.
func (n *Node) startChartPluginPod(ctx context.Context, ds *appsv1.DaemonSet) error {
	c := n.c
	ip, err := hostIPv4()
	if err != nil {
		return err
	}
	health, err := freePort()
	if err != nil {
		return err
	}
	spec := *ds.Spec.Template.Spec.DeepCopy()
	spec.NodeName = n.Name
	spec.HostNetwork = true
	spec.DNSPolicy = corev1.DNSDefault
	found := false
	for i := range spec.Containers {
		ctr := &spec.Containers[i]
		if ctr.Name != pluginContainer {
			continue
		}
		found = true
		ctr.Args = append(append(ctr.Args, "--health-address="+ip+":"+strconv.Itoa(health)), n.PluginArgs...)
		for j := range ctr.Ports {
			if ctr.Ports[j].Name == "health" {
				ctr.Ports[j].ContainerPort = int32(health) //nolint:gosec // G115: a TCP port
			}
		}
		for _, p := range []*corev1.Probe{ctr.ReadinessProbe, ctr.LivenessProbe} {
			if p != nil && p.HTTPGet != nil {
				p.HTTPGet.Port = intstr.FromInt32(int32(health)) //nolint:gosec // G115: a TCP port
			}
		}
	}
	if !found {
		return fmt.Errorf("DaemonSet %s: no container %q", ds.Name, pluginContainer)
	}
	isController := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        ds.Name + "-" + n.Name,
			Namespace:   ds.Namespace,
			Labels:      ds.Spec.Template.Labels,
			Annotations: ds.Spec.Template.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: &isController,
			}},
		},
		Spec: spec,
	}
	if err := c.adaptPod(ctx, pod); err != nil {
		return err
	}
	if err := c.replacePod(ctx, pod); err != nil {
		return fmt.Errorf("the plugin pod of DaemonSet %s on %s: %w", ds.Name, n.Name, err)
	}
	n.PluginDaemonSet, n.PluginHealthPort, n.PluginPod = ds.Name, health, pod.Name
	return nil
}

// adaptPod changes what every pod the harness creates for the chart needs on this machine, as
// the parts of a cluster that do not run here would have it: the projected ServiceAccount token
// volume, mounted in every container, unless the pod opts out (automountServiceAccountToken:
// false), as the disabled ServiceAccount admission plugin would add it (no controller creates the
// default ServiceAccounts); the kube-root-ca.crt ConfigMap that volume reads, as
// kube-controller-manager's publisher would create it; and KUBERNETES_SERVICE_HOST and _PORT with
// the API server's loopback address in every container, since no kube-proxy routes the
// kubernetes Service's address.
func (c *Cluster) adaptPod(ctx context.Context, pod *corev1.Pod) error {
	spec := &pod.Spec
	token := spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken
	if token {
		if err := c.ensureRootCA(ctx, pod.Namespace); err != nil {
			return err
		}
		spec.Volumes = append(spec.Volumes, serviceAccountTokenVolume())
	}
	for _, ctrs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range ctrs {
			ctr := &ctrs[i]
			if token {
				ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: tokenVolume, MountPath: tokenMountPath, ReadOnly: true})
			}
			ctr.Env = append(ctr.Env,
				corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"},
				corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: strconv.Itoa(c.State.APIServerPort)},
			)
		}
	}
	return nil
}

// replacePod deletes the pod of pod's name, if any, waits until it is gone and creates pod.
func (c *Cluster) replacePod(ctx context.Context, pod *corev1.Pod) error {
	pods := c.client.CoreV1().Pods(pod.Namespace)
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the old pod %s: %w", pod.Name, err)
	}
	if err := c.waitFor(ctx, "old pod "+pod.Name+" gone", nil, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		return err
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", pod.Name, err)
	}
	return nil
}

// The projected ServiceAccount volume the API server's ServiceAccount admission plugin adds to a
// pod; the cluster runs without that plugin (no controller creates the default ServiceAccounts).
const (
	tokenVolume    = "kube-api-access"
	tokenMountPath = "/var/run/secrets/kubernetes.io/serviceaccount" //nolint:gosec // G101: a folder, not a credential
)

// serviceAccountTokenVolume returns the volume the ServiceAccount admission plugin would add: a
// pod-bound token of the pod's ServiceAccount, the API server's CA and the namespace.
func serviceAccountTokenVolume() corev1.Volume {
	expiry := int64(3607)
	return corev1.Volume{Name: tokenVolume, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &expiry}},
			{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: rootCAConfigMap},
				Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
			}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{
				Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"},
			}}}},
		},
	}}}
}

// ensureRootCA creates the kube-root-ca.crt ConfigMap in ns with the API server's CA, as
// kube-controller-manager's publisher would, unless it exists.
func (c *Cluster) ensureRootCA(ctx context.Context, ns string) error {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: rootCAConfigMap, Namespace: ns},
		Data:       map[string]string{"ca.crt": string(c.State.CAData)},
	}
	if _, err := c.client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ConfigMap %s/%s: %w", ns, rootCAConfigMap, err)
	}
	return nil
}
