package proxy_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/proxy"
)

// An identity header that comes more than once (a hop in front appended
// its value to the client's instead of replacing it) is refused with 400
// ambiguous_identity naming the header, before any slot and before the
// upstream; once, it is used.
func TestARepeatedIdentityHeaderIsRefused(t *testing.T) {
	up := newSSE()
	e := newEnv(t, up, envOptions{})
	user := newUser()
	cases := []struct {
		name   string
		header http.Header
		named  string
	}{
		{"the user header twice with the same value", http.Header{"X-User-Id": {user, user}, "X-Plan": {"one"}}, "X-User-Id"},
		{"the user header twice with different values", http.Header{"X-User-Id": {"mallory", user}, "X-Plan": {"one"}}, "X-User-Id"},
		{"the user header three times", http.Header{"X-User-Id": {user, user, user}, "X-Plan": {"one"}}, "X-User-Id"},
		{"the plan header twice with the same value", http.Header{"X-User-Id": {user}, "X-Plan": {"one", "one"}}, "X-Plan"},
		{"the plan header twice with different values", http.Header{"X-User-Id": {user}, "X-Plan": {"three", "one"}}, "X-Plan"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := e.request(t, context.Background(), "POST", "/v1/chat/completions", "", "", strings.NewReader(`{"stream":true}`))
			for k, v := range tc.header {
				req.Header[k] = v
			}
			resp := e.do(t, req)
			if resp.StatusCode != http.StatusBadRequest {
				resp.Body.Close()
				t.Fatalf("status %d, want 400", resp.StatusCode)
			}
			body := decodeError(t, resp)
			if body.Error.Code != "ambiguous_identity" || body.Error.Type != "invalid_request_error" ||
				!strings.Contains(body.Error.Message, "header "+tc.named) || !strings.Contains(body.Error.Message, "more than once") {
				t.Errorf("body %+v, want invalid_request_error / ambiguous_identity saying header %s came more than once", body.Error, tc.named)
			}
		})
	}
	e.checkRefused(t, up, user, 0, "identity", 5)

	// Each header once: the stream is granted.
	resp := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", strings.NewReader(`{"stream":true}`)))
	defer resp.Body.Close()
	<-up.started
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("each header once: status %d, want 200", resp.StatusCode)
	}
	close(up.tokens)
}

// With identities from a verified JWT (or its payload, verified in front)
// the user and plan headers name nobody: the upstream receives the user
// and plan the limiter counted in them, never the client's own, and on a
// request that holds no slot none at all. Without a JWT they are the
// identity, and go upstream as they came.
func TestTheUpstreamReadsTheVerifiedIdentity(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	point, _ := key.PublicKey.Bytes()
	enc := base64.RawURLEncoding.EncodeToString
	set, _ := json.Marshal(map[string]any{"keys": []any{map[string]any{"kty": "EC", "kid": "k", "crv": "P-256", "x": enc(point[1:33]), "y": enc(point[33:])}}})
	if err := os.WriteFile(jwks, set, 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	claims := func(user string) jwt.MapClaims {
		return jwt.MapClaims{"iss": "iss", "aud": "aud", "sub": user, "plan": "one", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	}
	token := func(user string) http.Header {
		tok := jwt.NewWithClaims(jwt.SigningMethodES256, claims(user))
		tok.Header["kid"] = "k"
		signed, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return http.Header{"Authorization": {"Bearer " + signed}}
	}
	payload := func(user string) http.Header {
		b, _ := json.Marshal(claims(user))
		return http.Header{"X-Jwt-Payload": {enc(b)}}
	}
	plain := func(user string) http.Header { return http.Header{"X-User-Id": {user}, "X-Plan": {"one"}} }

	cases := []struct {
		name     string
		identity identity.Options
		// userHeader and planHeader are the configured names.
		userHeader, planHeader string
		credentials            func(user string) http.Header
		// verified: the upstream reads the limiter's user and plan, and
		// none on a request without a slot.
		verified bool
	}{
		{"a JWT", identity.Options{JWT: &identity.JWT{JWKSFile: jwks, Issuer: "iss", Audience: "aud", PlanClaim: "plan"}},
			"X-User-Id", "X-Plan", token, true},
		{"a JWT with headers of other names", identity.Options{UserHeader: "X-Caller", PlanHeader: "X-Tier",
			JWT: &identity.JWT{JWKSFile: jwks, Issuer: "iss", Audience: "aud", PlanClaim: "plan"}}, "X-Caller", "X-Tier", token, true},
		{"a payload verified in front", identity.Options{Payload: &identity.Payload{Header: "X-Jwt-Payload", PlanClaim: "plan"}},
			"X-User-Id", "X-Plan", payload, true},
		{"trusted headers", identity.Options{}, "X-User-Id", "X-Plan", plain, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan http.Header, 1)
			e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seen <- r.Header.Clone()
				fmt.Fprint(w, "{}")
			}), envOptions{identity: tc.identity, proxy: proxy.Options{Routes: []string{"/v1/chat/completions"}}})
			user := newUser()
			send := func(path string) http.Header {
				req := e.request(t, context.Background(), http.MethodPost, path, "", "", nil)
				for k, v := range tc.credentials(user) {
					req.Header[k] = v
				}
				if tc.verified {
					req.Header.Set(tc.userHeader, "mallory") // the client's own say
					req.Header.Set(tc.planHeader, "three")
				}
				resp := e.do(t, req)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: status %d, want 200", path, resp.StatusCode)
				}
				return <-seen
			}
			h := send("/v1/chat/completions")
			if got := h.Values(tc.userHeader); len(got) != 1 || got[0] != user {
				t.Errorf("a limited request: upstream %s %q, want [%s], the user counted", tc.userHeader, got, user)
			}
			if got := h.Values(tc.planHeader); len(got) != 1 || got[0] != "one" {
				t.Errorf("a limited request: upstream %s %q, want [one], the plan counted", tc.planHeader, got)
			}
			h = send("/v1/models")
			want := []string{user}
			if tc.verified {
				want = nil
			}
			if got := h.Values(tc.userHeader); !slices.Equal(got, want) {
				t.Errorf("a request without a slot: upstream %s %q, want %q", tc.userHeader, got, want)
			}
		})
	}
}
