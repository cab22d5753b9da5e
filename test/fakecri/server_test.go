package fakecri

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCreateContainerIsRecorded sends CRI calls as the kubelet would, over the real gRPC socket, and
// checks the Record the server appends. Real: gRPC and the upstream CRI fake. Fake: the kubelet.
func TestCreateContainerIsRecorded(t *testing.T) {
	dir := t.TempDir()
	records := filepath.Join(dir, "records.jsonl")
	srv, err := New(records)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "cri.sock")
	served := make(chan error, 1)
	go func() { served <- srv.Serve(socket) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sandboxCfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "uid-1"}}
	// Serve starts listening in its goroutine: wait for the socket instead of
	// failing on the first dial.
	sandbox, err := client.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandboxCfg}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	for attempt := range uint32(2) {
		_, err := client.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			PodSandboxId:  sandbox.GetPodSandboxId(),
			SandboxConfig: sandboxCfg,
			Config: &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: "c", Attempt: attempt},
				Image:    &runtimeapi.ImageSpec{Image: "img"},
				Envs: []*runtimeapi.KeyValue{
					{Key: "NVIDIA_VISIBLE_DEVICES", Value: []byte("GPU-1")},
					{Key: "A", Value: []byte("1")},
				},
				Mounts:     []*runtimeapi.Mount{{ContainerPath: "/c", HostPath: "/h", Readonly: true}},
				Devices:    []*runtimeapi.Device{{ContainerPath: "/dev/nvidia0", HostPath: "/dev/nvidia0", Permissions: "rw"}},
				CDIDevices: []*runtimeapi.CDIDevice{{Name: "nvidia.com/gpu=GPU-1"}},
			},
		})
		if err != nil {
			t.Fatalf("CreateContainer: %v", err)
		}
	}

	got, err := ReadRecords(records)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]Record, 2)
	for i := range want {
		want[i] = Record{
			Namespace: "ns", Pod: "p", PodUID: "uid-1", Container: "c", Attempt: uint32(i), //nolint:gosec // G115: 0 or 1
			Env:        map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1", "A": "1"},
			Mounts:     []Mount{{ContainerPath: "/c", HostPath: "/h", ReadOnly: true}},
			Devices:    []Device{{ContainerPath: "/dev/nvidia0", HostPath: "/dev/nvidia0", Permissions: "rw"}},
			CDIDevices: []string{"nvidia.com/gpu=GPU-1"},
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// TestReadRecordsMissingFile checks that no file means no records.
func TestReadRecordsMissingFile(t *testing.T) {
	got, err := ReadRecords(filepath.Join(t.TempDir(), "none"))
	if err != nil || len(got) != 0 {
		t.Errorf("ReadRecords(missing) = %v, %v; want none, nil", got, err)
	}
}
