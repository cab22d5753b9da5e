package deviceplugin

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// podListTimeout bounds one PodResources List call.
const podListTimeout = 5 * time.Second

// podLister lists, per pod and container on this node, the device IDs the
// kubelet assigned (the kubelet's PodResources API). Implementations are
// safe for concurrent use.
type podLister interface {
	List(ctx context.Context) ([]*podresourcesapi.PodResources, error)
}

// podConnIdle is how long the PodResources connection stays open after
// its last call.
const podConnIdle = 10 * time.Second

// podResourcesClient is the real podLister: the kubelet's PodResources v1
// service on a unix socket. Its connection is kept while calls succeed, so
// that the Lists of a burst of pods do not each dial: the kubelet admits
// pods one at a time, and GetPreferredAllocation's List is on that path.
// A dial and a List cost 0.5 ms against 0.07 ms for a List alone on an
// idle machine, in goroutines on both sides. The connection closes after
// podConnIdle without a call (grpc's idle mode), and is dropped at once
// when a call finds the kubelet gone (Unavailable): the next List dials
// afresh, so no connection outlives a kubelet restart, and nothing
// reconnects, or logs, in the background while the kubelet is away (a
// kept connection would retry with a back-off of up to two minutes, and
// fail every call meanwhile). Safe for concurrent use.
type podResourcesClient struct {
	target string
	mu     sync.Mutex
	conn   *grpc.ClientConn
}

// newPodResourcesClient returns a client for the socket at path (absolute).
// It does not dial; List reports a kubelet that is not there.
func newPodResourcesClient(path string) *podResourcesClient {
	return &podResourcesClient{target: "unix://" + path}
}

// List makes one List call, failing fast (codes.Unavailable) while the
// kubelet does not answer and with codes.ResourceExhausted above the
// kubelet's rate limit.
func (c *podResourcesClient) List(ctx context.Context) ([]*podresourcesapi.PodResources, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, podListTimeout)
	defer cancel()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		if status.Code(err) == codes.Unavailable {
			c.drop(conn)
		}
		return nil, fmt.Errorf("PodResources List: %w", err)
	}
	return resp.GetPodResources(), nil
}

// connection returns the kept connection, or a new one.
func (c *podResourcesClient) connection() (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		conn, err := grpc.NewClient(c.target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithIdleTimeout(podConnIdle))
		if err != nil {
			return nil, fmt.Errorf("PodResources client for %s: %w", c.target, err)
		}
		c.conn = conn
	}
	return c.conn, nil
}

// drop closes conn and forgets it, unless another call replaced it already.
func (c *podResourcesClient) drop(conn *grpc.ClientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == conn {
		c.conn = nil
	}
	_ = conn.Close()
}

// coalescingLister shares PodResources List calls among concurrent
// callers (shared): this keeps a burst of container starts under the
// kubelet's rate limit (100/s, burst 10, shared by all clients).
type coalescingLister struct {
	calls *shared[[]*podresourcesapi.PodResources]
}

func newCoalescingLister(inner podLister) *coalescingLister {
	return &coalescingLister{calls: newShared(inner.List, podListTimeout, "PodResources List")}
}

// List returns the result of a List call that started after List was
// called, or ctx's error (see shared.do).
func (l *coalescingLister) List(ctx context.Context) ([]*podresourcesapi.PodResources, error) {
	return l.calls.do(ctx)
}

// shared shares the calls of fn among concurrent callers: a caller joins
// the next call to start, never one already in flight, so every answer is
// at least as fresh as the moment it was asked for. While one call runs,
// everyone who asks meanwhile waits for a single follow-up call. Answers
// are shared: callers must not modify them.
type shared[T any] struct {
	fn      func(context.Context) (T, error)
	timeout time.Duration
	what    string // names the call in a caller's context error

	mu      sync.Mutex
	running bool
	next    *sharedCall[T] // the call the next waiters share; nil when none waits
}

type sharedCall[T any] struct {
	done    chan struct{}
	waiters int // callers sharing this call; guarded by shared.mu
	val     T
	err     error
}

func newShared[T any](fn func(context.Context) (T, error), timeout time.Duration, what string) *shared[T] {
	return &shared[T]{fn: fn, timeout: timeout, what: what}
}

// do returns the result of a call of fn that started after do was called,
// or ctx's error. The shared call itself is bounded by the timeout and does
// not end with any one caller's ctx.
func (c *shared[T]) do(ctx context.Context) (T, error) {
	c.mu.Lock()
	if c.next == nil {
		c.next = &sharedCall[T]{done: make(chan struct{})}
	}
	call := c.next
	call.waiters++
	if !c.running {
		c.running = true
		go c.loop(context.WithoutCancel(ctx))
	}
	c.mu.Unlock()
	select {
	case <-call.done:
		return call.val, call.err
	case <-ctx.Done():
		var zero T
		return zero, fmt.Errorf("%s: %w", c.what, ctx.Err())
	}
}

// loop runs the waiting calls one after another until none waits.
func (c *shared[T]) loop(ctx context.Context) {
	for {
		c.mu.Lock()
		call := c.next
		if call == nil {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.next = nil
		c.mu.Unlock()
		callCtx, cancel := context.WithTimeout(ctx, c.timeout)
		call.val, call.err = c.fn(callCtx)
		cancel()
		close(call.done)
	}
}

// containerDevices indexes a List answer: for each container holding
// devices of resource, its device IDs, sorted and without repeats (the
// kubelet lists one entry per device and NUMA node).
func containerDevices(pods []*podresourcesapi.PodResources, resource string) map[containerRef][]string {
	held := map[containerRef][]string{}
	for _, p := range pods {
		for _, c := range p.GetContainers() {
			var ids []string
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resource {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
			if len(ids) == 0 {
				continue
			}
			slices.Sort(ids)
			held[containerRef{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: c.GetName()}] = slices.Compact(ids)
		}
	}
	return held
}

// containerRef names one container of one pod.
type containerRef struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
}

// pod returns the namespace and name of r's pod.
func (r containerRef) pod() types.NamespacedName {
	return types.NamespacedName{Namespace: r.Namespace, Name: r.Pod}
}

// String renders r as namespace/pod/container.
func (r containerRef) String() string {
	return r.Namespace + "/" + r.Pod + "/" + r.Container
}
