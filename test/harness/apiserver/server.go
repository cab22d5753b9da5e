package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	etcdtestserver "k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

const (
	// readyTimeout bounds the wait for etcd and for /readyz. Ready takes seconds; a loaded
	// machine has taken a minute with -race. A Start that gives up stops the server while its
	// post-start hooks still run, and a failing hook ends the whole test binary (klog.Fatal),
	// taking every other test's report with it: so give up only when it is surely stuck.
	readyTimeout = 3 * time.Minute
	// stopTimeout bounds the wait for the kube-apiserver to return from Run after Stop.
	stopTimeout = time.Minute
	// pollInterval is how often Start probes /readyz.
	pollInterval = 50 * time.Millisecond
)

// Options configures Start. The zero value is a server on a free port in a new temporary folder.
type Options struct {
	// Port is the loopback TCP port the kube-apiserver serves HTTPS on; 0 picks a free one. Set it
	// (from FreePort) to point a client at the server before the server starts, or to restart a
	// server on the port it had.
	Port int
	// Dir is the folder for etcd's data, certificates, keys and the admin token; empty means a new
	// t.TempDir(). A Server started on the Dir of a stopped one keeps its objects and credentials.
	// Two running servers must not share a Dir.
	Dir string
	// Flags are extra kube-apiserver command-line flags, parsed after the harness's own so that they
	// override them. --feature-gates and --emulated-version are not supported.
	Flags []string
}

// Server is a running etcd and kube-apiserver. Its methods are safe for concurrent use.
type Server struct {
	t      testing.TB
	host   string // https://127.0.0.1:port
	token  string
	caData []byte

	etcd *embed.Etcd
	// etcdLogLevel is the level of etcd's log to t; Stop raises it, since etcd logs every closed
	// listener as an error and its goroutines may log after the test ends.
	etcdLogLevel zap.AtomicLevel
	cancel       context.CancelFunc
	done         chan error // receives Run's result, then is closed

	stopOnce sync.Once
}

// Start runs etcd and a kube-apiserver on 127.0.0.1 and returns once /readyz is ok and the default
// namespace exists, failing t otherwise. t.Cleanup stops both.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	began := time.Now()
	dir := opts.Dir
	if dir == "" {
		dir = t.TempDir()
	}
	creds, err := loadOrCreateCredentials(dir)
	if err != nil {
		t.Fatalf("apiserver: %v", err)
	}

	s := &Server{t: t, token: creds.token, etcdLogLevel: zap.NewAtomicLevelAt(zapcore.ErrorLevel)}
	if s.etcd, err = startEtcd(t, filepath.Join(dir, "etcd"), s.etcdLogLevel); err != nil {
		t.Fatalf("apiserver: %v", err)
	}
	t.Cleanup(s.Stop)
	etcdReady := time.Now()

	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(opts.Port)))
	if err != nil {
		t.Fatalf("apiserver: listen on port %d: %v", opts.Port, err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	s.host = "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	flags := []string{
		"--etcd-servers=" + s.etcd.Config().ListenClientUrls[0].String(),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + creds.certDir,
		"--endpoint-reconciler-type=none",
		"--service-cluster-ip-range=10.0.0.0/16",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + creds.serviceAccountKey,
		"--service-account-signing-key-file=" + creds.serviceAccountKey,
		"--token-auth-file=" + creds.tokenFile,
		"--authorization-mode=Node,RBAC",
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
	}
	for _, f := range opts.Flags {
		if strings.HasPrefix(f, "--feature-gates") || strings.HasPrefix(f, "--emulated-version") {
			t.Fatalf("apiserver: Options.Flags: %s is not supported: feature gates are process-wide state", f)
		}
	}
	flags = append(flags, opts.Flags...)

	ctx, cancel := context.WithCancel(context.Background())
	if err := s.run(ctx, ln, flags); err != nil {
		cancel()
		_ = ln.Close()
		t.Fatalf("apiserver: %v", err)
	}
	s.cancel = cancel
	built := time.Now()
	if s.caData, err = os.ReadFile(filepath.Join(creds.certDir, "apiserver.crt")); err != nil {
		t.Fatalf("apiserver: read serving certificate: %v", err)
	}
	if err := s.waitReady(); err != nil {
		t.Fatalf("apiserver: %v", err)
	}
	ready := time.Now()
	t.Logf("apiserver: kube-apiserver ready at %s in %v (etcd %v, build %v, until /readyz %v)", s.host,
		ready.Sub(began).Round(time.Millisecond), etcdReady.Sub(began).Round(time.Millisecond),
		built.Sub(etcdReady).Round(time.Millisecond), ready.Sub(built).Round(time.Millisecond))
	return s
}

// startEtcd starts a single-member etcd with its data in dataDir, on free loopback ports, logging
// to t at level.
func startEtcd(t testing.TB, dataDir string, level zap.AtomicLevel) (*embed.Etcd, error) {
	cfg := etcdtestserver.NewTestConfig(t)
	cfg.Dir = dataDir
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zaptest.NewLogger(t, zaptest.Level(level)).Named("etcd"))
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create etcd folder: %w", err)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd failed before it was ready: %w", err)
	case <-time.After(readyTimeout):
		e.Close()
		return nil, fmt.Errorf("etcd not ready after %v", readyTimeout)
	}
}

