package devicemanager

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	kubeletdevicemanager "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

const (
	// maxSocketPathLen is the longest path a unix socket can be bound to on Linux (sun_path is 108
	// bytes, NUL included).
	maxSocketPathLen = 107
	// pollInterval is how often WaitResource reads the manager's capacity.
	pollInterval = 10 * time.Millisecond
	// DefaultWaitTimeout bounds WaitResource when its context has no earlier deadline.
	DefaultWaitTimeout = 30 * time.Second
	// logVerbosity is the klog verbosity of the manager's log, written through t.Log.
	logVerbosity = 2
	// settleInterval and settleLimit bound how Stop waits for the folder to stop changing.
	settleInterval = 50 * time.Millisecond
	settleLimit    = 5 * time.Second
)

// Manager is a running kubelet device manager serving kubelet.sock in one folder. Its methods are
// safe for concurrent use; Allocate, ContainerEnv and RunContainerOptions are serialised, as the
// kubelet's pod admission and container start are.
type Manager struct {
	t      testing.TB
	impl   *kubeletdevicemanager.ManagerImpl
	logger klog.Logger
	socket string
	dir    string

	// callMu serialises the calls into impl that the kubelet never makes concurrently.
	callMu sync.Mutex
	// podsMu guards pods; impl reads them through activePods while callMu is held.
	podsMu sync.Mutex
	pods   []*corev1.Pod

	stopOnce sync.Once
}

// Start creates the real device manager with its registration socket at pluginDir/kubelet.sock and
// starts it, failing t if it cannot. Like a starting kubelet it creates pluginDir if needed, deletes
// every unix socket in it (not other files) and loads the checkpoint kubelet_internal_checkpoint
// found there. pluginDir must be short enough for a socket path (107 bytes with the plugin's own
// socket name, so prefer os.MkdirTemp("", …) over t.TempDir() for long test names). t.Cleanup stops
// the manager.
func Start(t testing.TB, pluginDir string) *Manager {
	t.Helper()
	socket := filepath.Join(pluginDir, filepath.Base(pluginapi.KubeletSocket))
	if len(socket) > maxSocketPathLen {
		t.Fatalf("devicemanager: socket path %q is %d bytes, longer than the %d a unix socket allows", socket, len(socket), maxSocketPathLen)
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(logVerbosity))).WithName("devicemanager")

	impl, err := newManagerImpl(logger, socket, nil, topologymanager.NewFakeManager(logger))
	if err != nil {
		t.Fatalf("devicemanager: create manager on %s: %v", socket, err)
	}
	m := &Manager{t: t, impl: impl, logger: logger, socket: socket, dir: pluginDir}
	sourcesReady := config.NewSourcesReady(func(sets.Set[string]) bool { return true })
	if err := impl.Start(logger, m.activePods, sourcesReady, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		t.Fatalf("devicemanager: start manager on %s: %v", socket, err)
	}
	t.Cleanup(m.Stop)
	return m
}

// Stop stops the registration server and disconnects every plugin, as a kubelet that exits does;
// the checkpoint stays. It is idempotent and safe to call concurrently.
//
// The kubelet's own Stop does not join the goroutine it runs per plugin connection, and that
// goroutine writes the checkpoint after every ListAndWatch response it had already received. A
// real kubelet exits right after, so nothing notices; in a test the folder may be removed next, so
// Stop also waits until the folder has stopped changing.
func (m *Manager) Stop() {
	m.stopOnce.Do(func() {
		if err := m.impl.Stop(m.logger); err != nil {
			m.t.Errorf("devicemanager: stop manager on %s: %v", m.socket, err)
		}
		m.settle()
	})
}

// settle waits until two listings of the manager's folder, settleInterval apart, are the same
// (names, sizes and modification times), or settleLimit has passed.
func (m *Manager) settle() {
	last := m.listing()
	err := wait.PollUntilContextTimeout(context.Background(), settleInterval, settleLimit, false, func(context.Context) (bool, error) {
		now := m.listing()
		unchanged := now == last
		last = now
		return unchanged, nil
	})
	if err != nil {
		m.logger.Info("Folder still changing after stop", "dir", m.dir, "waited", settleLimit)
	}
}

// listing describes every entry in the manager's folder; "" when it cannot be read.
func (m *Manager) listing() string {
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			fmt.Fprintf(&b, "%s gone\n", e.Name())
			continue
		}
		fmt.Fprintf(&b, "%s %d %d\n", e.Name(), info.Size(), info.ModTime().UnixNano())
	}
	return b.String()
}

// SocketPath returns the path of the manager's registration socket, pluginDir/kubelet.sock.
func (m *Manager) SocketPath() string {
	return m.socket
}

// Resource returns the capacity and allocatable device counts the kubelet would publish for the
// extended resource name (such as "example.com/dev") on its Node now; 0, 0 when no plugin
// registered it. Like the kubelet's node status update it calls GetCapacity, which also forgets
// resources whose plugin has been gone for longer than the 5-minute grace period.
func (m *Manager) Resource(name string) (capacity, allocatable int64) {
	c, a, _ := m.impl.GetCapacity(m.logger)
	cq := c[corev1.ResourceName(name)]
	aq := a[corev1.ResourceName(name)]
	return cq.Value(), aq.Value()
}

