package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// grants checks that c reaches a Redis that runs the acquire script.
func grants(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	redis := connected(t, c)
	key, _ := keys.Schema{}.UserKey("connect-test")
	got, err := lua.Acquire(ctx, redis, key, keys.NewStreamID(), 3, time.Minute, lua.Record{}, false)
	if err != nil || !got.Granted {
		t.Fatalf("acquire = %+v, %v; want granted", got, err)
	}
}

// connected waits up to 10s for c to connect and returns its client.
func connected(t *testing.T, c *Client) rueidis.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	redis, err := c.Redis()
	if err != nil {
		t.Fatal(err)
	}
	return redis
}

// newClient is New(opts), closed when the test ends.
func newClient(t *testing.T, opts Options) *Client {
	t.Helper()
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// connectsWithin reports whether c connects within d.
func connectsWithin(c *Client, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return c.WaitConnected(ctx) == nil
}

func rawClient(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestConnectWithACLUser(t *testing.T) {
	srv := testenv.StartRedis(t)
	admin := rawClient(t, srv.Addr())
	if err := admin.Do(context.Background(), admin.B().Arbitrary("ACL", "SETUSER", "limiter", "on", ">s3cret-pass", "~joishi:streams:*", "+@all").Build()).Error(); err != nil {
		t.Fatal(err)
	}

	t.Run("the right password connects", func(t *testing.T) {
		grants(t, newClient(t, Options{Addrs: []string{srv.Addr()}, Username: "limiter", Password: "s3cret-pass"}))
	})
	t.Run("a wrong password never connects", func(t *testing.T) {
		if connectsWithin(newClient(t, Options{Addrs: []string{srv.Addr()}, Username: "limiter", Password: "wrong"}), time.Second) {
			t.Fatal("connected with a wrong password")
		}
	})
}

func TestConnectThroughSentinel(t *testing.T) {
	master := testenv.StartRedis(t)
	_, masterPort, _ := net.SplitHostPort(master.Addr())
	sentinel := testenv.FreeAddr(t)
	_, sentinelPort, _ := net.SplitHostPort(sentinel)

	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %s\nbind 127.0.0.1\ndir %s\nsentinel monitor limiter-master 127.0.0.1 %s 1\nsentinel down-after-milliseconds limiter-master 1000\n", sentinelPort, dir, masterPort)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	startServer(t, sentinel, conf, "--sentinel")

	c := newClient(t, Options{Addrs: []string{sentinel}, SentinelMasterSet: "limiter-master"})
	grants(t, c)
	redis, _ := c.Redis()
	if mode := redis.Mode(); mode != rueidis.ClientModeSentinel {
		t.Errorf("client mode = %s, want sentinel", mode)
	}
}

// startServer runs redis-server with args until the test ends and waits
// until addr accepts connections.
func startServer(t *testing.T, addr string, args ...string) {
	t.Helper()
	var logs testenv.Buffer
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server %v: %v", args, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("redis-server %v:\n%s", args, logs.String())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if conn, err := net.Dial("tcp", addr); err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server %v did not listen on %s within 10s", args, addr)
		}
	}
}

func TestConnectOverTLS(t *testing.T) {
	testenv.StartRedis(t) // fails, or skips when not required, without redis-server
	dir := t.TempDir()
	caPEM, certPEM, keyPEM := testenv.Certificates(t)
	for name, data := range map[string][]byte{"ca.crt": caPEM, "tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := testenv.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	startServer(t, addr, "--port", "0", "--tls-port", port, "--bind", "127.0.0.1", "--save", "", "--dir", dir,
		"--tls-cert-file", filepath.Join(dir, "tls.crt"), "--tls-key-file", filepath.Join(dir, "tls.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.crt"), "--tls-auth-clients", "no")

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	t.Run("a trusted certificate connects", func(t *testing.T) {
		grants(t, newClient(t, Options{Addrs: []string{addr}, TLS: &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}}))
	})
	t.Run("an untrusted certificate never connects", func(t *testing.T) {
		if connectsWithin(newClient(t, Options{Addrs: []string{addr}, TLS: &tls.Config{RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12}}), time.Second) {
			t.Fatal("connected to a server whose certificate no trusted CA signed")
		}
	})
}
