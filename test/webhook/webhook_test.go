package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/internal/metricstest"
	"github.com/gpuslice/gpuslice/test/harness/apiserver"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
	"github.com/gpuslice/gpuslice/webhook"
	"github.com/gpuslice/gpuslice/webhook/webhooktest"
)

const (
	// webhookName is the webhook's name in the MutatingWebhookConfiguration;
	// the API server quotes it in denials.
	webhookName = "pods.gpuslice.io"
	// configExcludedNS is excluded by the webhook's own Config, not by the
	// namespaceSelector: the API server calls the webhook, which skips it.
	configExcludedNS = "gpu-excluded"
	// waitTimeout bounds every wait on the API server.
	waitTimeout = time.Minute
)

// env is a real API server calling an in-process webhook server.
type env struct {
	client kubernetes.Interface
	ca     *webhooktest.CA
	volume *webhooktest.SecretVolume
	addr   string // the webhook's host:port
}

// startEnv starts the API server and the webhook, registers the webhook and
// waits until the API server calls it. With dra.Enabled the webhook converts
// pods to claims and creates their templates through the API server.
func startEnv(t *testing.T, dra webhook.DRAConfig) *env {
	t.Helper()
	s := apiserver.Start(t, apiserver.Options{})
	e := &env{
		client: kubernetes.NewForConfigOrDie(s.Config()),
		ca:     webhooktest.NewCA(t),
		volume: webhooktest.NewSecretVolume(t),
	}
	e.volume.Write(t, e.ca.Serving(t))

	cfg := webhook.DefaultServerConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile = e.volume.CertFile(), e.volume.KeyFile()
	cfg.ExcludedNamespaces = []string{metav1.NamespaceSystem, configExcludedNS}
	cfg.DRA = dra
	var templates webhook.Templates
	if dra.Enabled {
		templates = webhook.ClientTemplates{Client: e.client.ResourceV1()}
	}
	srv, err := webhook.NewServerWithTemplates(cfg, templates)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(1)))
	serveCtx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(serveCtx, ln) }()
	// Registered after the API server's cleanup, so it runs first.
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("webhook Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("webhook still serving 30s after its context ended")
		}
	})

	ctx := callCtx(t)
	for _, ns := range []string{metav1.NamespaceSystem, configExcludedNS} {
		_, err := e.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}
	if _, err := e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, webhookConfiguration(e.addr, e.ca.CertPEM), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create MutatingWebhookConfiguration: %v", err)
	}
	e.waitEffective(t)
	return e
}

// webhookConfiguration is the configuration docs/webhook.md recommends,
// with a URL instead of a Service.
func webhookConfiguration(addr string, caBundle []byte) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "gpuslice-webhook"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: webhookName,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				URL:      ptr.To("https://" + addr + webhook.MutatePath),
				CABundle: caBundle,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
					Scope: ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{metav1.NamespaceSystem},
			}}},
			MatchConditions:         webhook.MatchConditions(),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
}

// waitEffective creates GPU pods in dry-run mode until the API server's
// answer shows the webhook's patch: the configuration reaches the API
// server's admission chain through an informer, a moment after it is
// stored.
func (e *env) waitEffective(t *testing.T) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		got, err := e.create(ctx, gpuPod("probe"), true)
		if err != nil {
			last = err
			return false, nil
		}
		last = fmt.Errorf("spec.schedulerName is %q", got.Spec.SchedulerName)
		return got.Spec.SchedulerName == webhook.DefaultSchedulerName, nil
	})
	if err != nil {
		t.Fatalf("webhook not effective after %v: %v (last: %v)", waitTimeout, err, last)
	}
}

// create creates pod through the API server, in dry-run mode if dryRun.
func (e *env) create(ctx context.Context, pod *corev1.Pod, dryRun bool) (*corev1.Pod, error) {
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return e.client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, opts)
}

// gpuPod is a pod with one container asking for 10Gi of GPU memory, with
// no hami.io/gpu and no scheduler name: the webhook has work to do.
func gpuPod(name string) *corev1.Pod {
	return clean(vgputest.Pod(name).Limit(vgpu.ResourceMemory, "10Gi").Obj())
}

