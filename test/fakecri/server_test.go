package fakecri

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCreateContainerIsRecorded sends CRI calls as the kubelet would, over the real gRPC socket, and
// checks the Record the server appends. Real: gRPC and the upstream CRI fake. Fake: the kubelet.
func TestCreateContainerIsRecorded(t *testing.T) {
	records := filepath.Join(t.TempDir(), "records.jsonl")
	client, sandboxID, sandboxCfg := startServer(t, records, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for attempt := range uint32(2) {
		_, err := client.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			PodSandboxId:  sandboxID,
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
	if diff := cmp.Diff(want, withoutCreated(t, got)); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// TestContainerIDs checks that containers get IDs of 64 hex digits, as containerd's, and that the
// other CRI calls the kubelet makes find them by it.
func TestContainerIDs(t *testing.T) {
	client, sandboxID, sandboxCfg := startServer(t, filepath.Join(t.TempDir(), "records.jsonl"), Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	created, err := client.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  sandboxID,
		SandboxConfig: sandboxCfg,
		Config:        &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "c"}, Image: &runtimeapi.ImageSpec{Image: "img"}},
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	id := created.GetContainerId()
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(id) {
		t.Fatalf("container ID %q, want 64 hex digits", id)
	}
	if _, err := client.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("StartContainer(%s): %v", id, err)
	}
	st, err := client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil || st.GetStatus().GetId() != id || st.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("ContainerStatus(%s) = %v, %v; want it running under that ID", id, st.GetStatus(), err)
	}
	list, err := client.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil || len(list.GetContainers()) != 1 || list.GetContainers()[0].GetId() != id {
		t.Fatalf("ListContainers = %v, %v; want the one container %s", list.GetContainers(), err, id)
	}
	if _, err := client.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("RemoveContainer(%s): %v", id, err)
	}
}

// TestReadRecordsMissingFile checks that no file means no records.
func TestReadRecordsMissingFile(t *testing.T) {
	got, err := ReadRecords(filepath.Join(t.TempDir(), "none"))
	if err != nil || len(got) != 0 {
		t.Errorf("ReadRecords(missing) = %v, %v; want none, nil", got, err)
	}
}

// startServer serves a Server recording to records on a socket in a new folder, and returns a
// client with one pod sandbox created.
func startServer(t *testing.T, records string, opts Options) (runtimeapi.RuntimeServiceClient, string, *runtimeapi.PodSandboxConfig) {
	t.Helper()
	srv, err := New(records, opts)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "cri.sock")
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
	t.Cleanup(func() { _ = conn.Close() })
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
	return client, sandbox.GetPodSandboxId(), sandboxCfg
}

// cdiServer is a server that resolves CDI devices from a spec folder of its own.
type cdiServer struct {
	specDir, records string
	client           runtimeapi.RuntimeServiceClient
	sandboxID        string
	sandboxCfg       *runtimeapi.PodSandboxConfig
}

// startCDIServer starts a server that resolves CDI devices from a new, empty spec folder
// (Options.CDIOnNotify: onNotify).
func startCDIServer(t *testing.T, onNotify bool) *cdiServer {
	t.Helper()
	dir := t.TempDir()
	s := &cdiServer{specDir: filepath.Join(dir, "cdi"), records: filepath.Join(dir, "records.jsonl")}
	if err := os.Mkdir(s.specDir, 0o750); err != nil {
		t.Fatal(err)
	}
	s.client, s.sandboxID, s.sandboxCfg = startServer(t, s.records, Options{CDISpecDirs: []string{s.specDir}, CDIOnNotify: onNotify})
	return s
}

// create creates container "c" (that attempt) of image "img" with envs and CDI device.
func (s *cdiServer) create(ctx context.Context, attempt uint32, device string, envs ...*runtimeapi.KeyValue) error {
	_, err := s.client.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  s.sandboxID,
		SandboxConfig: s.sandboxCfg,
		Config: &runtimeapi.ContainerConfig{
			Metadata:   &runtimeapi.ContainerMetadata{Name: "c", Attempt: attempt},
			Image:      &runtimeapi.ImageSpec{Image: "img"},
			Envs:       envs,
			CDIDevices: []*runtimeapi.CDIDevice{{Name: device}},
		},
	})
	return err
}

