package cluster

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// TestAPIProxyPassesCredentials has a client-go client, built from a kubeconfig written as the
// extenders' are, list and create through the APIProxy, and checks that the API server behind it
// sees the client's bearer token on both (client-go reads a kubeconfig's credentials for TLS
// servers only, so a proxy serving plain HTTP had its clients reach the API server anonymous) and
// that a write waits for the write delay while a read does not. Real: client-go, clientcmd, the
// proxy, TLS; the API server is an httptest TLS server that records what arrives.
func TestAPIProxyPassesCredentials(t *testing.T) {
	const token = "t0ken"
	var mu sync.Mutex
	auth := map[string]string{} // method -> Authorization seen
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth[r.Method] = r.Header.Get("Authorization")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","namespace":"default"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":[]}`))
	}))
	defer api.Close()
	apiCA := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw})

	p, err := startAPIProxy(&rest.Config{Host: api.URL, TLSClientConfig: rest.TLSClientConfig{CAData: apiCA}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := &Cluster{}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := c.writeKubeconfigFor(kubeconfig, p.URL(), p.CAData(), token); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const delay = 300 * time.Millisecond
	p.SetWriteDelay(delay)
	start := time.Now()
	if _, err := client.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("list through the proxy: %v", err)
	}
	if d := time.Since(start); d >= delay {
		t.Errorf("a read took %v with a write delay of %v: reads must pass at once", d, delay)
	}
	start = time.Now()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	if _, err := client.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create through the proxy: %v", err)
	}
	if d := time.Since(start); d < delay {
		t.Errorf("a write took %v with a write delay of %v: it was not held", d, delay)
	}
	if got := p.HeldWrites(); got != 1 {
		t.Errorf("HeldWrites = %d, want 1", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		if auth[m] != "Bearer "+token {
			t.Errorf("%s reached the API server with Authorization %q, want the client's bearer token", m, auth[m])
		}
	}
}
