package extender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/internal/fuzzcost"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// readBoth reads body as the codec does (argsReader.decode) and as
// jsonEndpoint did (decodeJSON) and fails t unless both give the same
// arguments, status and message. It reports whether the codec read body
// itself, without the standard decoder.
func readBoth(t testing.TB, body []byte) (fast bool) {
	t.Helper()
	var want extenderv1.ExtenderArgs
	wantStatus, wantErr := decodeJSON(bytes.NewReader(body), &want)
	ar := new(argsReader)
	fast = ar.parse(body)
	ar.args = extenderv1.ExtenderArgs{}
	gotStatus, gotErr := ar.decode(body, nil)
	if gotStatus != wantStatus || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("%q: codec HTTP %d %v, decoder HTTP %d %v", body, gotStatus, gotErr, wantStatus, wantErr)
	}
	if wantErr == nil {
		if diff := cmp.Diff(want, ar.args); diff != "" {
			t.Fatalf("%q: arguments (-decoder +codec):\n%s", body, diff)
		}
	}
	return fast
}

// TestReadArgsAsDecode reads bodies kube-scheduler sends and bodies it
// never sends with the codec and with the standard decoder: both give the
// same arguments, or the same status and message. The codec reads the
// first kind itself and gives the rest to the decoder.
func TestReadArgsAsDecode(t *testing.T) {
	pod := `{"metadata":{"name":"p","namespace":"default","uid":"u","labels":{"a":"b"}},"spec":{"containers":[{"name":"main","resources":{"limits":{"hami.io/gpu":"1","hami.io/gpumem":"1024"}}}]}}`
	tests := []struct {
		name, body string
		fast       bool
	}{
		{"names", `{"Pod":` + pod + `,"Nodes":null,"NodeNames":["n1","n2"]}`, true},
		{"no Nodes key", `{"Pod":` + pod + `,"NodeNames":["n1"]}`, true},
		{"empty names", `{"Pod":` + pod + `,"NodeNames":[]}`, true},
		{"null names", `{"Pod":` + pod + `,"NodeNames":null}`, true},
		{"null pod", `{"Pod":null,"NodeNames":["n1"]}`, true},
		{"empty object", `{}`, true},
		{"whitespace", " \t\r\n{ \"Pod\" :\n" + pod + " , \"NodeNames\" : [ \"n1\" ,\t\"n2\" ] }\n ", true},
		{"key case", `{"pod":` + pod + `,"NODENAMES":["n1"],"nOdEs":null}`, true},
		{"unknown members", `{"Pod":` + pod + `,"X":{"a":[1,-2.5e3,true,false,null,"s\u0041\n"]},"Y":7,"Z":"z","NodeNames":["n1"]}`, true},
		{"names twice", `{"Pod":` + pod + `,"NodeNames":["a","b","c"],"NodeNames":["d"]}`, true},
		{"names then null", `{"Pod":` + pod + `,"NodeNames":["a"],"nodenames":null}`, true},
		{"odd printable names", "{\"Pod\":{},\"NodeNames\":[\"<&>\", \"a/b\", \"~\x7f\", \" \"]}", true},

		{"unicode escapes in names", `{"Pod":` + pod + `,"NodeNames":["n\u00e9","\ud83d\ude00","\ud800","a\"b","t\tab","\u2028","\/"]}`, false},
		{"raw UTF-8 and invalid UTF-8 in names", "{\"Pod\":{},\"NodeNames\":[\"nöde\",\"\xff\xfe\",\"\xe2\x80\xa8\"]}", false},
		{"escaped key", `{"\u0050od":` + pod + `,"NodeNames":["n1"]}`, false},
		{"Kelvin sign folds to k", `{"Pod":{},"NodeNameſ":["n1"]}`, false},
		{"Nodes list", `{"Pod":` + pod + `,"Nodes":{"metadata":{},"items":[{"metadata":{"name":"n1"}}]},"NodeNames":null}`, false},
		{"pod twice merges", `{"Pod":{"metadata":{"name":"a"}},"Pod":{"spec":{"nodeName":"x"}},"NodeNames":[]}`, false},
		{"null name", `{"Pod":{},"NodeNames":[null,"a"]}`, false},
		{"number name", `{"Pod":{},"NodeNames":[1]}`, false},
		{"names not an array", `{"Pod":{},"NodeNames":"a"}`, false},
		{"pod not an object", `{"Pod":[],"NodeNames":[]}`, false},
		{"pod field of the wrong type", `{"Pod":{"metadata":{"name":5}},"NodeNames":[]}`, false},
		{"pod unknown and bad quantity", `{"Pod":{"spec":{"containers":[{"resources":{"limits":{"cpu":"x"}}}]}},"NodeNames":[]}`, false},
		{"malformed unknown member", `{"X":01,"NodeNames":[]}`, false},
		{"unknown member unclosed", `{"X":[1,2,"NodeNames":[]}`, false},
		{"trailing comma", `{"Pod":{},}`, false},
		{"trailing comma in names", `{"NodeNames":["a",]}`, false},
		{"literal run on", `{"Nodes":nullx}`, false},
		{"two values", `{"Pod":{}} {"Pod":{}}`, false},
		{"trailing garbage", `{"Pod":{}}x`, false},
		{"empty", ``, false},
		{"only whitespace", " \n", false},
		{"null", `null`, false},
		{"array", `[1,2,3]`, false},
		{"string", `"Pod"`, false},
		{"unclosed", `{"Pod":{"metadata":{}`, false},
		{"byte order mark", "\xef\xbb\xbf{}", false},
		{"control byte in name", "{\"NodeNames\":[\"a\x01\"]}", false},
		{"deep unknown member", `{"X":` + strings.Repeat("[", maxFastDepth+1) + strings.Repeat("]", maxFastDepth+1) + `}`, false},
		{"too deep in the pod", `{"Pod":{"x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}}`, false},
		{"deep nesting", strings.Repeat("[", 100000), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if fast := readBoth(t, []byte(tt.body)); fast != tt.fast {
				t.Errorf("codec read the body itself: %v, want %v", fast, tt.fast)
			}
		})
	}
}