// run builds the kube-apiserver from flags the way the kube-apiserver command does and starts it
// serving on ln until ctx is done.
func (s *Server) run(ctx context.Context, ln net.Listener, flags []string) error {
	// A registry of our own, as the upstream test server does, so that a second server in the same
	// process does not find the first one's versions and gates registered.
	featureGate := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	effectiveVersion := compatibility.DefaultBuildEffectiveVersion()
	effectiveVersion.SetEmulationVersion(featureGate.EmulationVersion())
	effectiveVersion.SetMinCompatibilityVersion(featureGate.MinCompatibilityVersion())
	registry := basecompatibility.NewComponentGlobalsRegistry()
	if err := registry.Register(basecompatibility.DefaultKubeComponent, effectiveVersion, featureGate); err != nil {
		return fmt.Errorf("register component globals: %w", err)
	}

	opts := options.NewServerRunOptions()
	opts.GenericServerRunOptions.ComponentGlobalsRegistry = registry
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range opts.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(flags); err != nil {
		return fmt.Errorf("parse kube-apiserver flags: %w", err)
	}
	if err := registry.Set(); err != nil {
		return fmt.Errorf("apply component globals: %w", err)
	}
	opts.SecureServing.Listener = ln

	completed, err := opts.Complete(ctx)
	if err != nil {
		return fmt.Errorf("complete kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return fmt.Errorf("validate kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	config, err := app.NewConfig(completed)
	if err != nil {
		return fmt.Errorf("kube-apiserver config: %w", err)
	}
	completedConfig, err := config.Complete()
	if err != nil {
		return fmt.Errorf("complete kube-apiserver config: %w", err)
	}
	server, err := app.CreateServerChain(completedConfig)
	if err != nil {
		return fmt.Errorf("create kube-apiserver server chain: %w", err)
	}

	s.done = make(chan error, 1)
	go func() {
		defer close(s.done)
		prepared, err := server.PrepareRun()
		if err != nil {
			s.done <- fmt.Errorf("prepare kube-apiserver: %w", err)
			return
		}
		if err := prepared.Run(ctx); err != nil {
			s.done <- fmt.Errorf("run kube-apiserver: %w", err)
		}
	}()
	return nil
}

// waitReady polls /readyz, then waits for the default namespace, which a post-start controller
// creates.
func (s *Server) waitReady() error {
	client, err := kubernetes.NewForConfig(s.Config())
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	var last error
	ctx := context.Background()
	err = wait.PollUntilContextTimeout(ctx, pollInterval, readyTimeout, true, func(ctx context.Context) (bool, error) {
		select {
		case err, ok := <-s.done:
			if !ok {
				return false, errors.New("kube-apiserver stopped before it was ready")
			}
			return false, err
		default:
		}
		if _, err := client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
			last = fmt.Errorf("/readyz: %w", err)
			return false, nil
		}
		if _, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{}); err != nil {
			if !apierrors.IsNotFound(err) {
				last = fmt.Errorf("get namespace default: %w", err)
			}
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver at %s not ready after %v: %w", s.host, readyTimeout, errors.Join(err, last))
	}
	return nil
}

// Stop stops the kube-apiserver, waits for it to return, then stops etcd. It is idempotent and
// safe to call concurrently; t.Cleanup calls it too. Goroutines of the server's libraries may
// outlive it, but nothing listens on its ports afterwards.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		began := time.Now()
		if s.cancel != nil {
			s.cancel()
			select {
			case err := <-s.done:
				if err != nil {
					s.t.Errorf("apiserver: %v", err)
				}
			case <-time.After(stopTimeout):
				s.t.Errorf("apiserver: kube-apiserver still running %v after Stop", stopTimeout)
			}
		}
		s.etcdLogLevel.SetLevel(zapcore.FatalLevel)
		s.etcd.Close()
		s.t.Logf("apiserver: stopped in %v", time.Since(began).Round(time.Millisecond))
	})
}

// Config returns a new client configuration for the admin user (group system:masters, bearer
// token) that verifies the server's certificate. It allows 1000 requests per second, so that tests
// are not throttled on the client side.
func (s *Server) Config() *rest.Config {
	return &rest.Config{
		Host:            s.host,
		BearerToken:     s.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), s.caData...)},
		QPS:             1000,
		Burst:           10000,
	}
}

// WriteKubeconfig writes a kubeconfig for the admin user of Config to path (mode 0600), with the
// CA certificate and token inline so that it stays valid while the folder moves.
func (s *Server) WriteKubeconfig(path string) error {
	const name = "gpuslice-test"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: s.host, CertificateAuthorityData: s.caData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: s.token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago, failing t if none is. Another
// process may take it before it is used.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("apiserver: find a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
