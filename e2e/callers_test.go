package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
)

const (
	e2eAppToken     = "e2e-app-token-0123456789"
	e2eRotatedToken = "e2e-rotated-token-0123456789"
)

// callerServer is a `limiter serve` process with api.tokensFile set: app
// may use the paid plan only.
type callerServer struct {
	*servetest.Process
	tokensFile string
}

func startCallerServer(t *testing.T, extraConfig string) *callerServer {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(tokens, []byte("# e2e callers\napp "+e2eAppToken+" paid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	config := serveConfig([]string{testenv.Redis(t)}, "e2e-callers-"+randomID()+":", incidentTiers) +
		"api:\n  tokensFile: " + tokens + "\n" + extraConfig
	return &callerServer{Process: servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true}), tokensFile: tokens}
}

// TestCallersAuthenticateThroughServe: with api.tokensFile, a serve process
// refuses calls without a known token, scopes the caller's plans, and
// takes a rotated token without a restart; the Go client authenticates
// with its token.
func TestCallersAuthenticateThroughServe(t *testing.T) {
	srv := startCallerServer(t, "")
	ctx := context.Background()
	user := "callers-" + randomID()

	c, err := client.New(srv.API, client.WithToken(e2eAppToken))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(ctx) })
	lease, err := c.Acquire(ctx, user, "paid")
	if err != nil {
		t.Fatalf("Acquire as app: %v", err)
	}
	if _, err := c.Acquire(ctx, user, "free"); !errors.Is(err, client.ErrPlanNotAllowed) {
		t.Errorf("Acquire of free as app: got %v, want ErrPlanNotAllowed", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}

	anonymous, err := client.New(srv.API)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = anonymous.Close(ctx) })
	if _, err := anonymous.Acquire(ctx, user, "paid"); !errors.Is(err, client.ErrUnauthenticated) {
		t.Errorf("Acquire without a token: got %v, want ErrUnauthenticated", err)
	}
	status, header, _ := call(t, httpClient, "GET", srv.API+httpapi.PathTiers, nil, nil)
	if status != http.StatusUnauthorized || !strings.HasPrefix(header.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("GET /v1/tiers without a token: got %d, WWW-Authenticate %q, want 401 with a Bearer challenge", status, header.Get("WWW-Authenticate"))
	}

	// Rotation: the file is rewritten (as a Secret update swaps it).
	tmp := srv.tokensFile + ".new"
	if err := os.WriteFile(tmp, []byte("app "+e2eRotatedToken+" paid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, srv.tokensFile); err != nil {
		t.Fatal(err)
	}
	rotated := &http.Client{Timeout: 10 * time.Second, Transport: bearer(e2eRotatedToken)}
	old := &http.Client{Timeout: 10 * time.Second, Transport: bearer(e2eAppToken)}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if status, _, _ := call(t, rotated, "GET", srv.API+httpapi.PathTiers, nil, nil); status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rotated token is not accepted 10s after the rewrite\n%s", srv.Output())
		}
	}
	if status, _, _ := call(t, old, "GET", srv.API+httpapi.PathTiers, nil, nil); status != http.StatusUnauthorized {
		t.Errorf("the old token after the rotation: got %d, want 401", status)
	}
	for _, token := range []string{e2eAppToken, e2eRotatedToken} {
		if strings.Contains(srv.Output(), token) {
			t.Errorf("serve's log holds a token")
		}
	}
}
