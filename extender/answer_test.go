package extender

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/internal/fuzzcost"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// oddNames are node names no kube-scheduler sends, for strings that
// encoding/json escapes, replaces or sorts in its own way.
var oddNames = []string{"", "<&>", "a\"b\\c", "t\tab\n", "\x00\x1f\x7f", "nöde", "\xff\xfe", "\u2028\u2029", "\U0001f600", "Z", "a", "é"}

// randomNames returns up to max names drawn from pool, some of them twice.
func randomNames(rng *rand.Rand, pool []string, maxNames int) []string {
	names := make([]string, rng.IntN(maxNames+1))
	for i := range names {
		names[i] = pool[rng.IntN(len(pool))]
	}
	return names
}

// randomAnswer is a filterAnswer about names, each node passed, left out,
// failed or unresolvable at random, with messages from messages; one in
// ten is the Error of a pod that cannot be placed.
func randomAnswer(rng *rand.Rand, names, messages []string) *filterAnswer {
	a := &filterAnswer{names: names}
	if rng.IntN(10) == 0 {
		a.err = messages[rng.IntN(len(messages))]
		return a
	}
	for i := range names {
		msg := messages[rng.IntN(len(messages))]
		switch rng.IntN(4) {
		case 0:
			a.passed = append(a.passed, i)
		case 1:
			a.failed = append(a.failed, failedNode{i, msg})
		case 2:
			a.unresolvable = append(a.unresolvable, failedNode{i, msg})
		}
	}
	return a
}

// TestFilterAnswerJSON checks that the codec writes random filter and
// prioritize answers byte for byte as encoding/json writes the
// extenderv1 values Filter and Prioritize return: FailedNodes sorted, a
// name given twice once with its later message, strings escaped alike,
// and answers in the form of Nodes too.
func TestFilterAnswerJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pool := append([]string{"node-00001", "node-00002", "node-00010", "gpu-a", "gpu-b"}, oddNames...)
	messages := append([]string{"needs 1 GPU with 8192 MiB free", "plugin not ready: no heartbeat"}, oddNames...)
	for i := range 2000 {
		names := randomNames(rng, pool, 12)
		a := randomAnswer(rng, names, messages)
		args := &extenderv1.ExtenderArgs{NodeNames: &names}
		if i%4 == 0 {
			args = &extenderv1.ExtenderArgs{Nodes: &corev1.NodeList{}}
			for _, n := range names {
				args.Nodes.Items = append(args.Nodes.Items, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"l": n}}})
			}
		}
		want, err := json.Marshal(a.result(args))
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendFilterAnswer([]byte("prefix"), args, a)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(want), strings.TrimPrefix(string(got), "prefix")); diff != "" {
			t.Fatalf("filter answer %d about %q (-encoding/json +codec):\n%s", i, names, diff)
		}

		var list extenderv1.HostPriorityList
		if i%7 != 0 {
			list = extenderv1.HostPriorityList{}
		}
		for _, n := range names {
			list = append(list, extenderv1.HostPriority{Host: n, Score: rng.Int64N(21) - 5})
		}
		if want, err = json.Marshal(list); err != nil {
			t.Fatal(err)
		}
		if got, err = appendHostPriorities(nil, args, list); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(want), string(got)); diff != "" {
			t.Fatalf("prioritize answer %d (-encoding/json +codec):\n%s", i, diff)
		}
	}
}

