// Package clientset implements publish.API with a client-go clientset
// (client-go's fake in tests). It is a package of its own so that an agent
// that speaks to the API server without a clientset (the device plugin's
// own REST client) does not link one.
package clientset

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// API implements publish.API with a clientset. Safe for concurrent use as
// the clientset is.
type API struct {
	client kubernetes.Interface
}

// New returns the API over client.
func New(client kubernetes.Interface) *API { return &API{client: client} }

// GetNode returns the Node name.
func (a *API) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return a.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

// PatchNode applies the JSON merge patch data to the Node name.
func (a *API) PatchNode(ctx context.Context, name string, data []byte, opts metav1.PatchOptions) (*corev1.Node, error) {
	return a.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, data, opts)
}

// PatchNodeStatus applies the strategic merge patch data to the status of
// the Node name.
func (a *API) PatchNodeStatus(ctx context.Context, name string, data []byte, opts metav1.PatchOptions) (*corev1.Node, error) {
	return a.client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, data, opts, "status")
}

// GetLease returns the Lease namespace/name.
func (a *API) GetLease(ctx context.Context, namespace, name string) (*coordinationv1.Lease, error) {
	return a.client.CoordinationV1().Leases(namespace).Get(ctx, name, metav1.GetOptions{})
}

// CreateLease creates lease in lease.Namespace.
func (a *API) CreateLease(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	return a.client.CoordinationV1().Leases(lease.Namespace).Create(ctx, lease, opts)
}

// UpdateLease replaces lease.
func (a *API) UpdateLease(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	return a.client.CoordinationV1().Leases(lease.Namespace).Update(ctx, lease, opts)
}
