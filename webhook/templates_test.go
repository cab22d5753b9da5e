package webhook_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpuslice/gpuslice/vgpu/vgputest"
	"github.com/gpuslice/gpuslice/webhook"
)

// TestClientTemplatesEnsure checks, over client-go's fake clientset, what the API server test
// (test/webhook TestDRATemplatesThroughAPIServer) cannot set up: a template equal in meaning but
// not in form, more differences than a message names, and a template deleted between the create
// that found it and the read.
func TestClientTemplatesEnsure(t *testing.T) {
	res, err := webhook.Mutate(vgputest.Pod("p").Namespace("ml").Container("main").MemoryMiB(4096).Cores(20).Obj(), draConfig())
	if err != nil || res.Template == nil {
		t.Fatalf("Mutate: %+v, %v", res, err)
	}
	want := res.Template
	changed := func(change func(*resourcev1.ResourceClaimTemplate)) *resourcev1.ResourceClaimTemplate {
		r := want.DeepCopy()
		change(r)
		return r
	}
	tests := []struct {
		name     string
		existing *resourcev1.ResourceClaimTemplate
		// goneOnce makes the first create answer AlreadyExists and the read NotFound.
		goneOnce bool
		want     string // the error; "" for none
	}{{
		name: "absent: created",
	}, {
		name: "the same, memory in MiB and no selector list: used",
		existing: changed(func(r *resourcev1.ResourceClaimTemplate) {
			r.Spec.Spec.Devices.Requests[0].Exactly.Capacity.Requests["memory"] = resource.MustParse("4096Mi")
			r.Spec.Spec.Devices.Requests[0].Exactly.Selectors = nil
		}),
	}, {
		name: "five differences: the first four named",
		existing: changed(func(r *resourcev1.ResourceClaimTemplate) {
			r.Labels = nil
			x := r.Spec.Spec.Devices.Requests[0].Exactly
			x.DeviceClassName, x.Count = "other", 2
			x.Capacity.Requests["cores"], x.Capacity.Requests["memory"] = resource.MustParse("100"), resource.MustParse("1Gi")
		}),
		want: `ResourceClaimTemplate ml/` + want.Name + ` exists but is not the one gpuslice makes for this pod: ` +
			`metadata.labels[gpuslice.hami.io/webhook-template] is absent, want "true"; ` +
			`spec.spec.devices.requests[0].exactly.deviceClassName is "other", want "gpuslice.hami.io"; ` +
			`spec.spec.devices.requests[0].exactly.count is 2, want 1; ` +
			`spec.spec.devices.requests[0].exactly.capacity.requests[cores] is "100", want "20"; ` +
			`delete it, or if it is yours give it another name: names gpuslice-<hash> are gpuslice's`,
	}, {
		name: "a longer request list, its first request a user's: lengths, then entries",
		existing: changed(func(r *resourcev1.ResourceClaimTemplate) {
			r.Spec.Spec.Devices.Requests = append(r.Spec.Spec.Devices.Requests, r.Spec.Spec.Devices.Requests[0])
			r.Spec.Spec.Devices.Requests[0] = resourcev1.DeviceRequest{Name: "main", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: strings.Repeat("é", 60)}}
		}),
		want: `pod: spec.spec.devices.requests has 2 entries, want 1; spec.spec.devices.requests[0].exactly.deviceClassName is "` + strings.Repeat("é", 39) + `…, want "gpuslice.hami.io"; ` +
			`spec.spec.devices.requests[0].exactly.allocationMode is "", want "ExactCount"; `,
	}, {
		name:     "deleted before it was read: created again",
		goneOnce: true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var objs []runtime.Object
			if tt.existing != nil {
				objs = append(objs, tt.existing)
			}
			client := fake.NewClientset(objs...)
			if tt.goneOnce {
				var creates int
				client.PrependReactor("create", "resourceclaimtemplates", func(clienttesting.Action) (bool, runtime.Object, error) {
					creates++
					return creates == 1, nil, apierrors.NewAlreadyExists(resourcev1.Resource("resourceclaimtemplates"), want.Name)
				})
				client.PrependReactor("get", "resourceclaimtemplates", func(clienttesting.Action) (bool, runtime.Object, error) {
					return creates == 1, nil, apierrors.NewNotFound(resourcev1.Resource("resourceclaimtemplates"), want.Name)
				})
			}
			err := webhook.ClientTemplates{Client: client.ResourceV1()}.Ensure(t.Context(), want)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Ensure: %v, want nil", err)
				}
				stored, err := client.ResourceV1().ResourceClaimTemplates("ml").Get(t.Context(), want.Name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if tt.existing != nil {
					if diff := cmp.Diff(tt.existing, stored); diff != "" {
						t.Errorf("the template there was changed (-want +got):\n%s", diff)
					}
				}
				return
			}
			if !errors.Is(err, webhook.ErrTemplateConflict) {
				t.Errorf("Ensure: %v, want ErrTemplateConflict", err)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Ensure: %v\nwant it to contain %s", err, tt.want)
			}
		})
	}
}
