package chart

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// object is one rendered document: generic, and decoded strictly into its Kubernetes type when
// the chart renders a built-in kind (typed is nil for custom resources such as cert-manager's).
type object struct {
	u     *unstructured.Unstructured
	typed any
}

// ref names an object as "Kind namespace/name" in messages.
func (o object) ref() string {
	if ns := o.u.GetNamespace(); ns != "" {
		return fmt.Sprintf("%s %s/%s", o.u.GetKind(), ns, o.u.GetName())
	}
	return fmt.Sprintf("%s %s", o.u.GetKind(), o.u.GetName())
}

// typedKind returns an empty object of a built-in kind the chart renders, or nil for the custom
// resources it may render (customKinds). Any other kind is an error: add it here, so that it
// is decoded strictly and checked.
func typedKind(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return &rbacv1.ClusterRole{}, nil
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, nil
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "admissionregistration.k8s.io/v1 MutatingWebhookConfiguration":
		return &admissionregistrationv1.MutatingWebhookConfiguration{}, nil
	case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy":
		return &admissionregistrationv1.ValidatingAdmissionPolicy{}, nil
	case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding":
		return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, nil
	case "resource.k8s.io/v1 DeviceClass":
		return &resourcev1.DeviceClass{}, nil
	case "cert-manager.io/v1 Issuer", "cert-manager.io/v1 Certificate", "monitoring.coreos.com/v1 ServiceMonitor", "monitoring.coreos.com/v1 PrometheusRule":
		return nil, nil
	}
	return nil, fmt.Errorf("kind %q of apiVersion %q is not one the chart tests know: add it to typedKind", kind, apiVersion)
}

// parseRender splits a helm template output into its objects, in order. Every document must be
// valid YAML with apiVersion, kind and name, and decode strictly (no unknown or misplaced
// field) into its Kubernetes type.
func parseRender(data []byte) ([]object, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []object
	for i := 0; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d is not YAML: %w\n%s", i, err, doc)
		}
		if string(js) == "null" {
			continue // comments only
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("document %d is not a Kubernetes object: %w\n%s", i, err, doc)
		}
		if u.GetName() == "" {
			return nil, fmt.Errorf("document %d (%s) has no metadata.name", i, u.GetKind())
		}
		obj := object{u: u}
		typed, err := typedKind(u.GetAPIVersion(), u.GetKind())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", obj.ref(), err)
		}
		if typed != nil {
			if err := yaml.UnmarshalStrict(doc, typed); err != nil {
				return nil, fmt.Errorf("%s does not decode strictly into its type: %w", obj.ref(), err)
			}
			obj.typed = typed
		}
		objs = append(objs, obj)
	}
}

// rendered is one parsed render with lookups by kind and name.
type rendered struct {
	objs []object
}

// all returns the typed objects of type T, in render order.
func all[T any](r rendered) []T {
	var out []T
	for _, o := range r.objs {
		if t, ok := o.typed.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// find returns the object of kind and name (any namespace), or nil.
func (r rendered) find(kind, name string) *object {
	for i := range r.objs {
		if r.objs[i].u.GetKind() == kind && r.objs[i].u.GetName() == name {
			return &r.objs[i]
		}
	}
	return nil
}

// workload is a Deployment or DaemonSet with its pod template.
type workload struct {
	ref      string
	meta     metav1.ObjectMeta
	selector *metav1.LabelSelector
	template corev1.PodTemplateSpec
	replicas int32 // 0 for a DaemonSet
}

func (r rendered) workloads() []workload {
	var out []workload
	for _, o := range r.objs {
		switch w := o.typed.(type) {
		case *appsv1.Deployment:
			replicas := int32(1)
			if w.Spec.Replicas != nil {
				replicas = *w.Spec.Replicas
			}
			out = append(out, workload{ref: o.ref(), meta: w.ObjectMeta, selector: w.Spec.Selector, template: w.Spec.Template, replicas: replicas})
		case *appsv1.DaemonSet:
			out = append(out, workload{ref: o.ref(), meta: w.ObjectMeta, selector: w.Spec.Selector, template: w.Spec.Template})
		}
	}
	return out
}

// chartMeta is the part of Chart.yaml the labels carry.
type chartMeta struct {
	Name       string `json:"name"`
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

func readChartMeta() (chartMeta, error) {
	data, err := os.ReadFile(filepath.Join(filepath.FromSlash(chartDir), "Chart.yaml"))
	if err != nil {
		return chartMeta{}, fmt.Errorf("read Chart.yaml: %w", err)
	}
	var m chartMeta
	if err := yaml.Unmarshal(data, &m); err != nil {
		return chartMeta{}, fmt.Errorf("parse Chart.yaml: %w", err)
	}
	return m, nil
}

// sortedKeys returns the keys of m in order, for stable messages.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
