package webhook

import (
	"context"
	"errors"
	"fmt"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcev1client "k8s.io/client-go/kubernetes/typed/resource/v1"
)

// Templates makes the ResourceClaimTemplates of the pods the webhook turns
// into claims (DRAConfig). The handler calls it before it answers, so the
// template exists when the resourceclaim controller looks for it.
type Templates interface {
	// Ensure creates t in its namespace unless the same template is there
	// already: of t's name, with t's LabelDRATemplate label and t's spec.
	// A template of that name that is not the same is an error wrapping
	// ErrTemplateConflict that names it and what differs; it is left as it
	// is. Ensure is called concurrently and must be idempotent.
	Ensure(ctx context.Context, t *resourcev1.ResourceClaimTemplate) error
}

// ErrTemplateConflict is returned by Templates.Ensure when a template of the
// wanted name exists but is not the one the webhook makes: a claim made
// from it would not be what the pod asked for.
var ErrTemplateConflict = errors.New("exists but is not the one gpuslice makes for this pod")

// ClientTemplates is Templates over the API server. The webhook's
// ServiceAccount needs create and get on resourceclaimtemplates, nothing
// more: a template's name is a hash of its spec, so on AlreadyExists it
// reads the one there and checks it is the same (a template's spec is
// immutable; anyone who may create templates in the namespace may have
// taken the name first).
type ClientTemplates struct {
	Client resourcev1client.ResourceClaimTemplatesGetter
}

// ensureAttempts bounds the creates Ensure tries when the template it found
// is deleted before it could read it.
const ensureAttempts = 3

// Ensure implements Templates.
func (c ClientTemplates) Ensure(ctx context.Context, t *resourcev1.ResourceClaimTemplate) error {
	client := c.Client.ResourceClaimTemplates(t.Namespace)
	for range ensureAttempts {
		_, err := client.Create(ctx, t, metav1.CreateOptions{FieldManager: "gpuslice-webhook"})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create ResourceClaimTemplate %s/%s: %w", t.Namespace, t.Name, err)
		}
		have, err := client.Get(ctx, t.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // deleted since: create it again
		}
		if err != nil {
			return fmt.Errorf("read ResourceClaimTemplate %s/%s, which exists: %w", t.Namespace, t.Name, err)
		}
		if diff := draTemplateDiff(have, t); len(diff) > 0 {
			return fmt.Errorf("ResourceClaimTemplate %s/%s %w: %s; delete it, or if it is yours give it another name: names %s<hash> are gpuslice's",
				t.Namespace, t.Name, ErrTemplateConflict, strings.Join(diff, "; "), DRATemplatePrefix)
		}
		return nil
	}
	return fmt.Errorf("create ResourceClaimTemplate %s/%s: deleted each time it was found, %d times", t.Namespace, t.Name, ensureAttempts)
}
