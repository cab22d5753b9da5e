package deviceplugin

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Connection timing towards kubelet.sock. Right after a kubelet restart the
// socket exists a moment before the kubelet accepts connections; gRPC's
// default reconnect back-off would then wait about a second, so retry on a
// short timer instead.
const (
	dialBaseDelay = 10 * time.Millisecond
	dialMaxDelay  = 100 * time.Millisecond
	// registerTimeout bounds one Register call. Inside it the kubelet dials
	// the plugin back with a 10 s timeout, so it must be longer than that.
	registerTimeout = 15 * time.Second
)

// Register asks the kubelet listening on kubeletSocket to register the
// plugin served on endpoint (a socket file name in the kubelet's
// device-plugin folder) for resourceName. It must be called only once the
// endpoint serves: the kubelet dials it back and calls
// GetDevicePluginOptions before it answers. Refused connections are retried
// every few tens of milliseconds until ctx or registerTimeout ends.
func Register(ctx context.Context, kubeletSocket, endpoint, resourceName string, opts *pluginapi.DevicePluginOptions) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: dialBaseDelay, Multiplier: 1.5, Jitter: 0.2, MaxDelay: dialMaxDelay},
			MinConnectTimeout: time.Second,
		}),
	)
	if err != nil {
		return fmt.Errorf("connect to kubelet at %s: %w", kubeletSocket, err)
	}
	defer func() { _ = conn.Close() }()

	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: resourceName,
		Options:      opts,
	}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("register %s with kubelet at %s: %w", resourceName, kubeletSocket, err)
	}
	return nil
}
