package client_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
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

// authServer is pkg/server with api tokens: app may use free, other bulk.
func authServer(t *testing.T) (url string, lim *limiter.Limiter) {
	t.Helper()
	lim = limitertest.New(t, limitertest.Options{
		Redis: cluster.Options{Logger: quiet},
		Tiers: []tiers.Tier{
			{Plan: "bulk", MaxConcurrentStreams: 10, SlotTTL: realTTL, HeartbeatInterval: realInterval, FailureMode: tiers.FailOpen},
			{Plan: "free", MaxConcurrentStreams: 1, SlotTTL: realTTL, HeartbeatInterval: realInterval, FailureMode: tiers.FailOpen},
		},
		Limiter: limiter.Options{Logger: quiet},
	}).Limiter
	path := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(path, []byte("app "+appToken+" free\nother "+otherToken+" bulk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	callers, err := server.LoadCallers(server.CallersOptions{TokensFile: path, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(server.New(lim, server.Options{Logger: quiet, Callers: callers}).Handler())
	t.Cleanup(srv.Close)
	return srv.URL, lim
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
