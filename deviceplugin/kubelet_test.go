package deviceplugin

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is a hand-written kubelet Registration service on
// dir/kubelet.sock that behaves as the real one does in the order of its
// calls: it refuses the first refuse Register calls; it accepts the rest
// after dialling the plugin back and calling GetDevicePluginOptions, and
// only then, once opened is closed, calls ListAndWatch and keeps the
// latest device list. The real kubelet device manager is tested in
// test/deviceplugin; this fake lets a test hold ListAndWatch back, which
// the real one opens at once.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir    string
	refuse int
	// opened, closed by the test (or at once by newFakeKubelet with
	// open), lets the fake call ListAndWatch.
	opened chan struct{}

	mu       sync.Mutex
	calls    int
	accepted int  // Register calls answered with success
	devices  int  // devices in the latest ListAndWatch message
	received bool // a ListAndWatch message arrived
	conns    []*grpc.ClientConn
}

// newFakeKubelet serves a fakeKubelet on dir until the test ends. With
// open false, ListAndWatch waits for openList.
func newFakeKubelet(t *testing.T, dir string, refuse int, open bool) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{dir: dir, refuse: refuse, opened: make(chan struct{})}
	if open {
		close(k.opened)
	}
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "unix", filepath.Join(dir, kubeletSocketName))
	if err != nil {
		t.Fatal(err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(server, k)
	go func() { _ = server.Serve(ln) }()
	t.Cleanup(func() {
		server.Stop()
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, c := range k.conns {
			_ = c.Close()
		}
	})
	return k
}

// openList lets the fake call ListAndWatch on the plugins it registered.
func (k *fakeKubelet) openList() { close(k.opened) }

// Register refuses or accepts the plugin at req.Endpoint, as described on
// fakeKubelet.
func (k *fakeKubelet) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	k.calls++
	refused := k.calls <= k.refuse
	k.mu.Unlock()
	if refused {
		return nil, status.Error(codes.Unknown, "fake kubelet: refused")
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, status.Errorf(codes.Unknown, "fake kubelet: dial the plugin: %v", err)
	}
	k.mu.Lock()
	k.conns = append(k.conns, conn)
	k.mu.Unlock()
	client := pluginapi.NewDevicePluginClient(conn)
	if _, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		return nil, status.Errorf(codes.Unknown, "fake kubelet: GetDevicePluginOptions: %v", err)
	}
	// The stream outlives the Register call, as the kubelet's does.
	go k.listAndWatch(context.WithoutCancel(ctx), client)
	k.mu.Lock()
	k.accepted++
	k.mu.Unlock()
	return &pluginapi.Empty{}, nil
}

// listAndWatch waits for opened, then keeps the plugin's device lists
// until the stream ends.
func (k *fakeKubelet) listAndWatch(ctx context.Context, client pluginapi.DevicePluginClient) {
	<-k.opened
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		k.mu.Lock()
		k.devices, k.received = len(resp.Devices), true
		k.mu.Unlock()
	}
}

// acceptedCalls returns how many Register calls the fake accepted.
func (k *fakeKubelet) acceptedCalls() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.accepted
}

// listed returns the device count of the latest ListAndWatch message, and
// false before the first.
func (k *fakeKubelet) listed() (int, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.devices, k.received
}