// TestCreateContainerResolvesCDI checks that CDI devices are resolved against the spec files as
// they are at each CreateContainer (a rewritten spec is seen at once), that the spec's env wins
// over the container's own, and that an unknown device fails the call. Real: the CDI library.
func TestCreateContainerResolvesCDI(t *testing.T) {
	srv := startCDIServer(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	writeSpec := func(limit string) {
		t.Helper()
		spec := `{"cdiVersion":"0.6.0","kind":"example.com/vgpu","devices":[{"name":"d1","containerEdits":{"env":["LIMIT=` + limit + `","NVIDIA_VISIBLE_DEVICES=GPU-9"],"mounts":[{"hostPath":"/h/lib.so","containerPath":"/c/lib.so","options":["ro","bind"]}]}}]}`
		if err := os.WriteFile(filepath.Join(srv.specDir, "example.com-vgpu.json"), []byte(spec), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	create := func(attempt uint32, device string) error {
		return srv.create(ctx, attempt, device, &runtimeapi.KeyValue{Key: "NVIDIA_VISIBLE_DEVICES", Value: []byte("all")}, &runtimeapi.KeyValue{Key: "A", Value: []byte("1")})
	}
	writeSpec("100m")
	if err := create(0, "example.com/vgpu=d1"); err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	writeSpec("200m")
	if err := create(1, "example.com/vgpu=d1"); err != nil {
		t.Fatalf("CreateContainer after rewrite: %v", err)
	}
	if err := create(2, "example.com/vgpu=missing"); err == nil {
		t.Error("CreateContainer with an unknown CDI device succeeded; want an error")
	}
	got, err := ReadRecords(srv.records)
	if err != nil {
		t.Fatal(err)
	}
	var want []Record
	for i, limit := range []string{"100m", "200m"} {
		want = append(want, Record{
			Namespace: "ns", Pod: "p", PodUID: "uid-1", Container: "c", Attempt: uint32(i), //nolint:gosec // G115: 0 or 1
			Env:        map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-9", "A": "1", "LIMIT": limit},
			Mounts:     []Mount{{ContainerPath: "/c/lib.so", HostPath: "/h/lib.so", ReadOnly: true}},
			CDIDevices: []string{"example.com/vgpu=d1"},
		})
	}
	if diff := cmp.Diff(want, withoutCreated(t, got)); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// TestCreateContainerResolvesCDIOnNotify: with CDIOnNotify, devices resolve from the cache as the
// last inotify-driven refresh left it, with no read of the folder at CreateContainer. A spec that
// appears is seen once the cache has refreshed; a change inotify does not report to the folder's
// watch (the file rewritten through a hard link in another folder) is not seen, where reading the
// folder at CreateContainer would see it; a change it reports is. Real: the CDI library and
// inotify.
func TestCreateContainerResolvesCDIOnNotify(t *testing.T) {
	srv := startCDIServer(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	attempt := uint32(0)
	// resolve creates a container with the device and returns the LIMIT it got.
	resolve := func() (string, error) {
		err := srv.create(ctx, attempt, "example.com/vgpu=d1")
		attempt++
		if err != nil {
			return "", err
		}
		got, err := ReadRecords(srv.records)
		if err != nil {
			return "", err
		}
		return got[len(got)-1].Env["LIMIT"], nil
	}
	eventually := func(want string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			got, err := resolve()
			return err == nil && got == want, nil
		})
		if err != nil {
			t.Fatalf("LIMIT=%s never resolved after the spec was written: %v", want, err)
		}
	}
	spec := func(limit string) []byte {
		return []byte(`{"cdiVersion":"0.6.0","kind":"example.com/vgpu","devices":[{"name":"d1","containerEdits":{"env":["LIMIT=` + limit + `"]}}]}`)
	}

	if _, err := resolve(); err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices") {
		t.Fatalf("CreateContainer before any spec = %v; want unresolvable", err)
	}
	elsewhere := filepath.Join(t.TempDir(), "example.com-vgpu.json")
	inFolder := filepath.Join(srv.specDir, "example.com-vgpu.json")
	if err := os.WriteFile(elsewhere, spec("100m"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(elsewhere, inFolder); err != nil {
		t.Fatal(err)
	}
	eventually("100m")
	if err := os.WriteFile(elsewhere, spec("200m"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := resolve(); err != nil || got != "100m" {
		t.Fatalf("after a change the folder's watch was not told of: LIMIT=%q, %v; want the cached 100m", got, err)
	}
	if err := os.WriteFile(inFolder, spec("300m"), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually("300m")
}

// withoutCreated checks that every record has its creation time and returns them without it.
func withoutCreated(t *testing.T, records []Record) []Record {
	t.Helper()
	out := make([]Record, len(records))
	for i, r := range records {
		if r.Created.IsZero() || time.Since(r.Created) > time.Hour {
			t.Errorf("record %d (%s/%s) created at %v, want the time of its CreateContainer call", i, r.Pod, r.Container, r.Created)
		}
		r.Created = time.Time{}
		out[i] = r
	}
	return out
}