// TestParseArgsTakesSchedulerBodies builds bodies as kube-scheduler's
// HTTPExtender does (json.Marshal of ExtenderArgs, with NodeNames under
// nodeCacheCapable, else a NodeList of whole Nodes) and checks that the
// codec reads the first kind itself and both as json.Unmarshal does.
func TestParseArgsTakesSchedulerBodies(t *testing.T) {
	names := make([]string, 5000)
	for i := range names {
		names[i] = fmt.Sprintf("node-%05d", i)
	}
	pod := schedulerPod(vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(4096).Cores(10))
	var items []corev1.Node
	for _, n := range names[:3] {
		items = append(items, *vgputest.PublishedNode(vgputest.Node(n).GPU(n+"-GPU-0", 81920).Obj()).Obj())
	}
	tests := []struct {
		name string
		args extenderv1.ExtenderArgs
		fast bool
	}{
		{"5,000 names", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}, true},
		{"one name", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"node-00001"}}, true},
		{"no name", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{}}, true},
		{"Nodes", extenderv1.ExtenderArgs{Pod: pod, Nodes: &corev1.NodeList{Items: items}}, false},
		{"no Nodes", extenderv1.ExtenderArgs{Pod: pod, Nodes: &corev1.NodeList{}}, false},
		{"a bare pod", extenderv1.ExtenderArgs{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}, NodeNames: &names}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, err := json.Marshal(&tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if fast := readBoth(t, body); fast != tt.fast {
				t.Errorf("codec read the body itself: %v, want %v", fast, tt.fast)
			}
			var want extenderv1.ExtenderArgs
			if err := json.Unmarshal(body, &want); err != nil {
				t.Fatal(err)
			}
			ar := new(argsReader)
			if status, err := ar.decode(body, nil); err != nil {
				t.Fatalf("HTTP %d: %v", status, err)
			}
			if diff := cmp.Diff(want, ar.args); diff != "" {
				t.Errorf("arguments (-json.Unmarshal +codec):\n%s", diff)
			}
		})
	}
}

// FuzzReadArgs reads any body with the codec and the standard decoder
// (readBoth: the same arguments, or the same status and message), and
// checks that the codec allocates at most twice what the decoder does,
// plus a few: it reads a body once, and what it cannot read costs one more
// pass of the decoder.
func FuzzReadArgs(f *testing.F) {
	for _, b := range fuzzBodies {
		f.Add([]byte(b))
	}
	names := make([]string, 200)
	for i := range names {
		names[i] = fmt.Sprintf("node-%05d", i)
	}
	pod := schedulerPod(vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(4096).Cores(10))
	f.Add(schedulerBody(f, pod, names))
	f.Add([]byte(`{"pod":{},"NODENAMES":["a","a"],"NodeNames":["b"],"x":[{"y":-1e3}],"Nodes":null}`))
	f.Add([]byte(`{"Pod":{},"NodeNames":["n\u00e9","\ud800",` + "\"\xff\"" + `]}`))
	f.Add([]byte(`{"X":` + strings.Repeat("[", maxFastDepth+1) + strings.Repeat("]", maxFastDepth+1) + `}`))
	budget := func(c fuzzcost.Cost) fuzzcost.Cost {
		return fuzzcost.Cost{Allocs: 2*c.Allocs + 16, Bytes: 2*c.Bytes + 4<<10}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		readBoth(t, body)
		ar := new(argsReader)
		got := fuzzcost.Measure(fuzzcost.Runs, func() {
			ar.args = extenderv1.ExtenderArgs{}
			_, _ = ar.decode(body, nil)
		})
		want := fuzzcost.Measure(fuzzcost.Runs, func() {
			var args extenderv1.ExtenderArgs
			_, _ = decodeJSON(bytes.NewReader(body), &args)
		})
		if !got.Within(budget(want)) {
			t.Fatalf("reading %d bytes cost %+v, the standard decoder %+v: want at most %+v", len(body), got, want, budget(want))
		}
	})
}
