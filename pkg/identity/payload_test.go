package identity_test

import (
	"encoding/base64"
	"errors"
	"net/http"
	"reflect"
	"testing"

	"github.com/joishi/limiter/pkg/identity"
)

func payloadHeader(raw string) http.Header {
	h := http.Header{}
	h.Set("X-Jwt-Payload", raw)
	return h
}

func TestPayloadHeader(t *testing.T) {
	r, err := identity.New(identity.Options{Payload: &identity.Payload{Header: "x-jwt-payload", PlanClaim: "org.plan"}, DefaultPlan: "free"})
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	for _, tt := range []struct {
		name    string
		headers http.Header
		want    identity.Identity
		wantErr error
	}{
		{name: "user and nested plan", headers: payloadHeader(enc([]byte(`{"sub":"u-1","org":{"plan":"paid"}}`))),
			want: identity.Identity{UserID: "u-1", Plan: "paid", Source: identity.SourcePayload}},
		{name: "padded base64url, default plan", headers: payloadHeader(base64.URLEncoding.EncodeToString([]byte(`{"sub":"u-2"}`))),
			want: identity.Identity{UserID: "u-2", Plan: "free", Source: identity.SourcePayload}},
		{name: "user and plan headers are not trusted", headers: http.Header{"X-User-Id": {"u-3"}, "X-Plan": {"paid"}}, wantErr: identity.ErrMissing},
		{name: "not base64", headers: payloadHeader("{not base64}"), wantErr: identity.ErrInvalidToken},
		{name: "not a JSON object", headers: payloadHeader(enc([]byte(`["sub"]`))), wantErr: identity.ErrInvalidToken},
		{name: "no user claim", headers: payloadHeader(enc([]byte(`{"plan":"paid"}`))), wantErr: identity.ErrInvalidToken},
		{name: "a no-break space after the user is kept", headers: payloadHeader(enc([]byte(`{"sub":"u-1\u00a0","org":{"plan":"paid"}}`))),
			want: identity.Identity{UserID: "u-1\u00a0", Plan: "paid", Source: identity.SourcePayload}},
		{name: "plan not a string", headers: payloadHeader(enc([]byte(`{"sub":"u","org":{"plan":3}}`))), wantErr: identity.ErrInvalidToken},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Resolve(tt.headers)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !errors.Is(err, identity.ErrUnauthenticated) {
					t.Fatalf("Resolve: got %+v, %v; want %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Resolve: got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestFromClaims(t *testing.T) {
	r, err := identity.New(identity.Options{Payload: &identity.Payload{UserClaim: "uid", PlanClaim: "plan"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.FromClaims(map[string]any{"uid": " u-9 ", "plan": "paid"}, nil)
	if want := (identity.Identity{UserID: "u-9", Plan: "paid", Source: identity.SourcePayload}); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("FromClaims: got %+v, %v; want %+v", got, err, want)
	}
	// Only spaces and tabs are trimmed: other whitespace is kept, for the
	// limiter to refuse, not made into another user's id or plan.
	got, err = r.FromClaims(map[string]any{"uid": "\u3000u-9", "plan": "paid\u00a0"}, nil)
	if want := (identity.Identity{UserID: "\u3000u-9", Plan: "paid\u00a0", Source: identity.SourcePayload}); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("FromClaims with Unicode spaces: got %+v, %v; want %+v", got, err, want)
	}
	if _, err := r.FromClaims(map[string]any{"uid": "u-9"}, nil); !errors.Is(err, identity.ErrNoPlan) {
		t.Errorf("FromClaims without a plan and no default: got %v, want ErrNoPlan", err)
	}
	// With no header configured, Resolve has nothing to read.
	if _, err := r.Resolve(http.Header{"X-User-Id": {"u"}}); !errors.Is(err, identity.ErrMissing) {
		t.Errorf("Resolve with a metadata-only payload: got %v, want ErrMissing", err)
	}
	headers, err := identity.New(identity.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := headers.FromClaims(map[string]any{"sub": "u"}, nil); err == nil {
		t.Error("FromClaims without Options.Payload: got no error")
	}
}

func TestPayloadAndJWTAreExclusive(t *testing.T) {
	_, err := identity.New(identity.Options{Payload: &identity.Payload{Header: "x-jwt-payload"},
		JWT: &identity.JWT{JWKSURL: "https://issuer.test/jwks", Issuer: issuer, Audience: audience}})
	if err == nil {
		t.Error("New with both a JWT and a payload: got no error")
	}
}
