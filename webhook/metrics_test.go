package webhook_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/metricstest"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
	"github.com/gpuslice/gpuslice/webhook"
	"github.com/gpuslice/gpuslice/webhook/webhooktest"
)

// TestMetrics sends one review per admission reason, and requests the
// handler answers with an HTTP error, then scrapes MetricsPath and checks
// every decision and reason series (those never hit stay at 0), the
// duration counts by decision and the invalid requests by status code.
func TestMetrics(t *testing.T) {
	h, err := webhook.NewHandler(webhook.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	gpuPod := vgputest.Pod("p").Limit(vgpu.ResourceMemory, "10Gi").Obj()
	complete := vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(1024).Obj()
	complete.Spec.SchedulerName = webhook.DefaultSchedulerName
	forged := vgputest.Pod("p").Annotation(vgpu.AnnotationPodAllocation, "{}").Obj()
	deletePod := createPod("u", "default", gpuPod)
	deletePod.op = admissionv1.Delete
	reviews := []struct {
		req  reviewRequest
		want webhook.AdmissionReason
	}{
		{createPod("u", "default", gpuPod), webhook.ReasonGPUPod},
		{createPod("u", "default", gpuPod), webhook.ReasonGPUPod},
		{createPod("u", "default", complete), webhook.ReasonGPUPodUnchanged},
		{createPod("u", "default", vgputest.Pod("p").Obj()), webhook.ReasonNotGPUPod},
		{createPod("u", "kube-system", gpuPod), webhook.ReasonExcludedNamespace},
		{deletePod, webhook.ReasonNotPodCreate},
		{createPod("u", "default", vgputest.Pod("p").Cores(150).Obj()), webhook.ReasonInvalidGPURequest},
		{createPod("u", "default", forged), webhook.ReasonForgedAllocation},
		{reviewRequest{uid: "u", op: admissionv1.Create, namespace: "default", kind: podKind, object: []byte(`"pod"`)}, webhook.ReasonMalformedPod},
	}
	for _, r := range reviews {
		code, _ := post(t, srv.URL+webhook.MutatePath, "application/json", r.req.body(t))
		if code != http.StatusOK {
			t.Fatalf("review for %s: HTTP %d, want 200", r.want, code)
		}
	}
	for _, bad := range []struct {
		contentType, body string
		want              int
	}{
		{"text/plain", "{}", http.StatusUnsupportedMediaType},
		{"application/json", "", http.StatusBadRequest},
		{"application/json", `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}`, http.StatusBadRequest},
	} {
		if code, _ := post(t, srv.URL+webhook.MutatePath, bad.contentType, bad.body); code != bad.want {
			t.Fatalf("POST %q as %s: HTTP %d, want %d", bad.body, bad.contentType, code, bad.want)
		}
	}

	got := metricstest.Pick(metricstest.Scrape(t, nil, srv.URL+webhook.MetricsPath),
		webhook.MetricAdmissions, webhook.MetricAdmissionDuration+"_count", webhook.MetricInvalidRequests)
	want := map[string]float64{
		`gpuslice_webhook_admissions_total{decision="patched",reason="GPUPod"}`:            2,
		`gpuslice_webhook_admissions_total{decision="allowed",reason="GPUPodUnchanged"}`:   1,
		`gpuslice_webhook_admissions_total{decision="allowed",reason="NotGPUPod"}`:         1,
		`gpuslice_webhook_admissions_total{decision="allowed",reason="ExcludedNamespace"}`: 1,
		`gpuslice_webhook_admissions_total{decision="allowed",reason="NotPodCreate"}`:      1,
		`gpuslice_webhook_admissions_total{decision="denied",reason="InvalidGPURequest"}`:  1,
		`gpuslice_webhook_admissions_total{decision="denied",reason="ForgedAllocation"}`:   1,
		`gpuslice_webhook_admissions_total{decision="denied",reason="MalformedPod"}`:       1,
		`gpuslice_webhook_admissions_total{decision="denied",reason="TemplateConflict"}`:   0,
		`gpuslice_webhook_admissions_total{decision="denied",reason="InternalError"}`:      0,
		`gpuslice_webhook_admission_duration_seconds_count{decision="patched"}`:            2,
		`gpuslice_webhook_admission_duration_seconds_count{decision="allowed"}`:            4,
		`gpuslice_webhook_admission_duration_seconds_count{decision="denied"}`:             3,
		`gpuslice_webhook_invalid_requests_total{code="400"}`:                              2,
		`gpuslice_webhook_invalid_requests_total{code="415"}`:                              1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	if code, _ := post(t, srv.URL+webhook.MetricsPath, "text/plain", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("POST %s: HTTP %d, want 405", webhook.MetricsPath, code)
	}
}

// TestMetricsIndependent checks that every handler counts in its own
// registry: no global state is shared between two of them.
func TestMetricsIndependent(t *testing.T) {
	var urls []string
	for range 2 {
		h, err := webhook.NewHandler(webhook.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		defer srv.Close()
		urls = append(urls, srv.URL)
	}
	req := createPod("u", "default", vgputest.Pod("p").Obj())
	if code, _ := post(t, urls[0]+webhook.MutatePath, "application/json", req.body(t)); code != http.StatusOK {
		t.Fatalf("review: HTTP %d", code)
	}
	series := `gpuslice_webhook_admissions_total{decision="allowed",reason="NotGPUPod"}`
	got := []float64{
		metricstest.Scrape(t, nil, urls[0]+webhook.MetricsPath)[series],
		metricstest.Scrape(t, nil, urls[1]+webhook.MetricsPath)[series],
	}
	if diff := cmp.Diff([]float64{1, 0}, got); diff != "" {
		t.Errorf("%s on the two handlers (-want +got):\n%s", series, diff)
	}
}

// TestServerMetrics scrapes MetricsPath of a Server over HTTPS after one
// admission: the same registry across the Server's listeners, with the Go
// runtime metrics.
func TestServerMetrics(t *testing.T) {
	ca := webhooktest.NewCA(t)
	volume := webhooktest.NewSecretVolume(t)
	volume.Write(t, ca.Serving(t))
	cfg := webhook.DefaultServerConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile = volume.CertFile(), volume.KeyFile()
	srv, err := webhook.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := serve(t, srv), serve(t, srv)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()

	pod := vgputest.Pod("p").Limit(vgpu.ResourceMemory, "10Gi").Obj()
	pod.Spec.SchedulerName = corev1.DefaultSchedulerName
	body := createPod("u", "default", pod).body(t)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+a+webhook.MutatePath, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("review: HTTP %d", resp.StatusCode)
	}
	for _, addr := range []string{a, b} {
		got := metricstest.Scrape(t, client, "https://"+addr+webhook.MetricsPath)
		if v := got[`gpuslice_webhook_admissions_total{decision="patched",reason="GPUPod"}`]; v != 1 {
			t.Errorf("%s: patched GPUPod = %v, want 1", addr, v)
		}
		if _, ok := got["go_goroutines"]; !ok {
			t.Errorf("%s: no go_goroutines series", addr)
		}
	}
}

// post sends body with contentType and returns the status and body.
func post(t *testing.T, url, contentType, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