// TestAnswersAsLegacy posts the same bodies to Handler and to the
// handler of encoding/json both ways (legacyHandler), on goldenCluster
// with both filterResults: random pods (fitting, not fitting, without
// GPUs, with invalid annotations) and random node lists (known, unknown,
// repeated and odd names), as names or as Nodes, and the garbage of
// TestGarbage. Every answer, status, Content-Type and body, is the same.
func TestAnswersAsLegacy(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pool := append([]string{"a100-empty", "a100-half", "a100-busy", "t4", "not-ready", "stale", "ghost"}, oddNames...)
	pods := []*vgputest.PodBuilder{
		vgputest.Pod("small").Container("main").GPU(1).MemoryMiB(1024).Cores(10),
		vgputest.Pod("a100").Annotation(vgpu.AnnotationGPUModel, "A100").Container("main").GPU(1).MemoryMiB(8192).Cores(30),
		vgputest.Pod("half").Container("main").GPU(1).MemoryMiB(40960),
		vgputest.Pod("two").Container("main").GPU(2).MemoryMiB(20000),
		vgputest.Pod("huge").Container("main").GPU(1).MemoryMiB(100000),
		vgputest.Pod("cpu").Container("main"),
		vgputest.Pod("invalid").Annotation(vgpu.AnnotationNodePolicy, "nonsense").Container("main").GPU(1).MemoryMiB(1024),
		vgputest.Pod("uuid").Annotation(vgpu.AnnotationGPUUUID, "a100-empty-GPU-1").Container("main").GPU(1).MemoryMiB(1024),
	}
	var garbage [][]byte
	for _, b := range append(fuzzBodies, "{", "not json", `{"Pod":{}} {"Pod":{}}`, strings.Repeat("[", 100000),
		`{"NodeNames":["`+strings.Repeat("a", MaxRequestBytes)+`"]}`) {
		garbage = append(garbage, []byte(b))
	}
	for _, result := range []FilterResult{FilterResultBest, FilterResultFeasible} {
		cfg := testConfig()
		cfg.FilterResult = result
		e := newEnv(t, cfg, goldenCluster()...)
		waitFor(t, "bound pods counted", func() bool { return e.s.NodeUsage("a100-busy").GPU("a100-busy-GPU-0").MemoryMiB == 78000 })
		legacy := httptest.NewServer(legacyHandler(e.s))
		t.Cleanup(legacy.Close)
		same := func(t *testing.T, path string, body []byte) {
			t.Helper()
			got, gotType, gotBody := postAnswer(t, e.srv.URL+path, body)
			want, wantType, wantBody := postAnswer(t, legacy.URL+path, body)
			if got != want || gotType != wantType || !bytes.Equal(gotBody, wantBody) {
				t.Fatalf("POST %s %.200q:\ncodec  HTTP %d %s %.500q\nlegacy HTTP %d %s %.500q", path, body, got, gotType, gotBody, want, wantType, wantBody)
			}
		}
		t.Run(string(result), func(t *testing.T) {
			for i := range 300 {
				pod := pods[rng.IntN(len(pods))].Obj()
				names := randomNames(rng, pool, 10)
				args := extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}
				if i%5 == 0 {
					args = extenderv1.ExtenderArgs{Pod: pod, Nodes: &corev1.NodeList{}}
					for _, n := range names {
						args.Nodes.Items = append(args.Nodes.Items, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
					}
				}
				body, err := json.Marshal(&args)
				if err != nil {
					t.Fatal(err)
				}
				for _, path := range []string{"/filter", "/prioritize", "/dra/prioritize"} {
					same(t, path, body)
				}
			}
			for _, body := range garbage {
				for _, path := range []string{"/filter", "/prioritize", "/dra/prioritize"} {
					same(t, path, body)
				}
			}
		})
	}
}

// postAnswer posts body as JSON and returns the answer's status,
// Content-Type and body.
func postAnswer(t *testing.T, url string, body []byte) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var got bytes.Buffer
	if _, err := got.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), got.Bytes()
}

// FuzzAppendJSONString checks that appendJSONString writes any string as
// json.Marshal does, and, given the room, allocates nothing.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range append(oddNames, "node-00001", "plugin not ready: no heartbeat", "\xed\xa0\x80", "\xe2\x80", "a\u2028b\u2029c") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("appendJSONString(%q) = %s, want %s", s, got, want)
		}
		buf := make([]byte, 0, 6*len(s)+2)
		if cost := fuzzcost.Measure(fuzzcost.Runs, func() { _ = appendJSONString(buf, s) }); cost.Allocs != 0 {
			t.Fatalf("appendJSONString of %d bytes into room enough: %d allocations, want none", len(s), cost.Allocs)
		}
	})
}
