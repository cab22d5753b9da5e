package extender

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// certReloader serves a certificate from a pair of PEM files and reads the
// pair again when either file's modification time or size changes (a
// renewed Secret volume, cert-manager), checked at each TLS handshake. A
// pair that fails to load keeps the previous certificate in service.
type certReloader struct {
	certFile, keyFile string
	logger            klog.Logger

	mu   sync.Mutex
	cert *tls.Certificate
	// stamp is what the files looked like when cert was loaded, or when a
	// load last failed (so a bad pair is not retried on every handshake).
	stamp [2]fileStamp
}

// fileStamp identifies a version of a file cheaply.
type fileStamp struct {
	modTime time.Time
	size    int64
}

// newCertReloader loads the pair once; an error here stops the server.
func newCertReloader(certFile, keyFile string, logger klog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, logger: logger}
	stamp, err := r.stat()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	r.cert, r.stamp = &cert, stamp
	return r, nil
}

func (r *certReloader) stat() ([2]fileStamp, error) {
	var out [2]fileStamp
	for i, name := range []string{r.certFile, r.keyFile} {
		fi, err := os.Stat(name)
		if err != nil {
			return out, fmt.Errorf("TLS file: %w", err)
		}
		out[i] = fileStamp{modTime: fi.ModTime(), size: fi.Size()}
	}
	return out, nil
}

// getCertificate is tls.Config.GetCertificate.
func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamp, err := r.stat()
	if err != nil || stamp == r.stamp {
		// Missing files mid-rotation: keep serving what we have.
		return r.cert, nil
	}
	r.stamp = stamp
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		r.logger.Error(err, "Could not reload the TLS certificate; keeping the previous one", "certFile", r.certFile, "keyFile", r.keyFile)
		return r.cert, nil
	}
	r.cert = &cert
	r.logger.Info("Reloaded the TLS certificate", "certFile", r.certFile)
	return r.cert, nil
}
