package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

const (
	appToken   = "app-token-0123456789abcdef"
	otherToken = "other-token-0123456789abcdef"
)

// authServer is pkg/server with api tokens: app may use free, other bulk,
// and edge.example (a client certificate) free.
func authServer(t *testing.T) (url string, lim *limiter.Limiter) {
	t.Helper()
	lim, callers := authLimiter(t)
	srv := httptest.NewServer(server.New(lim, server.Options{Logger: quiet, Callers: callers}).Handler())
	t.Cleanup(srv.Close)
	return srv.URL, lim
}

func authLimiter(t *testing.T) (*limiter.Limiter, *server.Callers) {
	t.Helper()
	lim := limitertest.New(t, limitertest.Options{
		Redis: cluster.Options{Logger: quiet},
		Tiers: []tiers.Tier{
			{Plan: "bulk", MaxConcurrentStreams: 10, SlotTTL: realTTL, HeartbeatInterval: realInterval, FailureMode: tiers.FailOpen},
			{Plan: "free", MaxConcurrentStreams: 1, SlotTTL: realTTL, HeartbeatInterval: realInterval, FailureMode: tiers.FailOpen},
		},
		Limiter: limiter.Options{Logger: quiet},
	}).Limiter
	path := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(path, []byte("app "+appToken+" free\nother "+otherToken+" bulk\nedge.example - free\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	callers, err := server.LoadCallers(server.CallersOptions{TokensFile: path, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return lim, callers
}

// The client sends its token on every call: acquire, the heartbeat batches
// that keep the lease past its TTL, and release.
func TestClientAuthenticates(t *testing.T) {
	url, lim := authServer(t)
	ctx := context.Background()
	used := func(user string) int {
		t.Helper()
		got, err := lim.Slots(ctx, user)
		if err != nil {
			t.Fatal(err)
		}
		return got.Used
	}

	t.Run("with WithToken, a lease is held past its TTL and released", func(t *testing.T) {
		c := newClient(t, url, client.WithToken(appToken))
		lease, err := c.Acquire(ctx, "auth-user-1", "free")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		time.Sleep(realTTL + realInterval)
		select {
		case <-lease.Lost():
			t.Fatalf("lease lost: %v", lease.Err())
		default:
		}
		if got := used("auth-user-1"); got != 1 {
			t.Fatalf("slots after a TTL of heartbeats: got %d, want 1", got)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if got := used("auth-user-1"); got != 0 {
			t.Errorf("slots after Release: got %d, want 0", got)
		}
	})
	t.Run("without a token, Acquire is ErrUnauthenticated", func(t *testing.T) {
		c := newClient(t, url)
		_, err := c.Acquire(ctx, "auth-user-2", "free")
		var e *client.Error
		if !errors.Is(err, client.ErrUnauthenticated) || !errors.As(err, &e) || e.Status != 401 {
			t.Errorf("Acquire: got %v, want a 401 matching ErrUnauthenticated", err)
		}
	})
	t.Run("a plan outside the caller's is ErrPlanNotAllowed, and takes no slot", func(t *testing.T) {
		c := newClient(t, url, client.WithToken(appToken))
		_, err := c.Acquire(ctx, "auth-user-3", "bulk")
		if !errors.Is(err, client.ErrPlanNotAllowed) || client.IsLimited(err) {
			t.Errorf("Acquire: got %v, want ErrPlanNotAllowed (and not a limit)", err)
		}
		if got := used("auth-user-3"); got != 0 {
			t.Errorf("slots: got %d, want 0", got)
		}
	})
	t.Run("LIMITER_TOKEN is the default token", func(t *testing.T) {
		t.Setenv(client.EnvToken, otherToken)
		c := newClient(t, url)
		lease, err := c.Acquire(ctx, "auth-user-4", "bulk")
		if err != nil {
			t.Fatalf("Acquire with LIMITER_TOKEN: %v", err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		// WithToken wins over the environment.
		c = newClient(t, url, client.WithToken(appToken))
		if _, err := c.Acquire(ctx, "auth-user-4", "bulk"); !errors.Is(err, client.ErrPlanNotAllowed) {
			t.Errorf("Acquire of bulk as app with LIMITER_TOKEN set to other's: got %v, want ErrPlanNotAllowed", err)
		}
	})
	t.Run("an empty WithToken is refused", func(t *testing.T) {
		if _, err := client.New(url, client.WithToken(" ")); err == nil {
			t.Errorf("New with WithToken(\" \"): got no error, want one")
		}
	})
}

// Over mutual TLS, the client's certificate (WithTLSConfig) names the
// caller: no token is needed.
func TestClientAuthenticatesWithACertificate(t *testing.T) {
	lim, callers := authLimiter(t)
	dir := t.TempDir()
	ca := testenv.NewCA(t)
	certFile, keyFile := ca.IssueFiles(t, dir, "server", testenv.CertSpec{CommonName: "limiter", IPs: []string{"127.0.0.1"}})
	api, ops := testenv.FreeAddr(t), testenv.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	srv := server.New(lim, server.Options{Logger: quiet, Callers: callers})
	go func() {
		done <- srv.Run(ctx, server.Listeners{API: api, Ops: ops, TLS: server.TLSFiles{CertFile: certFile, KeyFile: keyFile, ClientCAFile: ca.File(t, dir)}}, time.Second)
	}()
	t.Cleanup(func() { cancel(); <-done })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if conn, err := net.Dial("tcp", api); err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the TLS listener does not accept connections within 10s")
		}
	}

	c := newClient(t, "https://"+api, client.WithTLSConfig(ca.ClientTLS(t, testenv.CertSpec{CommonName: "edge", DNSNames: []string{"edge.example"}})))
	lease, err := c.Acquire(context.Background(), "cert-user", "free")
	if err != nil {
		t.Fatalf("Acquire with a client certificate: %v", err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := c.Acquire(context.Background(), "cert-user", "bulk"); !errors.Is(err, client.ErrPlanNotAllowed) {
		t.Errorf("Acquire of bulk as edge.example: got %v, want ErrPlanNotAllowed", err)
	}

	noCert := newClient(t, "https://"+api, client.WithTLSConfig(&tls.Config{RootCAs: ca.Pool()}))
	if _, err := noCert.Acquire(context.Background(), "cert-user", "free"); !errors.Is(err, client.ErrUnauthenticated) {
		t.Errorf("Acquire over TLS without a certificate or token: got %v, want ErrUnauthenticated", err)
	}
	if _, err := client.New("https://"+api, client.WithTLSConfig(&tls.Config{}), client.WithHTTPClient(&http.Client{})); err == nil {
		t.Errorf("New with WithTLSConfig and WithHTTPClient: got no error, want one")
	}
}
