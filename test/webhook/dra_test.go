package webhook

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/vgpu/vgputest"
	"github.com/gpuslice/gpuslice/webhook"
)

// draNamespace is the namespace whose GPU pods the DRA env's webhook converts.
const draNamespace = "ml"

// TestDRATemplatesThroughAPIServer checks the claim templates the webhook makes, through a real
// API server: the first pod of a shape creates its template, the next reuses it (as the API
// server stored it, defaults applied), and a template that holds the hashed name but is not the
// one the webhook would make (another device class, more capacity, a user's own without the
// webhook's label, metadata for the claims) refuses the pod, naming the template and what differs.
func TestDRATemplatesThroughAPIServer(t *testing.T) {
	dra := webhook.DRAConfig{Enabled: true, Namespaces: []string{draNamespace}}
	e := startEnv(t, dra)
	if _, err := e.client.CoreV1().Namespaces().Create(callCtx(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: draNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string) *corev1.Pod {
		return clean(vgputest.Pod(name).Namespace(draNamespace).Container("main").MemoryMiB(4096).Cores(20).Obj())
	}
	cfg := webhook.DefaultConfig()
	cfg.DRA = dra
	res, err := webhook.Mutate(pod("probe"), cfg)
	if err != nil || res.Template == nil {
		t.Fatalf("Mutate: %+v, %v; want a claim template", res, err)
	}
	want := res.Template
	templates := e.client.ResourceV1().ResourceClaimTemplates(draNamespace)
	claimOf := func(t *testing.T, p *corev1.Pod) string {
		t.Helper()
		if len(p.Spec.ResourceClaims) != 1 || p.Spec.ResourceClaims[0].ResourceClaimTemplateName == nil {
			t.Fatalf("created pod's claims %+v, want the webhook's one", p.Spec.ResourceClaims)
		}
		return *p.Spec.ResourceClaims[0].ResourceClaimTemplateName
	}

	t.Run("the first pod creates the template, the next reuses it", func(t *testing.T) {
		for _, name := range []string{"first", "second"} {
			got, err := e.create(callCtx(t), pod(name), false)
			if err != nil {
				t.Fatalf("create %s: %v", name, err)
			}
			if tmpl := claimOf(t, got); tmpl != want.Name {
				t.Errorf("pod %s names template %s, want %s", name, tmpl, want.Name)
			}
		}
		stored, err := templates.Get(callCtx(t), want.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if stored.Labels[webhook.LabelDRATemplate] != "true" {
			t.Errorf("stored template labels %v, want %s=true", stored.Labels, webhook.LabelDRATemplate)
		}
		if diff := cmp.Diff(want.Spec, stored.Spec, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("stored template spec (-want +got):\n%s", diff)
		}
		if err := templates.Delete(callCtx(t), want.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	for _, tt := range []struct {
		name, pod string
		change    func(*resourcev1.ResourceClaimTemplate)
		want      string // what the denial says differs
	}{{
		name: "another device class", pod: "class",
		change: func(r *resourcev1.ResourceClaimTemplate) {
			r.Spec.Spec.Devices.Requests[0].Exactly.DeviceClassName = "other.example.com"
		},
		want: `spec.spec.devices.requests[0].exactly.deviceClassName is "other.example.com", want "gpuslice.hami.io"`,
	}, {
		name: "more memory", pod: "memory",
		change: func(r *resourcev1.ResourceClaimTemplate) {
			r.Spec.Spec.Devices.Requests[0].Exactly.Capacity.Requests["memory"] = resource.MustParse("8Gi")
		},
		want: `spec.spec.devices.requests[0].exactly.capacity.requests[memory] is "8Gi", want "4Gi"`,
	}, {
		name: "a user's own template of the same spec", pod: "unlabelled",
		change: func(r *resourcev1.ResourceClaimTemplate) { r.Labels = map[string]string{"team": "a"} },
		want:   `metadata.labels[gpuslice.hami.io/webhook-template] is absent, want "true"`,
	}, {
		name: "labels for the claims", pod: "claim-labels",
		change: func(r *resourcev1.ResourceClaimTemplate) { r.Spec.Labels = map[string]string{"team": "a"} },
		want:   `spec.metadata.labels[team] is "a", want absent`,
	}} {
		t.Run("a template of the hashed name with "+tt.name+" refuses the pod", func(t *testing.T) {
			squat := want.DeepCopy()
			tt.change(squat)
			if _, err := templates.Create(callCtx(t), squat, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := templates.Delete(callCtx(t), squat.Name, metav1.DeleteOptions{}); err != nil {
					t.Errorf("delete template %s: %v", squat.Name, err)
				}
			})
			p := pod(tt.pod)
			got, err := e.create(callCtx(t), p, false)
			if err == nil {
				t.Fatalf("pod admitted, naming template %s of another spec", claimOf(t, got))
			}
			t.Logf("denied: %v", err)
			if !apierrors.IsConflict(err) {
				t.Errorf("create: %v, want Conflict", err)
			}
			for _, w := range []string{
				`admission webhook "` + webhookName + `" denied the request`,
				"ResourceClaimTemplate " + draNamespace + "/" + want.Name + " exists but is not the one gpuslice makes for this pod",
				tt.want,
			} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if _, err := e.client.CoreV1().Pods(draNamespace).Get(callCtx(t), p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("get the refused pod: %v, want NotFound", err)
			}
		})
	}
}
