package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/joishi/limiter/pkg/cluster"
)

// ClusterOptions returns the options of the Redis client: it checks that
// the password file holds a password, which the client reads again at each
// new connection (so a rotated Secret is used without a restart), and
// builds the TLS configuration. Logger is left for the caller to set. Every
// error wraps ErrInvalid and never quotes the password.
func (c Config) ClusterOptions() (cluster.Options, error) {
	r := c.Redis
	opts := cluster.Options{
		Addrs:                 append([]string(nil), r.Addrs...),
		SentinelMasterSet:     r.SentinelMasterSet,
		Username:              r.Username,
		Timeout:               r.Timeout,
		ShardsRefreshInterval: r.ShardsRefreshInterval,
	}
	if path := r.PasswordFile; path != "" {
		if _, err := readPassword(path); err != nil {
			return cluster.Options{}, err
		}
		// Read at each connection, not cached: connections are few and
		// long-lived, and a cache keyed by the file's stat would cost a
		// system call of its own.
		opts.ReadPassword = func() (string, error) { return readPassword(path) }
	}
	if r.TLS.Enabled {
		tlsConfig, err := r.TLS.config()
		if err != nil {
			return cluster.Options{}, err
		}
		opts.TLS = tlsConfig
	}
	return opts, nil
}

// readPassword returns the file's content without its trailing line break.
// The error never quotes the content.
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", &KeyError{Key: "redis.passwordFile", Problem: "must name a readable file: " + err.Error(), Err: err}
	}
	password := strings.TrimRight(string(b), "\r\n")
	if password == "" {
		return "", &KeyError{Key: "redis.passwordFile", Problem: "the file " + path + " is empty (a password secret not mounted?)"}
	}
	return password, nil
}

func (t TLS) config() (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // an explicit, documented test-only switch
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &KeyError{Key: "redis.tls.caFile", Problem: "must name a readable file: " + err.Error(), Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &KeyError{Key: "redis.tls.caFile", Problem: "must hold PEM certificates; found none in " + t.CAFile}
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		// Load once now so a bad pair fails at start, then again at each
		// handshake so a rotated certificate (cert-manager) is used
		// without a restart.
		if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			return nil, &KeyError{Key: "redis.tls.certFile", Problem: "with redis.tls.keyFile must be a PEM certificate and its key: " + err.Error(), Err: err}
		}
		certFile, keyFile := t.CertFile, t.KeyFile
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			pair, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("loading the redis client certificate: %w", err)
			}
			return &pair, nil
		}
	}
	return cfg, nil
}
