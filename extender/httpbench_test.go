package extender

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	"github.com/gorilla/mux"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// httpBenchCases are BenchmarkHTTPFilterPrioritize's pods, on
// benchScheduler's 5,000 nodes with 40,000 slices under binpack and
// filterResult feasible:
//   - fits: one GPU of 4 GiB, which every node passes, so Prioritize
//     gets all 5,000;
//   - few: eight A100s of 30,000 MiB, which about a hundred nodes pass,
//     most others fail as unresolvable (another model), some as full;
//   - nowhere: one GPU of 100,000 MiB, which every node fails;
//     kube-scheduler then sends no Prioritize.
var httpBenchCases = []struct {
	name string
	pod  func() *vgputest.PodBuilder
}{
	{"fits", func() *vgputest.PodBuilder {
		return vgputest.Pod("fits").Container("main").GPU(1).MemoryMiB(4096).Cores(10)
	}},
	{"few", func() *vgputest.PodBuilder {
		return vgputest.Pod("few").Annotation(vgpu.AnnotationGPUModel, "A100").Container("main").GPU(8).MemoryMiB(30000).Cores(10)
	}},
	{"nowhere", func() *vgputest.PodBuilder {
		return vgputest.Pod("nowhere").Container("main").GPU(1).MemoryMiB(100000).Cores(10)
	}},
}

// schedulerPod dresses a benchmark pod as kube-scheduler sends it: the
// informer's object without managedFields, with the labels, owner,
// environment, tolerations and status a Deployment's pod has.
func schedulerPod(pb *vgputest.PodBuilder) *corev1.Pod {
	pod := pb.Request(corev1.ResourceCPU, "4").Request(corev1.ResourceMemory, "16Gi").Obj()
	pod.Labels = map[string]string{"app.kubernetes.io/name": "trainer", "pod-template-hash": "7d9f8c6b5d"}
	pod.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-03-14T09:00:00Z"}
	pod.GenerateName = "trainer-7d9f8c6b5d-"
	pod.ResourceVersion = "123456789"
	pod.CreationTimestamp = metav1.NewTime(now)
	isController := true
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "trainer-7d9f8c6b5d", UID: "0f6d2c1e-4b7a-4f0e-9d3c-8a1b2c3d4e5f", Controller: &isController}}
	c := &pod.Spec.Containers[0]
	c.Image = "registry.example.com/ml/trainer:v1.4.2"
	c.Env = []corev1.EnvVar{{Name: "EPOCHS", Value: "10"}, {Name: "DATA_DIR", Value: "/data"}}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	pod.Spec.SchedulerName = "gpuslice-scheduler"
	pod.Spec.Tolerations = []corev1.Toleration{
		{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBurstable}
	return pod
}

// schedulerBody is the body kube-scheduler's HTTPExtender posts for pod
// and names with nodeCacheCapable: json.Marshal of ExtenderArgs, whose
// Nodes is then null.
func schedulerBody(tb testing.TB, pod *corev1.Pod, names []string) []byte {
	tb.Helper()
	body, err := json.Marshal(&extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// legacyHandler serves /filter, /prioritize and /dra/prioritize as
// Handler did before the codec: encoding/json both ways (jsonEndpoint),
// with the same metrics and authorization around them.
func legacyHandler(s *Scheduler) http.Handler {
	r := mux.NewRouter()
	r.Handle("/filter", s.metrics.instrument("filter", s.authorized(jsonEndpoint(s.Filter)))).Methods(http.MethodPost)
	r.Handle("/prioritize", s.metrics.instrument("prioritize", s.authorized(jsonEndpoint(s.Prioritize)))).Methods(http.MethodPost)
	r.Handle("/dra/prioritize", s.metrics.instrument("dra/prioritize", s.authorized(jsonEndpoint(s.PrioritizeDRA)))).Methods(http.MethodPost)
	return r
}

// floorHandler is a do-nothing extender: it reads the body, decodes
// nothing and answers a fixed small filter or prioritize answer.
func floorHandler() http.Handler {
	answer := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, body)
		}
	}
	m := http.NewServeMux()
	m.Handle("POST /filter", answer(`{"Nodes":null,"NodeNames":[],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}`))
	m.Handle("POST /prioritize", answer(`[]`))
	return m
}

// httpClient posts bodies over one kept-alive loopback connection, as
// kube-scheduler's extender client does, and reads each answer into buf.
type httpClient struct {
	tb     testing.TB
	client *http.Client
	buf    bytes.Buffer
}

