package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// endpoint is one gRPC server on one socket: the unit the kubelet registers.
// Each registration round gets a fresh endpoint on a fresh socket name, so a
// stale kubelet connection can never reach the new server.
type endpoint struct {
	pluginapi.UnimplementedDevicePluginServer

	socket string // absolute path
	inv    *inventory
	alloc  *allocator
	server *grpc.Server
	logger klog.Logger

	stopOnce    sync.Once
	stopping    chan struct{} // closed by stop, before the server stops
	served      chan struct{} // closed when Serve returns
	streamEnded chan struct{} // closed once when the kubelet ends ListAndWatch
	endOnce     sync.Once
	listed      chan struct{} // closed once the first device list was sent
	listOnce    sync.Once
}

// startEndpoint listens on socket (removing a leftover file of that name)
// and serves the device-plugin API until stop.
func startEndpoint(logger klog.Logger, socket string, inv *inventory, alloc *allocator) (*endpoint, error) {
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove old socket %s: %w", socket, err)
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", socket, err)
	}
	e := &endpoint{
		socket:      socket,
		inv:         inv,
		alloc:       alloc,
		server:      grpc.NewServer(),
		logger:      logger.WithValues("socket", socket),
		stopping:    make(chan struct{}),
		served:      make(chan struct{}),
		streamEnded: make(chan struct{}),
		listed:      make(chan struct{}),
	}
	pluginapi.RegisterDevicePluginServer(e.server, e)
	go func() {
		defer close(e.served)
		if err := e.server.Serve(lis); err != nil {
			e.logger.Error(err, "gRPC server ended")
		}
	}()
	return e, nil
}

// stop ends the server and its streams and removes the socket. Idempotent.
func (e *endpoint) stop() {
	e.stopOnce.Do(func() {
		close(e.stopping)
		e.server.Stop()
		<-e.served
		if err := os.Remove(e.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			e.logger.Error(err, "Removing plugin socket")
		}
	})
}

// pluginOptions are the optional calls the plugin asks the kubelet for:
// GetPreferredAllocation (to steer devices to the scheduler's GPUs) and
// PreStartContainer (to hand each container its own pod's slice).
func pluginOptions() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions tells the kubelet which optional calls to make.
func (e *endpoint) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return pluginOptions(), nil
}

// ListAndWatch sends the whole device list now and again after every health
// change, until the kubelet hangs up or the endpoint stops. The first send
// closes listed: from then on the kubelet can admit pods on the devices. A
// hang-up by the kubelet is reported through streamEnded: the kubelet never
// reopens the stream, so only a new registration recovers.
func (e *endpoint) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		node, _, changed := e.inv.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: pluginDevices(node)}); err != nil {
			e.endStream()
			return fmt.Errorf("send device list: %w", err)
		}
		e.listOnce.Do(func() { close(e.listed) })
		select {
		case <-changed:
		case <-e.stopping:
			return nil
		case <-stream.Context().Done():
			e.endStream()
			return nil
		}
	}
}

func (e *endpoint) endStream() {
	select {
	case <-e.stopping: // our own shutdown, not the kubelet's
	default:
		e.endOnce.Do(func() { close(e.streamEnded) })
	}
}

// GetPreferredAllocation steers the kubelet to devices on the GPUs the
// scheduler chose for the container being admitted; it never fails.
func (e *endpoint) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return e.alloc.preferred(ctx, req), nil
}

// Allocate answers each container with a CDI device (mode cdi) or its
// environment (mode env); see allocator.allocate.
func (e *endpoint) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	return e.alloc.allocate(ctx, req)
}

// PreStartContainer hands the starting container its own pod's slice, or
// refuses the start; see allocator.preStart.
func (e *endpoint) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return e.alloc.preStart(ctx, req)
}

// removeDeadSockets removes the sockets in dir whose names start with
// prefix and that nothing listens on any more: those of a plugin that was
// killed before it could remove its own. Each plugin names its sockets
// apart (Plugin.socketName), so without this a node whose plugin crashes
// now and then would collect them. A socket that answers, or whose state
// cannot be told, is left alone: it may be a plugin still shutting down.
func removeDeadSockets(logger klog.Logger, dir, prefix string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		logger.Info("Cannot list the device-plugin folder for dead sockets", "dir", dir, "err", err)
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) || !strings.HasSuffix(e.Name(), ".sock") || e.Type()&os.ModeSocket == 0 {
			continue
		}
		path := filepath.Join(dir, e.Name())
		conn, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			_ = conn.Close()
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			logger.Info("Cannot remove a dead plugin socket", "socket", path, "err", err)
			continue
		}
		logger.Info("Removed a dead plugin socket", "socket", path)
	}
}
