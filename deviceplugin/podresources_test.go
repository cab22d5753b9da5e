package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
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

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// servePodResources serves a podResourcesServer (rejecting the first reject
// calls) on socket until the returned stop is called, or the test ends.
func servePodResources(t *testing.T, socket string, reject int) (*countingListener, func()) {
	t.Helper()
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingListener{Listener: lis}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, &podResourcesServer{reject: reject})
	go func() { _ = srv.Serve(counted) }()
	t.Cleanup(srv.Stop)
	return counted, srv.Stop
}

// TestPodResourcesClient checks the PodResources client against a kubelet
// that is not there, rate-limits, serves, goes away and comes back: it
// fails fast while the kubelet is away, keeps one connection for the calls
// in between, and reaches the kubelet that came back at the next call,
// without a back-off.
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

	lis, stop := servePodResources(t, socket, 1)
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
	for range 5 {
		if _, err := client.List(context.Background()); err != nil {
			t.Fatalf("List: %v", err)
		}
	}
	if n := lis.accepted.Load(); n != 1 {
		t.Errorf("the kubelet accepted %d connections for 6 successful Lists and a rate-limited one, want 1", n)
	}

	// The kubelet restarts: its socket goes, and a new one is served.
	stop()
	_ = os.Remove(socket)
	if _, err := client.List(context.Background()); status.Code(err) != codes.Unavailable {
		t.Errorf("List with the kubelet gone = %v, want Unavailable", err)
	}
	servePodResources(t, socket, 0)
	if pods, err := client.List(context.Background()); err != nil || len(pods) != 1 {
		t.Errorf("first List once the kubelet is back = %v, %v; want pod p at once", pods, err)
	}
}