// clean clears what the builder sets that a user does not.
func clean(pod *corev1.Pod) *corev1.Pod {
	pod.UID = ""
	return pod
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// podResources is what the webhook may change in a one-container pod.
type podResources struct {
	SchedulerName    string
	Limits, Requests map[string]string
}

func resourcesOf(pod *corev1.Pod) podResources {
	list := func(l corev1.ResourceList) map[string]string {
		out := map[string]string{}
		for name, q := range l {
			out[string(name)] = q.String()
		}
		return out
	}
	c := pod.Spec.Containers[0]
	return podResources{SchedulerName: pod.Spec.SchedulerName, Limits: list(c.Resources.Limits), Requests: list(c.Resources.Requests)}
}

func TestWebhookThroughAPIServer(t *testing.T) {
	e := startEnv(t, webhook.DRAConfig{})

	t.Run("GPU pod is steered to the gpuslice scheduler and defaulted", func(t *testing.T) {
		got, err := e.create(callCtx(t), gpuPod("gpu"), false)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		// The API server copied limits into requests before calling the
		// webhook, so both are patched.
		slice := map[string]string{"hami.io/gpu": "1", "hami.io/gpumem": "10240"}
		want := podResources{SchedulerName: "gpuslice-scheduler", Limits: slice, Requests: slice}
		if diff := cmp.Diff(want, resourcesOf(got)); diff != "" {
			t.Errorf("created pod (-want +got):\n%s", diff)
		}
	})

	t.Run("forged allocation annotation is rejected", func(t *testing.T) {
		pod := clean(vgputest.Pod("forged").Annotation(vgpu.AnnotationPodAllocation, `{"version":1}`).GPU(1).Obj())
		_, err := e.create(callCtx(t), pod, false)
		if !apierrors.IsForbidden(err) {
			t.Fatalf("create: %v, want Forbidden", err)
		}
		for _, want := range []string{
			`admission webhook "` + webhookName + `" denied the request`,
			`annotation hami.io/gpu-allocation="{\"version\":1}": must not be set when the pod is created: only the gpuslice scheduler extender writes it`,
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not contain %q", err, want)
			}
		}
		if _, err := e.client.CoreV1().Pods(pod.Namespace).Get(callCtx(t), pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("get the rejected pod: %v, want NotFound", err)
		}
	})

	t.Run("invalid gpucores is rejected naming container, resource and value", func(t *testing.T) {
		_, err := e.create(callCtx(t), clean(vgputest.Pod("cores").Cores(150).Obj()), false)
		if !apierrors.IsBadRequest(err) {
			t.Fatalf("create: %v, want BadRequest", err)
		}
		want := `admission webhook "` + webhookName + `" denied the request: container "main": hami.io/gpucores=150: must be an integer from 1 to 100`
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	})

	t.Run("pod without GPU resources is unchanged", func(t *testing.T) {
		// The same pod in kube-system never reaches the webhook (the
		// namespaceSelector): what the API server alone makes of it.
		pod := clean(vgputest.Pod("cpu").Limit(corev1.ResourceCPU, "1").Obj())
		got, err := e.create(callCtx(t), pod, false)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		ref := pod.DeepCopy()
		ref.Namespace = metav1.NamespaceSystem
		want, err := e.create(callCtx(t), ref, false)
		if err != nil {
			t.Fatalf("create in kube-system: %v", err)
		}
		if diff := cmp.Diff(want.Spec, got.Spec); diff != "" {
			t.Errorf("spec through the webhook vs without it (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(want.Annotations, got.Annotations); diff != "" {
			t.Errorf("annotations through the webhook vs without it (-want +got):\n%s", diff)
		}
	})

	t.Run("only pods with hami.io resources or annotations are sent", func(t *testing.T) {
		testMatchConditions(t, e)
	})

	t.Run("kube-system is excluded by the namespaceSelector", func(t *testing.T) {
		pod := gpuPod("system")
		pod.Namespace = metav1.NamespaceSystem
		pod.Annotations = map[string]string{vgpu.AnnotationPodAllocation: "{}"}
		got, err := e.create(callCtx(t), pod, false)
		if err != nil {
			t.Fatalf("create: %v (the webhook must not be called for kube-system)", err)
		}
		slice := map[string]string{"hami.io/gpumem": "10Gi"}
		want := podResources{SchedulerName: corev1.DefaultSchedulerName, Limits: slice, Requests: slice}
		if diff := cmp.Diff(want, resourcesOf(got)); diff != "" {
			t.Errorf("created pod (-want +got):\n%s", diff)
		}
	})

	t.Run("namespace excluded by the webhook's config is left alone", func(t *testing.T) {
		pod := gpuPod("excluded")
		pod.Namespace = configExcludedNS
		got, err := e.create(callCtx(t), pod, false)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		slice := map[string]string{"hami.io/gpumem": "10Gi"}
		want := podResources{SchedulerName: corev1.DefaultSchedulerName, Limits: slice, Requests: slice}
		if diff := cmp.Diff(want, resourcesOf(got)); diff != "" {
			t.Errorf("created pod (-want +got):\n%s", diff)
		}
	})

	t.Run("idempotent", func(t *testing.T) {
		first, err := e.create(callCtx(t), gpuPod("idem-1"), false)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		second, err := e.create(callCtx(t), gpuPod("idem-2"), false)
		if err != nil {
			t.Fatalf("create again: %v", err)
		}
		if diff := cmp.Diff(first.Spec, second.Spec); diff != "" {
			t.Errorf("same pod created twice (-first +second):\n%s", diff)
		}
		// The mutated spec, sent again, comes back as it went.
		again := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "idem-3", Namespace: first.Namespace}, Spec: *first.Spec.DeepCopy()}
		third, err := e.create(callCtx(t), again, false)
		if err != nil {
			t.Fatalf("create the mutated spec: %v", err)
		}
		if diff := cmp.Diff(first.Spec, third.Spec); diff != "" {
			t.Errorf("mutated spec created again (-first +again):\n%s", diff)
		}
	})

	t.Run("serving certificate rotated while the API server calls", func(t *testing.T) {
		testRotation(t, e)
	})
}

