package devicemanager_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuslice/gpuslice/test/harness/devicemanager"
)

// TestServePodResources: the kubelet's PodResources server lists each
// active pod's devices, one entry per device, and forgets a pod that is no
// longer active.
func TestServePodResources(t *testing.T) {
	dir, err := os.MkdirTemp("", "dm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	m := devicemanager.Start(t, dir)
	socket := filepath.Join(dir, "pod-resources.sock")
	m.ServePodResources(t, socket)
	servePlugin(t, m.SocketPath(), dir, "example.sock", &stubPlugin{name: "stub", devices: []string{"dev-0", "dev-1", "dev-2"}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.WaitResource(ctx, resourceName, 3, 3); err != nil {
		t.Fatal(err)
	}
	pod := podWithDevices("p", 2)
	if err := m.Allocate(pod, &pod.Spec.Containers[0]); err != nil {
		t.Fatal(err)
	}

	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := podresourcesapi.NewPodResourcesListerClient(conn)
	list := func() map[string][][]string {
		resp, err := client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][][]string{}
		for _, p := range resp.GetPodResources() {
			for _, c := range p.GetContainers() {
				var entries [][]string
				for _, d := range c.GetDevices() {
					entries = append(entries, append([]string{d.GetResourceName()}, d.GetDeviceIds()...))
				}
				slices.SortFunc(entries, func(a, b []string) int { return slices.Compare(a, b) })
				out[p.GetNamespace()+"/"+p.GetName()+"/"+c.GetName()] = entries
			}
		}
		return out
	}
	got := list()
	entries := got["default/p/c"]
	if len(entries) != 2 || len(entries[0]) != 2 || len(entries[1]) != 2 || entries[0][0] != resourceName {
		t.Fatalf("List = %v, want two single-device entries of %s for default/p/c", got, resourceName)
	}

	m.MarkInactive(pod.UID)
	if diff := cmp.Diff(map[string][][]string{}, list()); diff != "" {
		t.Errorf("List after the pod ended (-want +got):\n%s", diff)
	}
}
