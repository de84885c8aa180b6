package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// identityRefused sends a chat completion with header through the proxy
// and checks it is refused 400 ambiguous_identity naming the header.
func identityRefused(t *testing.T, e *proxyEnv, header http.Header, named string) {
	t.Helper()
	resp := e.chat(t, context.Background(), "", "", "fast", header)
	if resp.StatusCode != http.StatusBadRequest {
		resp.Body.Close()
		t.Fatalf("status %d, want 400", resp.StatusCode)
	}
	body := decodeProxyError(t, resp)
	if body.Error.Code != "ambiguous_identity" || body.Error.Type != "invalid_request_error" ||
		!strings.Contains(body.Error.Message, "header "+named) || !strings.Contains(body.Error.Message, "more than once") {
		t.Errorf("error %+v, want invalid_request_error / ambiguous_identity saying header %s came more than once", body.Error, named)
	}
}

// Through a real proxy trusting the user and plan headers: a request
// carrying either of them twice (as when a hop in front appends its value
// to the one the client sent) is refused 400 ambiguous_identity, takes no
// slot and never reaches the upstream; each once, it streams.
func TestIdentityHeadersSentTwiceAreRefusedByTheProxy(t *testing.T) {
	e := startProxy(t, "")
	user := "twice-" + randomID()
	for _, tc := range []struct {
		name   string
		header http.Header
		named  string
	}{
		{"the user header twice with the same value", http.Header{"X-User-Id": {user, user}, "X-Plan": {"free"}}, "X-User-Id"},
		{"the user header twice with different values", http.Header{"X-User-Id": {"victim-" + user, user}, "X-Plan": {"free"}}, "X-User-Id"},
		{"the plan header twice with the same value", http.Header{"X-User-Id": {user}, "X-Plan": {"free", "free"}}, "X-Plan"},
		{"the plan header twice with different values", http.Header{"X-User-Id": {user}, "X-Plan": {"paid", "free"}}, "X-Plan"},
	} {
		t.Run(tc.name, func(t *testing.T) { identityRefused(t, e, tc.header, tc.named) })
	}
	if got := e.llm.requests.Load(); got != 0 {
		t.Errorf("the upstream received %d refused requests, want none", got)
	}
	for _, u := range []string{user, "victim-" + user} {
		if n := e.used(t, u); n != 0 {
			t.Errorf("user %s holds %d slots after the refusals, want 0", u, n)
		}
	}
	resp := e.chat(t, context.Background(), user, "free", "fast", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("each header once: status %d, want 200", resp.StatusCode)
	}
}

// With a JWT, the Authorization header decides: twice, even the same
// verified token twice, is refused 400 ambiguous_identity; once, it
// streams.
func TestIdentityAuthorizationSentTwiceIsRefusedByTheProxy(t *testing.T) {
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	key := newIssuerKey(t, "k1")
	writeJWKS(t, jwks, key)
	e := startProxy(t, fmt.Sprintf("identity:\n  jwt:\n    jwksFile: %q\n    issuer: https://auth.e2e\n    audience: llm-proxy\n    planClaim: plan\n", jwks))
	user := "jwt-twice-" + randomID()
	mine, theirs := "Bearer "+key.token(t, user, "free", nil), "Bearer "+key.token(t, "victim-"+user, "paid", nil)
	t.Run("the same token twice", func(t *testing.T) {
		identityRefused(t, e, http.Header{"Authorization": {mine, mine}}, "Authorization")
	})
	t.Run("two tokens", func(t *testing.T) {
		identityRefused(t, e, http.Header{"Authorization": {theirs, mine}}, "Authorization")
	})
	if got := e.llm.requests.Load(); got != 0 {
		t.Errorf("the upstream received %d refused requests, want none", got)
	}
	resp := e.chat(t, context.Background(), "", "", "fast", http.Header{"Authorization": {mine}})
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("one token: status %d, want 200", resp.StatusCode)
	}
	e.awaitUsed(t, user, 0, 3*time.Second)
}