// post posts body to url and returns the answer, which is valid until the
// next post; any status but 200 fails the benchmark.
func (c *httpClient) post(url string, body []byte) []byte {
	req, err := http.NewRequestWithContext(c.tb.Context(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		c.tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		c.tb.Fatalf("POST %s: %v", url, err)
	}
	c.buf.Reset()
	_, err = c.buf.ReadFrom(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		c.tb.Fatalf("POST %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		c.tb.Fatalf("POST %s: HTTP %d: %s", url, resp.StatusCode, c.buf.Bytes())
	}
	return c.buf.Bytes()
}

// pair posts a pod's filter body and, unless prioritize is nil, its
// prioritize body to base.
func (c *httpClient) pair(base string, filter, prioritize []byte) {
	c.post(base+"/filter", filter)
	if prioritize != nil {
		c.post(base+"/prioritize", prioritize)
	}
}

// BenchmarkHTTPFilterPrioritize is one pod's /filter and then /prioritize
// over real HTTP (a loopback httptest server, net/http's client keeping
// its connection alive), at 5,000 nodes of 8 GPUs holding 40,000 slices
// with filterResult feasible, for httpBenchCases. The bodies are those
// kube-scheduler sends with nodeCacheCapable: all 5,000 names to
// /filter, the names Filter passed to /prioritize, none when none passed.
// The client reads each answer and decodes none. Per handler (codec:
// Handler; legacy: jsonEndpoint, encoding/json both ways) and case, each
// iteration times the pair and then the same two bodies posted to a
// do-nothing extender (floorHandler) on its own server, so both see the
// same machine, and then the judging alone, in-process (benchJudge). It
// reports the pair's p50 and p99 in ms, the floor's, the judging's, the
// ratio of the pair's p99 to the floor's (x-floor-p99), and the heap
// allocations per pair of the whole process, client included
// (allocs/pair; floor-allocs/pair is the share of HTTP and the client).
// The floor shares the process: the garbage of the pair before slows it
// too.
func BenchmarkHTTPFilterPrioritize(b *testing.B) {
	s, names := benchScheduler(b, 5000, 40000, vgpu.PolicyBinpack)
	s.cfg.FilterResult = FilterResultFeasible
	floor := httptest.NewServer(floorHandler())
	defer floor.Close()
	for _, h := range []struct {
		name    string
		handler http.Handler
	}{{"codec", s.Handler()}, {"legacy", legacyHandler(s)}} {
		srv := httptest.NewServer(h.handler)
		for _, tc := range httpBenchCases {
			b.Run(h.name+"/"+tc.name, func(b *testing.B) {
				c := &httpClient{tb: b, client: &http.Client{Transport: &http.Transport{}}}
				defer c.client.CloseIdleConnections()
				pod := schedulerPod(tc.pod())
				filterBody := schedulerBody(b, pod, names)
				var res extenderv1.ExtenderFilterResult
				if err := json.Unmarshal(c.post(srv.URL+"/filter", filterBody), &res); err != nil {
					b.Fatal(err)
				}
				var prioritizeBody []byte
				if res.NodeNames != nil && len(*res.NodeNames) > 0 {
					prioritizeBody = schedulerBody(b, pod, *res.NodeNames)
				}
				c.pair(floor.URL, filterBody, prioritizeBody)
				filterArgs := &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}
				var prioritizeArgs *extenderv1.ExtenderArgs
				if prioritizeBody != nil {
					prioritizeArgs = &extenderv1.ExtenderArgs{Pod: pod, NodeNames: res.NodeNames}
				}
				var took, floorTook, judgeTook []time.Duration
				var allocs, floorAllocs uint64
				var before, after goruntime.MemStats
				for b.Loop() {
					goruntime.ReadMemStats(&before)
					start := time.Now()
					c.pair(srv.URL, filterBody, prioritizeBody)
					took = append(took, time.Since(start))
					goruntime.ReadMemStats(&after)
					allocs += after.Mallocs - before.Mallocs

					goruntime.ReadMemStats(&before)
					start = time.Now()
					c.pair(floor.URL, filterBody, prioritizeBody)
					floorTook = append(floorTook, time.Since(start))
					goruntime.ReadMemStats(&after)
					floorAllocs += after.Mallocs - before.Mallocs

					start = time.Now()
					benchJudge(b, s, filterArgs, prioritizeArgs)
					judgeTook = append(judgeTook, time.Since(start))
				}
				p50, p99 := percentiles(took)
				f50, f99 := percentiles(floorTook)
				j50, j99 := percentiles(judgeTook)
				b.ReportMetric(ms(p50), "p50-ms")
				b.ReportMetric(ms(p99), "p99-ms")
				b.ReportMetric(ms(f50), "floor-p50-ms")
				b.ReportMetric(ms(f99), "floor-p99-ms")
				b.ReportMetric(ms(j50), "judge-p50-ms")
				b.ReportMetric(ms(j99), "judge-p99-ms")
				b.ReportMetric(float64(p99)/float64(f99), "x-floor-p99")
				b.ReportMetric(float64(allocs)/float64(len(took)), "allocs/pair")
				b.ReportMetric(float64(floorAllocs)/float64(len(took)), "floor-allocs/pair")
			})
		}
		srv.Close()
	}
}

// benchJudge is the judging of an HTTP pair without HTTP: Filter's
// answer as slices (not turned into maps) and, unless prioritize is nil,
// Prioritize.
func benchJudge(b *testing.B, s *Scheduler, filter, prioritize *extenderv1.ExtenderArgs) {
	a, err := s.filter(b.Context(), filter)
	if err != nil {
		b.Fatal(err)
	}
	a.release()
	if prioritize != nil {
		if _, err := s.Prioritize(b.Context(), prioritize); err != nil {
			b.Fatal(err)
		}
	}
}

// percentiles returns the p50 and p99 of took, which it sorts.
func percentiles(took []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(took)
	return took[len(took)/2], took[len(took)*99/100]
}
