package e2e

import (
	"context"
	"crypto/tls"
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

func startCallerServer(t *testing.T) *callerServer {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(tokens, []byte("# e2e callers\napp "+e2eAppToken+" paid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	config := serveConfig([]string{testenv.Redis(t)}, "e2e-callers-"+randomID()+":", incidentTiers) +
		"api:\n  tokensFile: " + tokens + "\n"
	return &callerServer{Process: servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true}), tokensFile: tokens}
}

// TestCallersAuthenticateThroughServe: with api.tokensFile, a serve process
// refuses calls without a known token, scopes the caller's plans, and
// takes a rotated token without a restart; the Go client authenticates
// with its token.
func TestCallersAuthenticateThroughServe(t *testing.T) {
	srv := startCallerServer(t)
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

// TestCallersOverMutualTLS: serve with http.tls.* serves the API over TLS
// only, and a client certificate of the client CA names a caller of
// api.tokensFile (here one with no token at all), scoped to its plans.
func TestCallersOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t)
	certFile, keyFile := ca.IssueFiles(t, dir, "server", testenv.CertSpec{CommonName: "limiter", IPs: []string{"127.0.0.1"}})
	tokens := filepath.Join(dir, "api-tokens")
	if err := os.WriteFile(tokens, []byte("app "+e2eAppToken+" paid\nedge.example - free\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	config := serveConfig([]string{testenv.Redis(t)}, "e2e-mtls-"+randomID()+":", incidentTiers) +
		"api:\n  tokensFile: " + tokens + "\n" +
		"http:\n  tls:\n    certFile: " + certFile + "\n    keyFile: " + keyFile + "\n    clientCAFile: " + ca.File(t, dir) + "\n"
	proc := servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	base := "https://" + strings.TrimPrefix(proc.API, "http://")

	ctx := context.Background()
	c, err := client.New(base, client.WithTLSConfig(ca.ClientTLS(t, testenv.CertSpec{CommonName: "edge", DNSNames: []string{"edge.example"}})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(ctx) })
	lease, err := c.Acquire(ctx, "mtls-"+randomID(), "free")
	if err != nil {
		t.Fatalf("Acquire with a client certificate: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if _, err := c.Acquire(ctx, "mtls-"+randomID(), "paid"); !errors.Is(err, client.ErrPlanNotAllowed) {
		t.Errorf("Acquire of paid as edge.example: got %v, want ErrPlanNotAllowed", err)
	}

	// A token still works over TLS, without a certificate.
	withToken, err := client.New(base, client.WithToken(e2eAppToken), client.WithTLSConfig(&tls.Config{RootCAs: ca.Pool()}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = withToken.Close(ctx) })
	if _, err := withToken.Acquire(ctx, "mtls-"+randomID(), "paid"); err != nil {
		t.Errorf("Acquire with a token over TLS: %v", err)
	}
	// Plain HTTP is not served on the API port.
	if status, _ := servetest.Get(proc.API + httpapi.PathTiers); status == http.StatusOK {
		t.Errorf("plain HTTP on the TLS API port: got 200, want it refused")
	}
	if !strings.Contains(proc.Output(), `"api":"https://`) {
		t.Errorf("serve's listening line does not name an https API:\n%s", proc.Output())
	}
}
