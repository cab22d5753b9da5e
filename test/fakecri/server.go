package fakecri

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// Server is a fake CRI runtime that records CreateContainer calls. It embeds the upstream fake, so
// every other CRI method behaves exactly as there.
type Server struct {
	*fake.RemoteRuntime

	grpc *grpc.Server

	cdi *cdi.Cache // nil when no CDI spec folder is configured
	// cdiOnNotify: cdi refreshes itself when inotify reports a change (Options.CDIOnNotify).
	cdiOnNotify bool

	mu     sync.Mutex // serialises appends to out
	out    *os.File
	closed bool
}

// Options configures New.
type Options struct {
	// CDISpecDirs are the folders CDI devices are resolved from, highest priority last, as
	// containerd's cdi_spec_dirs. Empty means CDI devices are recorded by name only.
	CDISpecDirs []string
	// CDIOnNotify resolves CDI devices as containerd 2.x's CRI plugin does: from a cache that a
	// goroutine refreshes when inotify reports a change to the folders, so a spec written just
	// before CreateContainer may not be seen yet (the device is then unresolvable, or resolves to
	// the spec's earlier content). False reads the folders again at every CreateContainer.
	CDIOnNotify bool
}

// New returns a Server that appends a Record for each CreateContainer to the file at recordPath
// (created if missing, mode 0600). The runtime and network report Ready from the start, and
// every image "pulls" at once with a size of 1 MiB. With opts.CDISpecDirs, each CreateContainer
// resolves its CDI devices against the spec files there at that moment, or with opts.CDIOnNotify
// against the cache as the last inotify-driven refresh left it, and fails when one does not
// resolve.
func New(recordPath string, opts Options) (*Server, error) {
	var cache *cdi.Cache
	if len(opts.CDISpecDirs) > 0 {
		var err error
		if cache, err = cdi.NewCache(cdi.WithSpecDirs(opts.CDISpecDirs...), cdi.WithAutoRefresh(opts.CDIOnNotify)); err != nil {
			return nil, fmt.Errorf("CDI cache: %w", err)
		}
	}
	out, err := os.OpenFile(recordPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) //nolint:gosec // G304: the caller names its record file
	if err != nil {
		return nil, fmt.Errorf("open CRI record file: %w", err)
	}
	s := &Server{RemoteRuntime: fake.NewFakeRemoteRuntime(), grpc: grpc.NewServer(), out: out, cdi: cache, cdiOnNotify: opts.CDIOnNotify}
	// The kubelet rejects an image whose size is 0 ("Id or size of image … is not set").
	s.ImageService.SetFakeImageSize(1 << 20)
	s.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	// Our own gRPC server, registered with s rather than the embedded fake, so that our
	// CreateContainer is the one served. (The fake's own Start registers the fake itself.)
	runtimeapi.RegisterRuntimeServiceServer(s.grpc, s)
	runtimeapi.RegisterImageServiceServer(s.grpc, s)
	return s, nil
}

// Serve serves CRI on the unix socket at socketPath (removing a stale socket first) until Stop.
func (s *Server) Serve(socketPath string) error {
	if err := os.Remove(socketPath); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", socketPath)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	if err := s.grpc.Serve(ln); err != nil {
		return fmt.Errorf("serve CRI: %w", err)
	}
	return nil
}

// Stop stops serving and closes the record file. It is idempotent.
func (s *Server) Stop() {
	s.grpc.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		_ = s.out.Close()
	}
}

// CreateContainer records the request, then creates the container in the upstream fake under an
// ID of 64 hex digits, as containerd's and CRI-O's are (the upstream fake names it
// "<sandbox>_<name>_<attempt>"): the device plugin finds a container by such an ID in a
// process's cgroup path, and the kubelet puts it in the pod's status.
func (s *Server) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	if err := s.record(req); err != nil {
		return nil, err
	}
	resp, err := s.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(resp.GetContainerId()))
	id := hex.EncodeToString(sum[:])
	rs := s.RuntimeService
	rs.Lock()
	defer rs.Unlock()
	c, ok := rs.Containers[resp.GetContainerId()]
	if !ok {
		return nil, fmt.Errorf("fake CRI: container %s vanished as it was created", resp.GetContainerId())
	}
	delete(rs.Containers, resp.GetContainerId())
	c.Id = id
	rs.Containers[id] = c
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

// record appends req as one Record line.
func (s *Server) record(req *runtimeapi.CreateContainerRequest) error {
	r := Record{Env: map[string]string{}, Created: time.Now()}
	if md := req.GetSandboxConfig().GetMetadata(); md != nil {
		r.Namespace, r.Pod, r.PodUID = md.GetNamespace(), md.GetName(), md.GetUid()
	}
	cfg := req.GetConfig()
	if md := cfg.GetMetadata(); md != nil {
		r.Container, r.Attempt = md.GetName(), md.GetAttempt()
	}
	for _, kv := range cfg.GetEnvs() {
		r.Env[kv.GetKey()] = string(kv.GetValue())
	}
	for _, m := range cfg.GetMounts() {
		r.Mounts = append(r.Mounts, Mount{ContainerPath: m.GetContainerPath(), HostPath: m.GetHostPath(), ReadOnly: m.GetReadonly()})
	}
	for _, d := range cfg.GetDevices() {
		r.Devices = append(r.Devices, Device{ContainerPath: d.GetContainerPath(), HostPath: d.GetHostPath(), Permissions: d.GetPermissions()})
	}
	for _, d := range cfg.GetCDIDevices() {
		r.CDIDevices = append(r.CDIDevices, d.GetName())
	}
	if err := s.resolveCDI(&r); err != nil {
		return err
	}
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode CRI record: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("fake CRI stopped")
	}
	if _, err := s.out.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("append CRI record: %w", err)
	}
	return nil
}

// resolveCDI applies r's CDI devices to r as the runtime would: the spec files are read again now
// (a spec written at PreStartContainer is always seen; with cdiOnNotify the cache is taken as it
// is, as containerd takes it), then each device's edits are
// injected into an OCI spec holding r's environment, and the result replaces r.Env and adds to
// r.Mounts and r.Devices. An unresolvable device is an error, which fails CreateContainer.
func (s *Server) resolveCDI(r *Record) error {
	if s.cdi == nil || len(r.CDIDevices) == 0 {
		return nil
	}
	if s.cdiOnNotify {
		// Spec errors of the last refresh, as Refresh would report them.
		if errs := s.cdi.GetErrors(); len(errs) > 0 {
			r.CDIErrors = append(r.CDIErrors, fmt.Sprint(errs))
		}
	} else if err := s.cdi.Refresh(); err != nil {
		// Refresh reports broken spec files but keeps the good ones: only a device that
		// then fails to resolve is fatal.
		r.CDIErrors = append(r.CDIErrors, err.Error())
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	for _, k := range sortedKeys(r.Env) {
		spec.Process.Env = append(spec.Process.Env, k+"="+r.Env[k])
	}
	if _, err := s.cdi.InjectDevices(spec, r.CDIDevices...); err != nil {
		return fmt.Errorf("CDI devices of %s/%s container %s: %w", r.Namespace, r.Pod, r.Container, err)
	}
	r.Env = map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		r.Env[k] = v
	}
	for _, m := range spec.Mounts {
		r.Mounts = append(r.Mounts, Mount{ContainerPath: m.Destination, HostPath: m.Source, ReadOnly: slices.Contains(m.Options, "ro")})
	}
	for _, d := range spec.Linux.Devices {
		r.Devices = append(r.Devices, Device{ContainerPath: d.Path, HostPath: d.Path})
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
