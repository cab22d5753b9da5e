// Package keypair serves a TLS key pair from a certificate file and a key
// file and takes in replacements without a restart, for every gpuslice
// server that terminates TLS.
package keypair

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Files serves the key pair held in a certificate file and a key
// file, and notices when they change: every call of current reads both files
// again (a few KiB, cheap beside a TLS handshake) and parses them only when
// their bytes differ from the pair in use. Comparing bytes rather than
// modification times catches every replacement, in place or by the
// kubelet's swap of a Secret volume's ..data symlink, however quickly it
// follows the last one. A pair that cannot be read or does not parse (say, a
// new certificate written before its new key) leaves the last good pair in
// use and is logged once; it is tried again when either file changes. It is
// safe for concurrent use.
type Files struct {
	certFile, keyFile string

	mu      sync.Mutex
	pair    *tls.Certificate // in use; Leaf set
	certPEM []byte           // the bytes pair was parsed from
	keyPEM  []byte
	// badCert and badKey are the last bytes that failed to parse, and
	// lastProblem the last problem logged, so that each is logged once.
	badCert, badKey []byte
	lastProblem     string
}

// Load reads and parses the pair once. Its error is a *vgpu.FieldError
// naming the config field tlsCertFile or tlsKeyFile.
func Load(certFile, keyFile string) (*Files, error) {
	k := &Files{certFile: certFile, keyFile: keyFile}
	certPEM, err := os.ReadFile(certFile) //nolint:gosec // G304: the operator names the file.
	if err != nil {
		return nil, vgpu.InvalidField("tlsCertFile", certFile, "must be a readable PEM certificate file: "+err.Error())
	}
	keyPEM, err := os.ReadFile(keyFile) //nolint:gosec // G304: the operator names the file.
	if err != nil {
		return nil, vgpu.InvalidField("tlsKeyFile", keyFile, "must be a readable PEM private key file: "+err.Error())
	}
	pair, err := parseKeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, vgpu.InvalidField("tlsCertFile", certFile, "must hold a PEM certificate whose private key is in tlsKeyFile ("+keyFile+"): "+err.Error())
	}
	k.pair, k.certPEM, k.keyPEM = pair, certPEM, keyPEM
	return k, nil
}

// parseKeyPair parses a PEM certificate chain and its key, Leaf included.
func parseKeyPair(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parse key pair: %w", err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
	}
	return &pair, nil
}

// Current returns the pair to serve now, after taking in a changed, valid
// pair from the files. It never returns nil. Servers call it from
// tls.Config.GetCertificate.
func (k *Files) Current(logger klog.Logger) *tls.Certificate {
	certPEM, certErr := os.ReadFile(k.certFile) //nolint:gosec // G304: the operator names the file.
	keyPEM, keyErr := os.ReadFile(k.keyFile)    //nolint:gosec // G304: the operator names the file.

	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case certErr != nil:
		k.problem(logger, fmt.Errorf("read tlsCertFile: %w", certErr))
		return k.pair
	case keyErr != nil:
		k.problem(logger, fmt.Errorf("read tlsKeyFile: %w", keyErr))
		return k.pair
	case bytes.Equal(certPEM, k.certPEM) && bytes.Equal(keyPEM, k.keyPEM):
		k.lastProblem = ""
		return k.pair
	case bytes.Equal(certPEM, k.badCert) && bytes.Equal(keyPEM, k.badKey):
		return k.pair
	}
	pair, err := parseKeyPair(certPEM, keyPEM)
	if err != nil {
		k.badCert, k.badKey = certPEM, keyPEM
		k.problem(logger, err)
		return k.pair
	}
	k.pair, k.certPEM, k.keyPEM = pair, certPEM, keyPEM
	k.badCert, k.badKey, k.lastProblem = nil, nil, ""
	logger.Info("Serving a new certificate", "certFile", k.certFile, "serial", pair.Leaf.SerialNumber.String(),
		"dnsNames", pair.Leaf.DNSNames, "ipAddresses", pair.Leaf.IPAddresses, "notAfter", pair.Leaf.NotAfter)
	return k.pair
}

// problem logs err unless it is the problem logged last. k.mu is held.
func (k *Files) problem(logger klog.Logger, err error) {
	if err.Error() == k.lastProblem {
		return
	}
	k.lastProblem = err.Error()
	logger.Error(err, "Cannot load the changed serving certificate; still serving the previous one",
		"certFile", k.certFile, "keyFile", k.keyFile, "serial", k.pair.Leaf.SerialNumber.String())
}

// Ready returns an error when the pair served at now is outside its
// validity period: every client would then refuse the server.
func (k *Files) Ready(logger klog.Logger, now time.Time) error {
	leaf := k.Current(logger).Leaf
	switch {
	case now.After(leaf.NotAfter):
		return fmt.Errorf("the serving certificate (serial %s) expired at %s", leaf.SerialNumber, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("the serving certificate (serial %s) is not valid before %s", leaf.SerialNumber, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}
