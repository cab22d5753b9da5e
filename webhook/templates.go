package webhook

import (
	"context"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcev1client "k8s.io/client-go/kubernetes/typed/resource/v1"
)

// Templates makes the ResourceClaimTemplates of the pods the webhook turns
// into claims (DRAConfig). The handler calls it before it answers, so the
// template exists when the resourceclaim controller looks for it.
type Templates interface {
	// Ensure creates t in its namespace unless a template of its name is
	// there already. It is called concurrently and must be idempotent.
	Ensure(ctx context.Context, t *resourcev1.ResourceClaimTemplate) error
}

// ClientTemplates is Templates over the API server. The webhook's
// ServiceAccount needs create on resourceclaimtemplates, nothing more: a
// template's name is a hash of its spec, so one that exists (AlreadyExists)
// is the one wanted.
type ClientTemplates struct {
	Client resourcev1client.ResourceClaimTemplatesGetter
}

// Ensure implements Templates.
func (c ClientTemplates) Ensure(ctx context.Context, t *resourcev1.ResourceClaimTemplate) error {
	_, err := c.Client.ResourceClaimTemplates(t.Namespace).Create(ctx, t, metav1.CreateOptions{FieldManager: "gpuslice-webhook"})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ResourceClaimTemplate %s/%s: %w", t.Namespace, t.Name, err)
	}
	return nil
}
