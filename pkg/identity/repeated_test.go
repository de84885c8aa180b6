package identity_test

import (
	"encoding/base64"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/identity"
)

// A header that decides the identity, sent more than once, is ambiguous
// (a hop that appends its value to the client's would let the client's
// come first), whatever the values; headers the configured source does
// not read may repeat.
func TestARepeatedIdentityHeaderIsAmbiguous(t *testing.T) {
	headers, err := identity.New(identity.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rs := newSigner(t, "rs", "RS256")
	file := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, file, jwks(rs))
	tokens := jwtResolver(t, file, nil)
	payloads, err := identity.New(identity.Options{Payload: &identity.Payload{Header: "X-Jwt-Payload"}, DefaultPlan: "free"})
	if err != nil {
		t.Fatal(err)
	}
	alice, mallory := "Bearer "+rs.sign(t, claims("alice", nil)), "Bearer "+rs.sign(t, claims("mallory", nil))
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"alice"}`))

	cases := []struct {
		name   string
		r      *identity.Resolver
		header http.Header
		named  string // "": resolves to alice
	}{
		{"the user header once", headers, http.Header{"X-User-Id": {"alice"}, "X-Plan": {"paid"}}, ""},
		{"the user header twice with the same value", headers, http.Header{"X-User-Id": {"alice", "alice"}, "X-Plan": {"paid"}}, "X-User-Id"},
		{"the user header twice with different values", headers, http.Header{"X-User-Id": {"mallory", "alice"}, "X-Plan": {"paid"}}, "X-User-Id"},
		{"the user header twice, the first blank", headers, http.Header{"X-User-Id": {"", "alice"}, "X-Plan": {"paid"}}, "X-User-Id"},
		{"the plan header twice with the same value", headers, http.Header{"X-User-Id": {"alice"}, "X-Plan": {"paid", "paid"}}, "X-Plan"},
		{"the plan header twice with different values", headers, http.Header{"X-User-Id": {"alice"}, "X-Plan": {"free", "paid"}}, "X-Plan"},
		{"Authorization twice beside trusted headers is not read", headers, http.Header{"X-User-Id": {"alice"}, "X-Plan": {"paid"}, "Authorization": {"a", "b"}}, ""},
		{"one token", tokens, http.Header{"Authorization": {alice}}, ""},
		{"the same token twice", tokens, http.Header{"Authorization": {alice, alice}}, "Authorization"},
		{"two tokens", tokens, http.Header{"Authorization": {mallory, alice}}, "Authorization"},
		{"the user header twice beside a token is not read", tokens, http.Header{"Authorization": {alice}, "X-User-Id": {"a", "b"}}, ""},
		{"one payload", payloads, http.Header{"X-Jwt-Payload": {payload}}, ""},
		{"the payload header twice", payloads, http.Header{"X-Jwt-Payload": {payload, payload}}, "X-Jwt-Payload"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.r.Resolve(tc.header)
			if tc.named == "" {
				if err != nil || got.UserID != "alice" {
					t.Fatalf("Resolve = %+v, %v; want alice", got, err)
				}
				return
			}
			if !errors.Is(err, identity.ErrAmbiguous) || errors.Is(err, identity.ErrUnauthenticated) {
				t.Fatalf("Resolve = %+v, %v; want ErrAmbiguous (not ErrUnauthenticated)", got, err)
			}
			if msg := err.Error(); !strings.Contains(msg, "header "+tc.named) || !strings.Contains(msg, "more than once") {
				t.Errorf("error %q, want it to name header %s and say it came more than once", msg, tc.named)
			}
		})
	}
}