// WaitResource polls Resource every 10 ms until name has exactly the given capacity and allocatable
// counts. It gives up when ctx is done or after DefaultWaitTimeout, whichever comes first, with an
// error that names the values last seen.
func (m *Manager) WaitResource(ctx context.Context, name string, capacity, allocatable int64) error {
	var gotCapacity, gotAllocatable int64
	err := wait.PollUntilContextTimeout(ctx, pollInterval, DefaultWaitTimeout, true, func(context.Context) (bool, error) {
		gotCapacity, gotAllocatable = m.Resource(name)
		return gotCapacity == capacity && gotAllocatable == allocatable, nil
	})
	if err != nil {
		return fmt.Errorf("resource %s: want capacity %d allocatable %d, last saw capacity %d allocatable %d: %w",
			name, capacity, allocatable, gotCapacity, gotAllocatable, err)
	}
	return nil
}

// Allocate marks pod as active (pods are matched by UID, which must be set) and runs the real
// Allocate for one of its containers, as the kubelet's admission does: the plugin's
// GetPreferredAllocation and Allocate are called for every device-plugin resource in the
// container's limits. Call it for init containers before app containers, in spec order, as the
// kubelet does.
func (m *Manager) Allocate(pod *corev1.Pod, container *corev1.Container) error {
	if pod.UID == "" {
		return fmt.Errorf("allocate for pod %s/%s: pod.UID is empty; the device manager keys pods by UID", pod.Namespace, pod.Name)
	}
	m.MarkActive(pod)
	m.callMu.Lock()
	defer m.callMu.Unlock()
	if err := m.impl.Allocate(m.context(), pod, container, lifecycle.AddOperation); err != nil {
		return fmt.Errorf("allocate for pod %s/%s container %s: %w", pod.Namespace, pod.Name, container.Name, err)
	}
	return nil
}

// RunContainerOptions returns what the kubelet would hand the container runtime for one container
// (environment, mounts, device nodes, annotations, CDI device names), as it does on every container
// start: it calls the plugin's PreStartContainer when the plugin asked for it, and allocates again
// if the manager has no cached allocation for an active pod. The result is never nil.
func (m *Manager) RunContainerOptions(pod *corev1.Pod, container *corev1.Container) (*kubeletdevicemanager.DeviceRunContainerOptions, error) {
	m.callMu.Lock()
	defer m.callMu.Unlock()
	opts, err := m.impl.GetDeviceRunContainerOptions(m.context(), pod, container)
	if err != nil {
		return nil, fmt.Errorf("run container options for pod %s/%s container %s: %w", pod.Namespace, pod.Name, container.Name, err)
	}
	if opts == nil {
		opts = &kubeletdevicemanager.DeviceRunContainerOptions{}
	}
	return opts, nil
}

// ContainerEnv returns the environment the device plugins' Allocate responses set for one
// container, read through RunContainerOptions (so PreStartContainer runs too). Empty, not nil, when
// the container has no device-plugin resources.
func (m *Manager) ContainerEnv(pod *corev1.Pod, container *corev1.Container) (map[string]string, error) {
	opts, err := m.RunContainerOptions(pod, container)
	if err != nil {
		return nil, err
	}
	env := make(map[string]string, len(opts.Envs))
	for _, e := range opts.Envs {
		env[e.Name] = e.Value
	}
	return env, nil
}

// MarkActive adds pods to the manager's active pods, replacing earlier copies with the same UID.
// Allocate does this itself; a test calls it after a restart (a new Manager on the same folder),
// so that the pods the checkpoint lists keep their devices, as running pods do in a real kubelet.
func (m *Manager) MarkActive(pods ...*corev1.Pod) {
	m.podsMu.Lock()
	defer m.podsMu.Unlock()
	for _, pod := range pods {
		i := slices.IndexFunc(m.pods, func(p *corev1.Pod) bool { return p.UID == pod.UID })
		if i >= 0 {
			m.pods[i] = pod
		} else {
			m.pods = append(m.pods, pod)
		}
	}
}

// MarkInactive removes the pods with the given UIDs from the active pods, as a pod that
// terminates; the device manager frees their devices at its next Allocate. Unknown UIDs are
// ignored.
func (m *Manager) MarkInactive(uids ...types.UID) {
	gone := sets.New(uids...)
	m.podsMu.Lock()
	defer m.podsMu.Unlock()
	m.pods = slices.DeleteFunc(m.pods, func(p *corev1.Pod) bool { return gone.Has(p.UID) })
}

// activePods is the device manager's ActivePodsFunc: a copy of the active pods.
func (m *Manager) activePods() []*corev1.Pod {
	m.podsMu.Lock()
	defer m.podsMu.Unlock()
	return append([]*corev1.Pod(nil), m.pods...)
}

// context returns a context carrying the manager's logger, for calls that log through it.
func (m *Manager) context() context.Context {
	return klog.NewContext(context.Background(), m.logger)
}