// testMatchConditions creates pods through the API server and reads, from
// the webhook's own metrics, which of them it was asked about: the
// configuration's matchConditions keep plain pods away from it.
func testMatchConditions(t *testing.T, e *env) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.ca.Pool(), MinVersion: tls.VersionTLS12}}}
	calls := func() float64 {
		var n float64
		for series, v := range metricstest.Scrape(t, client, "https://"+e.addr+webhook.MetricsPath) {
			if strings.HasPrefix(series, webhook.MetricAdmissions+"{") {
				n += v
			}
		}
		return n
	}
	sidecar := clean(vgputest.Pod("sidecar").Limit(corev1.ResourceCPU, "1").Obj())
	sidecar.Spec.InitContainers = []corev1.Container{{
		Name: "side", Image: "registry.k8s.io/pause:3.10", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{vgpu.ResourceGPU: resource.MustParse("1")}, Limits: corev1.ResourceList{vgpu.ResourceGPU: resource.MustParse("1")}},
	}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		sent bool
	}{
		{"plain pod", clean(vgputest.Pod("plain").Limit(corev1.ResourceCPU, "1").Obj()), false},
		{"other annotations", clean(vgputest.Pod("annotated").Annotation("example.com/gpu", "1").Limit(corev1.ResourceCPU, "1").Obj()), false},
		{"hami.io annotation only", clean(vgputest.Pod("policy").Annotation(vgpu.AnnotationPrefix+"gpu-policy", "binpack").Limit(corev1.ResourceCPU, "1").Obj()), true},
		{"hami.io resource in a sidecar", sidecar, true},
		{"hami.io resource", gpuPod("slice"), true},
	} {
		before := calls()
		if _, err := e.create(callCtx(t), tc.pod, true); err != nil {
			t.Errorf("%s: create: %v", tc.name, err)
			continue
		}
		if sent := calls() > before; sent != tc.sent {
			t.Errorf("%s: sent to the webhook = %v, want %v", tc.name, sent, tc.sent)
		}
	}
	// The match condition with dra.webhook.steerClaims's clause compiles in the API server (a dry
	// run: it validates the CEL expressions and stores nothing).
	withClaims := webhookConfiguration(e.addr, e.ca.CertPEM)
	withClaims.Name += "-claims"
	withClaims.Webhooks[0].MatchConditions = webhook.WithClaims(webhook.MatchConditions())
	if _, err := e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(callCtx(t), withClaims, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("the match condition with webhook.ClaimsMatchClause: %v", err)
	}
}

// testRotation keeps the API server calling the webhook (dry-run pod
// creations, one after another) while the serving certificate in the
// Secret-volume-like folder is replaced by a new one from the same CA. Every
// call must succeed and be patched, and a new TLS connection must be served
// the new certificate.
func testRotation(t *testing.T, e *env) {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var (
		calls    atomic.Int64
		mu       sync.Mutex
		failures []error
	)
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		for i := 0; ctx.Err() == nil; i++ {
			got, err := e.create(ctx, gpuPod(fmt.Sprintf("rotation-%d", i)), true)
			if ctx.Err() != nil {
				return
			}
			if err == nil && got.Spec.SchedulerName != webhook.DefaultSchedulerName {
				err = fmt.Errorf("spec.schedulerName is %q: the webhook was not called", got.Spec.SchedulerName)
			}
			if err != nil {
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
			}
			calls.Add(1)
		}
	}()
	waitCalls := func(n int64) {
		t.Helper()
		err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, waitTimeout, true, func(context.Context) (bool, error) {
			return calls.Load() >= n, nil
		})
		if err != nil {
			t.Fatalf("%d API calls after %v, want %d", calls.Load(), waitTimeout, n)
		}
	}

	waitCalls(10)
	next := e.ca.Serving(t)
	e.volume.Write(t, next)
	rotatedAt := calls.Load()
	conn, err := tls.Dial("tcp", e.addr, &tls.Config{RootCAs: e.ca.Pool(), MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("TLS dial after rotation: %v", err)
	}
	served := conn.ConnectionState().PeerCertificates[0].SerialNumber
	_ = conn.Close()
	if served.Cmp(next.Cert.SerialNumber) != 0 {
		t.Errorf("new connection served certificate serial %s, want the rotated one %s", served, next.Cert.SerialNumber)
	}
	waitCalls(rotatedAt + 20)
	stop()
	<-loaded

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d calls through the API server, %d after the rotation", calls.Load(), calls.Load()-rotatedAt)
	if len(failures) > 0 {
		t.Errorf("%d of %d calls failed around the rotation: %v", len(failures), calls.Load(), errors.Join(failures...))
	}
}
