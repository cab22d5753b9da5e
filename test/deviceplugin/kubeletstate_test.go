package deviceplugin

import (
	"testing"

	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint"

	"github.com/gpuslice/gpuslice/node/kubeletstate"
)

// TestKubeletStateReadsTheKubeletsCheckpoint: the device manager's
// checkpoint, written by the kubelet's own checkpoint code at the pinned
// version under the name its device manager uses, is read as the kubelet
// wrote it: the one container holding exactly a set of device IDs, with
// devices on no NUMA node and on two.
func TestKubeletStateReadsTheKubeletsCheckpoint(t *testing.T) {
	dir := t.TempDir()
	mgr, err := checkpointmanager.NewCheckpointManager(dir)
	if err != nil {
		t.Fatal(err)
	}
	entries := []checkpoint.PodDevicesEntry{
		{PodUID: "uid-a", ContainerName: "main", ResourceName: "hami.io/gpu", DeviceIDs: checkpoint.DevicesPerNUMA{-1: {"GPU-1::4"}}, AllocResp: []byte("response")},
		{PodUID: "uid-b", ContainerName: "side", ResourceName: "hami.io/gpu", DeviceIDs: checkpoint.DevicesPerNUMA{0: {"GPU-1::5", "GPU-2::0"}, 1: {"GPU-2::0"}}},
		{PodUID: "uid-c", ContainerName: "main", ResourceName: "example.com/other", DeviceIDs: checkpoint.DevicesPerNUMA{-1: {"GPU-1::6"}}},
	}
	if err := mgr.CreateCheckpoint(kubeletstate.CheckpointFile, checkpoint.New(entries, map[string][]string{"hami.io/gpu": {"GPU-1::4", "GPU-1::5", "GPU-2::0"}})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ids  []string
		want kubeletstate.Holder
	}{
		{[]string{"GPU-1::4"}, kubeletstate.Holder{PodUID: "uid-a", Container: "main"}},
		{[]string{"GPU-2::0", "GPU-1::5"}, kubeletstate.Holder{PodUID: "uid-b", Container: "side"}},
	} {
		got, err := kubeletstate.DeviceHolder(dir, "hami.io/gpu", tc.ids)
		if err != nil || got != tc.want {
			t.Errorf("DeviceHolder(%v) = %+v, %v; want %+v", tc.ids, got, err, tc.want)
		}
	}
	if got, err := kubeletstate.DeviceHolder(dir, "hami.io/gpu", []string{"GPU-1::6"}); err == nil {
		t.Errorf("another resource's devices: got %+v, want an error", got)
	}
}
