package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// adminUser is the user of the admin token; its group system:masters is allowed everything. The
// kubelets, the scheduler and the device plugins use it too: this cluster tests gpuslice, not RBAC.
const adminUser = "gpuslice-admin"

// freePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd starts etcd with its data in dir/etcd/data and waits for /health.
func (c *Cluster) startEtcd(ctx context.Context) error {
	var err error
	if c.State.EtcdPort, err = freePort(); err != nil {
		return err
	}
	peerPort, err := freePort()
	if err != nil {
		return err
	}
	dir := filepath.Join(c.State.Dir, "etcd")
	client := "http://127.0.0.1:" + strconv.Itoa(c.State.EtcdPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	p, err := c.start("etcd", "etcd", []string{
		"--name=default",
		"--data-dir=" + filepath.Join(dir, "data"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=default=" + peer,
		"--log-level=warn",
	}, dir)
	if err != nil {
		return err
	}
	return c.waitFor(ctx, "etcd /health", []*Process{p}, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, http.DefaultClient, client+"/health"), nil
	})
}

// newToken returns a random bearer token.
func newToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate a token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// startAPIServer writes the credentials (the admin's and a token for each of users), starts
// kube-apiserver on a free port (with audit, its audit log at AuditLogPath), waits for /readyz and
// the default namespace, and writes the admin kubeconfig.
func (c *Cluster) startAPIServer(ctx context.Context, users []string, audit bool) error {
	dir := filepath.Join(c.State.Dir, "kube-apiserver")
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return fmt.Errorf("create pki folder: %w", err)
	}
	saKey := filepath.Join(pki, "service-account.key")
	key, err := keyutil.MakeEllipticPrivateKeyPEM()
	if err != nil {
		return fmt.Errorf("generate service account key: %w", err)
	}
	if err := os.WriteFile(saKey, key, 0o600); err != nil {
		return fmt.Errorf("write service account key: %w", err)
	}
	if c.State.Token, err = newToken(); err != nil {
		return err
	}
	tokenFile := filepath.Join(pki, "tokens.csv")
	if err := c.writeTokens(tokenFile, users); err != nil {
		return err
	}
	if c.State.APIServerPort, err = freePort(); err != nil {
		return err
	}
	args := []string{
		"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(c.State.EtcdPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.State.APIServerPort),
		"--cert-dir=" + pki,
		"--endpoint-reconciler-type=none",
		"--service-cluster-ip-range=10.0.0.0/16",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=Node,RBAC",
		// No controller-manager creates service-account tokens: pods run without one.
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		// Resolve webhook Services through their endpoints: there is no kube-proxy to route a
		// ClusterIP (the chart's webhook is a Service).
		"--enable-aggregator-routing=true",
	}
	if audit {
		policy := filepath.Join(dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
			return fmt.Errorf("write audit policy: %w", err)
		}
		args = append(args, "--audit-policy-file="+policy, "--audit-log-path="+c.AuditLogPath(), "--audit-log-format=json", "--audit-log-mode=blocking")
	}
	p, err := c.start("kube-apiserver", "kube-apiserver", args, dir)
	if err != nil {
		return err
	}
	crt := filepath.Join(pki, "apiserver.crt")
	var client kubernetes.Interface
	var last error // why the last check failed, for the error if none passes
	err = c.waitFor(ctx, "kube-apiserver /readyz and namespace default", []*Process{p}, func(ctx context.Context) (bool, error) {
		if client == nil {
			// The API server writes its self-signed certificate while starting, not atomically: a
			// read may see an empty or short file.
			ca, err := os.ReadFile(crt) //nolint:gosec // G304: the API server's certificate in our own folder
			if err != nil {
				last = err
				return false, nil
			}
			if _, err := certutil.ParseCertsPEM(ca); err != nil { // no whole certificate yet
				last = fmt.Errorf("%s not complete yet: %w", crt, err)
				return false, nil
			}
			c.State.CAData = ca
			if client, err = kubernetes.NewForConfig(c.RESTConfig()); err != nil {
				return false, fmt.Errorf("admin client: %w", err)
			}
		}
		if _, err := client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
			last = fmt.Errorf("/readyz: %w", err)
			client = nil // read the certificate again: the one read may not be the one served
			return false, nil
		}
		if _, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{}); err != nil {
			last = fmt.Errorf("namespace default: %w", err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		if last != nil {
			err = fmt.Errorf("%w (last check: %w)", err, last)
		}
		return err
	}
	c.State.Kubeconfig = filepath.Join(c.State.Dir, "kubeconfig")
	return c.writeKubeconfig(c.State.Kubeconfig)
}

// startScheduler starts pair's kube-scheduler with the stock and gpuslice profiles, the latter
// calling the pair's extender (and its DRA scoring with draScore, Options.DRAScore), authenticated
// by kubeconfig, and waits for its /healthz. A non-empty config replaces the profiles
// (Options.SchedulerConfig). With leader, it runs leader election on the Lease
// LeaderLeaseNamespace/LeaderLeaseName with those durations, under the pair's host name.
func (c *Cluster) startScheduler(ctx context.Context, pair SchedulerPair, kubeconfig, config string, draScore bool, leader *LeaderElection) error {
	dir := filepath.Join(c.State.Dir, pair.KubeScheduler)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create scheduler folder: %w", err)
	}
	doc := schedulerConfig(kubeconfig, pair.ExtenderPort, draScore, leader)
	if config != "" {
		var err error
		if doc, err = pointSchedulerConfig(config, kubeconfig, pair.ExtenderPort); err != nil {
			return err
		}
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		return fmt.Errorf("write scheduler configuration: %w", err)
	}
	bin, args, err := inHost(pair.Hostname, filepath.Join(c.State.BinDir, "kube-scheduler"), []string{"--config=" + cfg})
	if err != nil {
		return err
	}
	return c.startKubeScheduler(ctx, pair.KubeScheduler, bin, args, nil)
}

// startKubeScheduler starts kube-scheduler from bin with args (which must name its configuration)
// and env as the process name, serving on a free loopback port, and waits for its /healthz.
func (c *Cluster) startKubeScheduler(ctx context.Context, name, bin string, args, env []string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	args = append(append([]string(nil), args...), "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port))
	p, err := c.startEnv(name, bin, args, env, filepath.Join(c.State.Dir, name))
	if err != nil {
		return err
	}
	return c.waitKubeSchedulerReady(ctx, p, name+" /healthz")
}

// RESTConfig returns a client configuration for the admin user that verifies the API server's
// certificate, allowing 1000 requests per second.
func (c *Cluster) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            "https://127.0.0.1:" + strconv.Itoa(c.State.APIServerPort),
		BearerToken:     c.State.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), c.State.CAData...)},
		QPS:             1000,
		Burst:           10000,
	}
}

// writeKubeconfig writes an admin kubeconfig with the CA and token inline to path (mode 0600).
func (c *Cluster) writeKubeconfig(path string) error {
	return c.writeKubeconfigFor(path, c.RESTConfig().Host, c.State.CAData, c.State.Token)
}

// writeKubeconfigFor writes a kubeconfig of server (the PEM certificates ca inline) with token to
// path (mode 0600), creating its folder.
func (c *Cluster) writeKubeconfigFor(path, server string, ca []byte, token string) error {
	const name = "gpuslice-local"
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("create the folder of %s: %w", path, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// httpOK reports whether a GET of url answers 200.
func httpOK(ctx context.Context, client *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
