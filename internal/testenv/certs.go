package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// Certificates returns, in PEM, a test CA and a certificate it signed for
// 127.0.0.1 and redis.test (server and client use), with its key. They are
// valid for an hour either side of now.
func Certificates(t testing.TB) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	ca := NewCA(t)
	certPEM, keyPEM = ca.Issue(t, CertSpec{CommonName: "redis.test", DNSNames: []string{"redis.test"}, IPs: []string{"127.0.0.1"}})
	return ca.PEM, certPEM, keyPEM
}

// CA is a test certificate authority, valid for an hour either side of now.
type CA struct {
	// PEM is the CA's certificate.
	PEM    []byte
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial atomic.Int64
}

// CertSpec names what a certificate Issue makes is for.
type CertSpec struct {
	CommonName string
	DNSNames   []string
	IPs        []string // e.g. "127.0.0.1"
	URIs       []string // e.g. "spiffe://cluster.local/ns/llm/sa/gateway"
}

// NewCA makes a CA named "limiter test CA".
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "limiter test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}
	ca.serial.Store(1)
	return ca
}

// Issue returns, in PEM, a certificate the CA signed for spec (server and
// client use), and its key.
func (ca *CA) Issue(t testing.TB, spec CertSpec) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)), Subject: pkix.Name{CommonName: spec.CommonName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames:    spec.DNSNames,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, ip := range spec.IPs {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	for _, raw := range spec.URIs {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// IssueFiles is Issue writing the certificate and key to files in dir,
// named name.crt and name.key; it returns their paths.
func (ca *CA) IssueFiles(t testing.TB, dir, name string, spec CertSpec) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := ca.Issue(t, spec)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// Pool is a certificate pool of the CA alone, for RootCAs.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	return pool
}

// ClientTLS is the TLS config of a client that trusts the CA alone and
// presents a certificate the CA issued for spec.
func (ca *CA) ClientTLS(t testing.TB, spec CertSpec) *tls.Config {
	t.Helper()
	cert, err := tls.X509KeyPair(ca.Issue(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{cert}}
}

// File writes the CA's certificate to dir/ca.crt and returns its path.
func (ca *CA) File(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(path, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
