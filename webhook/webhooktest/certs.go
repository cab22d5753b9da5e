package webhooktest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"testing"
	"time"
)

// CA is a certificate authority for tests. Its methods are safe for
// concurrent use.
type CA struct {
	// CertPEM is the CA certificate in PEM: a MutatingWebhookConfiguration's
	// caBundle.
	CertPEM []byte
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
}

// KeyPair is a certificate and its private key.
type KeyPair struct {
	// CertPEM and KeyPEM are the certificate and the private key in PEM, as
	// in a kubernetes.io/tls Secret's tls.crt and tls.key.
	CertPEM, KeyPEM []byte
	// Cert is the parsed certificate; its SerialNumber tells pairs apart.
	Cert *x509.Certificate
}

// NewCA returns a new CA valid for a day, failing t on error.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(t),
		Subject:               pkix.Name{CommonName: "gpuslice test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("webhooktest: create CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("webhooktest: parse CA certificate: %v", err)
	}
	return &CA{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}
}

// Pool returns a certificate pool that holds only the CA, for clients.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// Serving returns a new serving certificate signed by the CA for 127.0.0.1,
// ::1 and localhost, valid from an hour ago for a day.
func (ca *CA) Serving(t testing.TB) KeyPair {
	t.Helper()
	now := time.Now()
	return ca.Issue(t, now.Add(-time.Hour), now.Add(24*time.Hour))
}

// Issue returns a new serving certificate signed by the CA for 127.0.0.1,
// ::1 and localhost, valid from notBefore to notAfter (which may lie in the
// past, for an expired certificate).
func (ca *CA) Issue(t testing.TB, notBefore, notAfter time.Time) KeyPair {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(t),
		Subject:      pkix.Name{CommonName: "gpuslice-webhook"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("webhooktest: create serving certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("webhooktest: parse serving certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("webhooktest: encode private key: %v", err)
	}
	return KeyPair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		Cert:    cert,
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("webhooktest: generate key: %v", err)
	}
	return key
}

func newSerial(t testing.TB) *big.Int {
	t.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("webhooktest: serial number: %v", err)
	}
	return serial
}
