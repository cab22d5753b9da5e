package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func TestContainerDevices(t *testing.T) {
	f := newFakePodResources()
	f.hold("default", "p", "main", DeviceID(gpuB, 1), DeviceID(gpuA, 0), DeviceID(gpuA, 0))
	f.hold("default", "p", "cpu-only")
	f.hold("team", "q", "main", DeviceID(gpuB, 2))
	pods, err := f.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[containerRef][]string{
		{Namespace: "default", Pod: "p", Container: "main"}: {DeviceID(gpuA, 0), DeviceID(gpuB, 1)},
		{Namespace: "team", Pod: "q", Container: "main"}:    {DeviceID(gpuB, 2)},
	}
	if diff := cmp.Diff(want, containerDevices(pods, "hami.io/gpu")); diff != "" {
		t.Errorf("containerDevices (-want +got):\n%s", diff)
	}
}

// gatedLister blocks every List until released and counts the calls.
type gatedLister struct {
	started chan struct{} // one value per call
	release chan struct{}
	mu      sync.Mutex
	calls   int
}

func (g *gatedLister) List(ctx context.Context) ([]*podresourcesapi.PodResources, error) {
	g.mu.Lock()
	g.calls++
	g.mu.Unlock()
	g.started <- struct{}{}
	select {
	case <-g.release:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestCoalescingLister: callers that arrive while a List runs share one
// follow-up List, never the one already in flight.
func TestCoalescingLister(t *testing.T) {
	g := &gatedLister{started: make(chan struct{}, 10), release: make(chan struct{})}
	l := newCoalescingLister(g)
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := l.List(ctx); err != nil {
			t.Error(err)
		}
	})
	<-g.started // the first call is in flight
	const followers = 8
	for range followers {
		wg.Go(func() {
			if _, err := l.List(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		l.calls.mu.Lock()
		defer l.calls.mu.Unlock()
		return l.calls.next != nil && l.calls.next.waiters == followers, nil
	})
	if err != nil {
		t.Fatalf("followers did not queue behind the running call: %v", err)
	}
	g.release <- struct{}{} // first call
	<-g.started             // the shared follow-up
	g.release <- struct{}{}
	wg.Wait()
	if g.calls != 2 {
		t.Errorf("%d List calls for %d callers, want 2", g.calls, 1+followers)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.List(cancelled); err == nil {
		t.Error("List with a cancelled context returned no error")
	}
	<-g.started
	g.release <- struct{}{}
}

// podResourcesServer is a PodResources v1 server that rejects the first
// calls with ResourceExhausted, as the kubelet's rate limiter does.
type podResourcesServer struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	mu     sync.Mutex
	reject int
}

func (s *podResourcesServer) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reject > 0 {
		s.reject--
		return nil, status.Error(codes.ResourceExhausted, "rejected by rate limiter")
	}
	return &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{{Namespace: "default", Name: "p"}}}, nil
}

func TestPodResourcesClient(t *testing.T) {
	dir, err := os.MkdirTemp("", "prc") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	socket := filepath.Join(dir, "kubelet.sock")
	client := newPodResourcesClient(socket)
	if _, err := client.List(context.Background()); status.Code(err) != codes.Unavailable {
		t.Errorf("List with no kubelet = %v, want Unavailable", err)
	}

	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, &podResourcesServer{reject: 1})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	var pods []*podresourcesapi.PodResources
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		var listErr error
		pods, listErr = client.List(ctx)
		if code := status.Code(listErr); listErr != nil && code != codes.Unavailable && code != codes.ResourceExhausted {
			return false, listErr
		}
		return listErr == nil, nil
	})
	if err != nil || len(pods) != 1 || pods[0].GetName() != "p" {
		t.Fatalf("List = %v, %v; want pod p", pods, err)
	}
}
