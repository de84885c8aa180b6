package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// TLSFiles put the API listener on TLS, and optionally mutual TLS, and
// the admin listener on TLS (adminTLSConfig).
type TLSFiles struct {
	// CertFile and KeyFile are the server's PEM certificate (chain) and
	// key. Both, or neither: plain HTTP. They are re-read when either
	// changes, at the next handshake, so a rotated certificate is served
	// without a restart. Default "".
	CertFile, KeyFile string
	// ClientCAFile is a PEM bundle of the CAs whose client certificates
	// name callers (mutual TLS). A client may present a certificate or
	// not (a caller may use a token over TLS instead); one it presents
	// must verify. Read at start. Default "": no client certificates.
	ClientCAFile string
}

func (f TLSFiles) enabled() bool { return f.CertFile != "" }

// Config returns the TLS configuration of a listener serving f: the API
// listener, and the ext_proc listener beside it, which takes the same
// certificate and client CA. Errors name the file.
func (f TLSFiles) Config(log *slog.Logger) (*tls.Config, error) {
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, errors.New("http.tls.certFile and http.tls.keyFile must be set together")
	}
	pair := &keyPair{certFile: f.CertFile, keyFile: f.KeyFile, log: log}
	if _, err := pair.load(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: pair.get,
	}
	if f.ClientCAFile != "" {
		pem, err := os.ReadFile(f.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("http.tls.clientCAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("http.tls.clientCAFile %s: no PEM certificate in it", f.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// keyPair is the server certificate, re-read when its files change.
type keyPair struct {
	certFile, keyFile string
	log               *slog.Logger

	mu     sync.Mutex
	stamps [2]fileStamp
	cert   *tls.Certificate
}

// get serves the certificate of the files as they are now: a change is
// loaded at the next handshake; a pair that does not load (half-written
// by a rotation) keeps the one before in use, and is logged.
func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	cert, err := k.load()
	if err != nil {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.cert == nil {
			return nil, err
		}
		return k.cert, nil
	}
	return cert, nil
}

func (k *keyPair) load() (*tls.Certificate, error) {
	var stamps [2]fileStamp
	for i, path := range []string{k.certFile, k.keyFile} {
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("http.tls: %w", err)
		}
		stamps[i] = stampOf(fi)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cert != nil && stamps == k.stamps {
		return k.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		err = fmt.Errorf("http.tls.certFile %s, keyFile %s: %w", k.certFile, k.keyFile, err)
		if k.cert != nil {
			k.log.Error("API certificate unusable; serving the one loaded before", "err", err)
		}
		k.stamps = stamps // report a bad version once
		return nil, err
	}
	if k.cert != nil {
		k.log.Info("API certificate reloaded", "file", k.certFile)
	}
	k.cert, k.stamps = &cert, stamps
	return k.cert, nil
}

// adminTLSConfig is the admin listener's TLS: the API's certificate (a
// rotation reaches both), and no client certificate asked for. The admin
// API knows its callers by their tokens alone, so a certificate would name
// nobody there, and asking for one makes a browser holding any client
// certificate prompt its user to pick one before the admin page opens.
func adminTLSConfig(api *tls.Config) *tls.Config {
	cfg := api.Clone()
	cfg.ClientAuth, cfg.ClientCAs = tls.NoClientCert, nil
	return cfg
}
