package deviceplugin

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// listWindow is how long TestRegisteredOnceListed gives a plugin to call
// itself registered while the kubelet holds ListAndWatch back: the plugin
// must not, so the test waits all of it. It bounds a wait for something
// that must not happen, not a synchronisation.
const listWindow = time.Second

// TestRegisteredOnceListed: a plugin whose Register the kubelet accepted
// calls itself registered (which the ready label and the heartbeat
// publish) only once the kubelet has its device list. Until its first
// ListAndWatch message the kubelet's allocatable is 0 (after a kubelet
// restart) and a pod it admits fails with UnexpectedAdmissionError.
func TestRegisteredOnceListed(t *testing.T) {
	dir := t.TempDir()
	kubelet := newFakeKubelet(t, dir, 0, false)
	cfg := validConfig()
	cfg.DevicePluginDir, cfg.CDISpecDir, cfg.StateDir = dir, t.TempDir(), t.TempDir()
	cfg.PodResourcesSocket = filepath.Join(dir, "no-pod-resources.sock")
	p, err := New(cfg, staticBackend{gpus: testGPUs()}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), ktesting.NewLogger(t, ktesting.DefaultConfig)))
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	waitUntil(t, "the kubelet to accept the registration", func() bool { return kubelet.acceptedCalls() > 0 })
	err = wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, listWindow, true, func(context.Context) (bool, error) {
		return p.Registered(), nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the plugin called itself registered before the kubelet had its device list (wait: %v)", err)
	}

	kubelet.openList()
	waitUntil(t, "registered once listed", p.Registered)
	if n, ok := kubelet.listed(); !ok || n != len(testGPUs())*cfg.SplitCount {
		t.Errorf("kubelet's device list when the plugin called itself registered: %d devices (received %v), want %d", n, ok, len(testGPUs())*cfg.SplitCount)
	}
}
