package config

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
)

func TestClusterOptionsReadsThePasswordFile(t *testing.T) {
	cases := []struct {
		name    string
		content string
		want    string
		wantErr string
	}{
		{"a trailing newline is dropped", "s3cret\n", "s3cret", ""},
		{"a trailing CRLF is dropped", "s3cret\r\n", "s3cret", ""},
		{"inner and leading spaces are kept", " s3 cret\n", " s3 cret", ""},
		{"an empty file is refused", "\n", "", "redis.passwordFile: the file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "password", tc.content)
			c := Default()
			c.Redis.Addrs = []string{"r:6379"}
			c.Redis.Username = "limiter"
			c.Redis.PasswordFile = path
			opts, ok := clusterOptions(t, c, tc.wantErr)
			if !ok {
				return
			}
			if opts.ReadPassword == nil || opts.Password != "" {
				t.Fatalf("ReadPassword set = %v, Password = %q; want the file read at each connection, no fixed password", opts.ReadPassword != nil, opts.Password)
			}
			password, err := opts.ReadPassword()
			if err != nil || password != tc.want || opts.Username != "limiter" {
				t.Fatalf("ReadPassword() = %q, %v, Username = %q; want %q, nil, %q", password, err, opts.Username, tc.want, "limiter")
			}
		})
	}
}

func TestClusterOptionsCopiesRedisKeys(t *testing.T) {
	c := Default()
	c.Redis.Addrs = []string{"s1:26379", "s2:26379"}
	c.Redis.SentinelMasterSet = "mymaster"
	c.Redis.Timeout = 100 * time.Millisecond
	c.Redis.ShardsRefreshInterval = time.Second
	opts, err := c.ClusterOptions()
	if err != nil {
		t.Fatal(err)
	}
	want(t, "Addrs", opts.Addrs, c.Redis.Addrs)
	want(t, "SentinelMasterSet", opts.SentinelMasterSet, "mymaster")
	want(t, "Timeout", opts.Timeout, 100*time.Millisecond)
	want(t, "ShardsRefreshInterval", opts.ShardsRefreshInterval, time.Second)
	if opts.TLS != nil || opts.Password != "" || opts.ReadPassword != nil {
		t.Errorf("TLS, Password, ReadPassword set = %v, %q, %v; want none", opts.TLS, opts.Password, opts.ReadPassword != nil)
	}
}

func TestClusterOptionsBuildsTLS(t *testing.T) {
	caPEM, certPEM, keyPEM := testenv.Certificates(t)
	ca := writeFile(t, "ca.crt", string(caPEM))
	cert := writeFile(t, "tls.crt", string(certPEM))
	key := writeFile(t, "tls.key", string(keyPEM))
	garbage := writeFile(t, "garbage", "not pem")

	cases := []struct {
		name    string
		tls     TLS
		wantErr string
	}{
		{"a CA and a client pair make mutual TLS", TLS{Enabled: true, CAFile: ca, CertFile: cert, KeyFile: key, ServerName: "redis.test"}, ""},
		{"TLS alone uses the system roots", TLS{Enabled: true}, ""},
		{"a CA file without certificates is refused", TLS{Enabled: true, CAFile: garbage}, "redis.tls.caFile: must hold PEM certificates"},
		{"a key that is not a key is refused", TLS{Enabled: true, CertFile: cert, KeyFile: garbage}, "redis.tls.certFile: with redis.tls.keyFile must be a PEM certificate and its key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.Redis.Addrs = []string{"r:6379"}
			c.Redis.TLS = tc.tls
			opts, ok := clusterOptions(t, c, tc.wantErr)
			if !ok {
				return
			}
			if opts.TLS == nil || opts.TLS.MinVersion != tls.VersionTLS12 || opts.TLS.ServerName != tc.tls.ServerName {
				t.Fatalf("TLS = %+v, want TLS 1.2+ with server name %q", opts.TLS, tc.tls.ServerName)
			}
			if (opts.TLS.RootCAs != nil) != (tc.tls.CAFile != "") {
				t.Errorf("RootCAs set = %v, want %v", opts.TLS.RootCAs != nil, tc.tls.CAFile != "")
			}
			if tc.tls.CertFile != "" {
				pair, err := opts.TLS.GetClientCertificate(&tls.CertificateRequestInfo{})
				if err != nil || len(pair.Certificate) == 0 {
					t.Fatalf("GetClientCertificate() = %v, %v; want the pair", pair, err)
				}
			}
		})
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// clusterOptions returns c.ClusterOptions(), failing the test on an error;
// with wantErr it checks instead that they fail with an ErrInvalid saying
// wantErr, and returns false.
func clusterOptions(t *testing.T, c Config, wantErr string) (cluster.Options, bool) {
	t.Helper()
	opts, err := c.ClusterOptions()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) || !errors.Is(err, ErrInvalid) {
			t.Fatalf("ClusterOptions() = %v, want an ErrInvalid containing %q", err, wantErr)
		}
		return opts, false
	}
	if err != nil {
		t.Fatalf("ClusterOptions() = %v", err)
	}
	return opts, true
}

// TestClusterOptionsFollowARotatedPasswordFile: the password Secret the
// chart mounts is rotated and Redis requires the new password; once the
// client's connections drop, it must reconnect with the file's new
// content, without a restart.
func TestClusterOptionsFollowARotatedPasswordFile(t *testing.T) {
	srv := testenv.StartRedis(t)
	srv.SetPassword(t, "", "old-password")
	c := Default()
	c.Redis.Addrs = []string{srv.Addr()}
	c.Redis.PasswordFile = writeFile(t, "password", "old-password\n")
	opts, _ := clusterOptions(t, c, "")
	opts.Logger = slog.New(slog.DiscardHandler)
	client, err := cluster.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	redis, _ := client.Redis()
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return redis.Do(ctx, redis.B().Ping().Build()).Error()
	}
	if err := ping(); err != nil {
		t.Fatalf("PING with the first password = %v", err)
	}

	// As the kubelet does: the new content under a new name, renamed over
	// the old.
	next := writeFile(t, "password.new", "new-password\n")
	if err := os.Rename(next, c.Redis.PasswordFile); err != nil {
		t.Fatal(err)
	}
	srv.SetPassword(t, "old-password", "new-password")
	deadline := time.Now().Add(5 * time.Second)
	for err := ping(); err != nil; err = ping() {
		if time.Now().After(deadline) {
			t.Fatalf("PING after the rotation = %v for 5s; want the new password read from %s", err, c.Redis.PasswordFile)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
