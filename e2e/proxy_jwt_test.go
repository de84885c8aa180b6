package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// issuerKey is an Ed25519 signing key of the test issuer.
type issuerKey struct {
	kid  string
	priv ed25519.PrivateKey
}

func newIssuerKey(t *testing.T, kid string) issuerKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return issuerKey{kid: kid, priv: priv}
}

// token signs the claims of user on plan, edited by edit.
func (k issuerKey) token(t *testing.T, user, plan string, edit func(jwt.MapClaims)) string {
	t.Helper()
	now := time.Now()
	claims := jwt.MapClaims{"iss": "https://auth.e2e", "aud": "llm-proxy", "sub": user, "plan": plan,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	if edit != nil {
		edit(claims)
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, claims)
	tok.Header["kid"] = k.kid
	s, err := tok.SignedString(k.priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// writeJWKS publishes keys in path, as a Secret volume swaps its files.
func writeJWKS(t *testing.T, path string, keys ...issuerKey) {
	t.Helper()
	var set []map[string]string
	for _, k := range keys {
		set = append(set, map[string]string{"kty": "OKP", "crv": "Ed25519", "kid": k.kid, "use": "sig",
			"x": base64.RawURLEncoding.EncodeToString(k.priv.Public().(ed25519.PublicKey))})
	}
	b, _ := json.Marshal(map[string]any{"keys": set})
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// Through a real proxy: the SDK's API key is the user's JWT; a verified
// one streams under its plan claim, an expired one is the SDK's
// AuthenticationError, a token for another audience or signed by a key
// not published is 401, and a key rotated in the JWKS file takes over
// without a restart.
func TestProxyVerifiesJWTs(t *testing.T) {
	js := newSDK(t)
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	old, next := newIssuerKey(t, "2025-01"), newIssuerKey(t, "2025-02")
	writeJWKS(t, jwks, old)
	e := startProxy(t, fmt.Sprintf(`identity:
  jwt:
    jwksFile: %q
    issuer: https://auth.e2e
    audience: llm-proxy
    planClaim: plan
`, jwks))
	user := "jwt-" + randomID()

	t.Run("a verified token streams under its plan", func(t *testing.T) {
		chunksUntilDone(t, js.stream(t, e.proc.API, "API_KEY="+old.token(t, user, "free", nil), "MODEL=fast"), "the stream", nil)
		// The upstream got the client's Authorization (passAuthorization
		// defaults to true) and the stream id.
		h := e.llm.Headers()
		if last := h[len(h)-1]; last.Get("Authorization") == "" || last.Get("X-Limiter-Stream-Id") == "" {
			t.Errorf("upstream headers %v, want Authorization and X-Limiter-Stream-Id", last)
		}
	})
	t.Run("an expired token is the SDK's AuthenticationError", func(t *testing.T) {
		expired := old.token(t, user, "free", func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() })
		ev := event(t, js.stream(t, e.proc.API, "API_KEY="+expired, "MODEL=fast"), 10*time.Second, "the answer")
		if ev.Event != "error" || ev.Name != "AuthenticationError" || ev.Status == nil || *ev.Status != 401 || ev.Code != "unauthenticated" {
			t.Errorf("%+v, want AuthenticationError 401 unauthenticated", ev)
		}
	})

	bearer := func(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }
	status := func(token string) int {
		resp := e.chat(t, context.Background(), "", "", "fast", bearer(token))
		if resp.StatusCode != http.StatusOK {
			decodeProxyError(t, resp)
		} else {
			resp.Body.Close()
		}
		return resp.StatusCode
	}
	for name, token := range map[string]string{
		"wrong audience":  old.token(t, user, "free", func(c jwt.MapClaims) { c["aud"] = "another-service" }),
		"unpublished key": next.token(t, user, "free", nil),
		"alg none": func() string {
			s, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"iss": "https://auth.e2e", "aud": "llm-proxy", "sub": user,
				"exp": time.Now().Add(time.Hour).Unix()}).SignedString(jwt.UnsafeAllowNoneSignatureType)
			return s
		}(),
	} {
		if got := status(token); got != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, got)
		}
	}
	if n := e.used(t, user); n != 0 {
		t.Errorf("%d slots held after refused tokens, want 0", n)
	}

	t.Run("a key rotated in the JWKS file takes over", func(t *testing.T) {
		writeJWKS(t, jwks, next)
		eventually(t, 5*time.Second, "the new key's token accepted", func() bool { return status(next.token(t, user, "free", nil)) == http.StatusOK })
		if got := status(old.token(t, user, "free", nil)); got != http.StatusUnauthorized {
			t.Errorf("the removed key's token: status %d, want 401", got)
		}
	})
}
