package simulate_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu/simulate"
)

func readTestdata(t *testing.T) ([]simulate.Node, []simulate.Task) {
	t.Helper()
	nf, err := os.Open(filepath.Join("testdata", "nodes.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer nf.Close()
	nodes, err := simulate.ReadNodes(nf)
	if err != nil {
		t.Fatal(err)
	}
	tf, err := os.Open(filepath.Join("testdata", "pods.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	tasks, err := simulate.ReadTasks(tf)
	if err != nil {
		t.Fatal(err)
	}
	return nodes, tasks
}

func TestReadTrace(t *testing.T) {
	t.Parallel()
	nodes, tasks := readTestdata(t)
	if diff := cmp.Diff(simulate.Node{Name: "tiny-node-2", CPUMilli: 104000, MemoryMiB: 524288, GPUs: 2, Model: "T4"}, nodes[2]); diff != "" {
		t.Errorf("node mismatch (-want +got):\n%s", diff)
	}
	want := simulate.Task{Name: "tiny-pod-0001", CPUMilli: 4000, MemoryMiB: 16384, GPUs: 1, GPUMilli: 1000, Models: []string{"V100M16", "V100M32"}}
	if diff := cmp.Diff(want, tasks[1]); diff != "" {
		t.Errorf("task mismatch (-want +got):\n%s", diff)
	}
	if len(nodes) != 5 || len(tasks) != 40 {
		t.Errorf("read %d nodes and %d tasks, want 5 and 40", len(nodes), len(tasks))
	}
}

func TestReadTraceErrors(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		read func(string) error
		in   string
		want string
	}{
		"missing column": {
			read: func(s string) error { _, err := simulate.ReadNodes(strings.NewReader(s)); return err },
			in:   "sn,cpu_milli,gpu,model\nn,1,1,T4\n",
			want: `read nodes: malformed trace: header "sn,cpu_milli,gpu,model" lacks column "memory_mib"`,
		},
		"bad number": {
			read: func(s string) error { _, err := simulate.ReadTasks(strings.NewReader(s)); return err },
			in:   "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,x,1,1,500\n",
			want: `read tasks: malformed trace: line 2: cpu_milli: "x" must be an integer of 0 or more`,
		},
		"bad share": {
			read: func(s string) error { _, err := simulate.ReadTasks(strings.NewReader(s)); return err },
			in:   "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,0\n",
			want: `read tasks: malformed trace: line 2: gpu_milli: must be from 1 to 1000 when num_gpu is above 0`,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := tt.read(tt.in)
			if err == nil || err.Error() != tt.want || !errors.Is(err, simulate.ErrMalformed) {
				t.Errorf("error = %v, want %s wrapping ErrMalformed", err, tt.want)
			}
		})
	}
}

func TestReplaySynthetic(t *testing.T) {
	t.Parallel()
	nodes, tasks := readTestdata(t)
	for _, policy := range simulate.Policies() {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			cfg := simulate.Config{Policy: policy, Seed: 42}
			got, err := simulate.Replay(nodes, tasks, cfg)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := simulate.Replay(nodes, tasks, cfg)
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("Replay is not deterministic (-first +second):\n%s", diff)
			}
			if got.CapacityMilli != 23000 || got.Arrived == 0 || got.Placed+got.Failed != got.Arrived ||
				got.UnallocatedPercent < 0 || got.UnallocatedPercent > 100 {
				t.Errorf("implausible result %+v", got)
			}
			failed := 0
			for i, f := range got.Failures {
				failed += f.Tasks
				if f.DemandMilli != int64(f.Tasks)*int64(f.GPUs)*f.GPUMilli || i > 0 && f.DemandMilli > got.Failures[i-1].DemandMilli {
					t.Errorf("Failures[%d] = %+v: demand wrong or out of order", i, f)
				}
			}
			if failed != got.Failed {
				t.Errorf("Failures count %d tasks, Failed is %d", failed, got.Failed)
			}
		})
	}
	if _, err := simulate.Replay(nodes, tasks, simulate.Config{Policy: "worst"}); err == nil {
		t.Error("Replay accepted policy \"worst\"")
	}
	if _, err := simulate.Replay(nil, tasks, simulate.Config{}); !errors.Is(err, simulate.ErrNoCapacity) {
		t.Errorf("Replay without nodes: error = %v, want ErrNoCapacity", err)
	}
}

// TestReplayTraceSubset replays the real trace on its first 60 nodes when
// ../shared/data/fgd-trace (beside the repository) is present, and checks
// that the fragmentation policy packs at least as well as random placement.
func TestReplayTraceSubset(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "..", "..", "shared", "data", "fgd-trace")
	nf, err := os.Open(filepath.Join(dir, "openb_node_list_gpu_node.csv"))
	if err != nil {
		t.Skipf("trace not present (%v); the synthetic trace in testdata covers Replay", err)
	}
	defer nf.Close()
	nodes, err := simulate.ReadNodes(nf)
	if err != nil {
		t.Fatal(err)
	}
	tf, err := os.Open(filepath.Join(dir, "openb_pod_list_default.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	tasks, err := simulate.ReadTasks(tf)
	if err != nil {
		t.Fatal(err)
	}
	nodes = nodes[:60]
	got := map[simulate.Policy]float64{}
	for _, policy := range simulate.Policies() {
		res, err := simulate.Replay(nodes, tasks, simulate.Config{Policy: policy, Seed: 42})
		if err != nil {
			t.Fatal(err)
		}
		got[policy] = res.UnallocatedPercent
		t.Logf("%-13s unallocated %.2f%% (%d tasks arrived, %d failed)", policy, res.UnallocatedPercent, res.Arrived, res.Failed)
	}
	if got[simulate.PolicyFragmentation] > got[simulate.PolicyRandom] {
		t.Errorf("fragmentation left %.2f%% unallocated, more than random's %.2f%%", got[simulate.PolicyFragmentation], got[simulate.PolicyRandom])
	}
}

func TestReadPublished(t *testing.T) {
	t.Parallel()
	f, err := os.Open(filepath.Join("testdata", "published.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := simulate.ReadPublished(f, "openb_pod_list_default")
	if err != nil {
		t.Fatal(err)
	}
	want := []simulate.Published{{Policy: "01-Random", Seed: 42, UnallocatedPercent: 13.83}, {Policy: "06-FGD", Seed: 42, UnallocatedPercent: 4.86}}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })); diff != "" {
		t.Errorf("ReadPublished() mismatch (-want +got):\n%s", diff)
	}
}
