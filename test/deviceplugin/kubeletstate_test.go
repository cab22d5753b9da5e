package deviceplugin

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint"

	"github.com/gpuslice/gpuslice/node/kubeletstate"
)

// TestKubeletStateReadsTheKubeletsCheckpoint: the device manager's
// checkpoint, written by the kubelet's own checkpoint code at the pinned
// version under the name its device manager uses, is read as the kubelet
// wrote it: the one container holding exactly a set of device IDs, with
// devices on no NUMA node and on two, and the CDI devices of the Allocate
// answer the kubelet keeps for it (encoded as the device manager encodes
// it).
func TestKubeletStateReadsTheKubeletsCheckpoint(t *testing.T) {
	dir := t.TempDir()
	const cdiDevice = "gpuslice.io/vgpu=v00000000000000000001-0123456789ab"
	const cdiSecond = "gpuslice.io/vgpu=v00000000000000000002-0123456789ab"
	// Every field of the answer set, the CDI devices between the others: the reader takes the
	// CDI devices off the wire and must step over the rest.
	resp, err := proto.Marshal(&pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"},
		Mounts:      []*pluginapi.Mount{{ContainerPath: "/a", HostPath: "/b", ReadOnly: true}},
		Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/x", HostPath: "/dev/x", Permissions: "rw"}},
		CdiDevices:  []*pluginapi.CDIDevice{{Name: cdiDevice}, {Name: cdiSecond}},
		Annotations: map[string]string{"a": "b"},
	})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := checkpointmanager.NewCheckpointManager(dir)
	if err != nil {
		t.Fatal(err)
	}
	entries := []checkpoint.PodDevicesEntry{
		{PodUID: "uid-a", ContainerName: "main", ResourceName: "hami.io/gpu", DeviceIDs: checkpoint.DevicesPerNUMA{-1: {"GPU-1::4"}}, AllocResp: resp},
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
		{[]string{"GPU-1::4"}, kubeletstate.Holder{PodUID: "uid-a", Container: "main", CDIDevices: []string{cdiDevice, cdiSecond}}},
		{[]string{"GPU-2::0", "GPU-1::5"}, kubeletstate.Holder{PodUID: "uid-b", Container: "side"}},
	} {
		got, err := kubeletstate.DeviceHolder(dir, "hami.io/gpu", tc.ids)
		if err != nil {
			t.Errorf("DeviceHolder(%v): %v", tc.ids, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("DeviceHolder(%v) (-want +got):\n%s", tc.ids, diff)
		}
	}
	if got, err := kubeletstate.DeviceHolder(dir, "hami.io/gpu", []string{"GPU-1::6"}); err == nil {
		t.Errorf("another resource's devices: got %+v, want an error", got)
	}
}
