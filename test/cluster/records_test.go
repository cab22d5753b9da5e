package cluster

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/test/fakecri"
)

func TestRuntimeRecords(t *testing.T) {
	dir := t.TempDir()
	n := &Node{NodeState: NodeState{Dir: dir}}
	write := func(rel, content string) {
		t.Helper()
		path := filepath.Join(dir, "log", "pods", rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const ts = "2026-12-01T18:00:00.000000000Z stdout "
	report := ts + "F == env\n" + ts + "F GPUSLICE_POD=default/p\n" + ts + "P NVIDIA_VISIBLE_DEV\n" + ts + "F ICES=GPU-1\n" +
		ts + "F == mounts\n" + ts + "F overlay / overlay rw,relatime 0 0\n" + ts + "F /dev/vda /etc/hosts ext4 ro,nosuid 0 0\n" + ts + "F == end\n"
	write("default_p_uid-1/main/1.log", report)
	write("default_p_uid-1/main/0.log", ts+"F == env\n"+ts+"F A=0\n"+ts+"F == end\n")
	write("default_q_uid-2/main/0.log", ts+"F == env\n"+ts+"F A=1\n") // not done yet
	write("default_r_uid-3/main/0.log", "torn")

	got, err := n.runtimeRecords()
	if err != nil {
		t.Fatal(err)
	}
	want := []fakecri.Record{
		{Namespace: "default", Pod: "p", PodUID: "uid-1", Container: "main", Attempt: 0, Env: map[string]string{"A": "0"}},
		{Namespace: "default", Pod: "p", PodUID: "uid-1", Container: "main", Attempt: 1,
			Env: map[string]string{"GPUSLICE_POD": "default/p", "NVIDIA_VISIBLE_DEVICES": "GPU-1"},
			Mounts: []fakecri.Mount{
				{HostPath: "overlay", ContainerPath: "/"},
				{HostPath: "/dev/vda", ContainerPath: "/etc/hosts", ReadOnly: true},
			}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("runtimeRecords (-want +got):\n%s", diff)
	}
}
