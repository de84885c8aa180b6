package identity_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
	"github.com/joishi/limiter/pkg/identity"
)

func TestParsePoolSource(t *testing.T) {
	good := []struct{ pool, spec, kind, name string }{
		{"model", "body:model", identity.PoolFromBody, "model"},
		{"org", "header:X-Org", identity.PoolFromHeader, "X-Org"},
		{"org", "claim:org.id", identity.PoolFromClaim, "org.id"},
		{"region", "value:eu-west/1", identity.PoolFromValue, "eu-west/1"},
		{"model", "header:x-ai-eg-model", identity.PoolFromHeader, "x-ai-eg-model"},
	}
	for _, tc := range good {
		s, err := identity.ParsePoolSource(tc.pool, tc.spec)
		if err != nil || s.Pool != tc.pool || s.Kind != tc.kind || s.Name != tc.name || s.String() != tc.spec {
			t.Errorf("ParsePoolSource(%q, %q) = %+v, %v; want kind %s name %s", tc.pool, tc.spec, s, err, tc.kind, tc.name)
		}
	}
	bad := []struct{ pool, spec, want string }{
		{"model", "model", "want header:NAME"},
		{"model", "body:", "want header:NAME"},
		{"model", "query:model", `unknown kind "query"`},
		{"model", "Body:model", `unknown kind "Body"`},
		{"org", "header:X Org", "not an HTTP header name"},
		{"org", "claim:org..id", "not a claim path"},
		{"org", "claim:.org", "not a claim path"},
		{"region", "value:eu west", "invalid pool key"},
		{"model", `body:mo"del`, "not a plain JSON field name"},
		{"Model", "body:model", "invalid pool name"},
	}
	for _, tc := range bad {
		if _, err := identity.ParsePoolSource(tc.pool, tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePoolSource(%q, %q) = %v; want an error saying %q", tc.pool, tc.spec, err, tc.want)
		}
	}
	if _, err := identity.ParsePoolSources(map[string]string{"model": "body:model", "org": "nope", "x": "query:y"}); err == nil ||
		!strings.Contains(err.Error(), "pool org") || !strings.Contains(err.Error(), "pool x") {
		t.Errorf("ParsePoolSources with two bad sources = %v; want both named", err)
	}
}

func poolResolver(t *testing.T, specs map[string]string) *identity.Resolver {
	t.Helper()
	sources, err := identity.ParsePoolSources(specs)
	if err != nil {
		t.Fatal(err)
	}
	r, err := identity.New(identity.Options{Pools: sources})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestPoolKeysFromHeadersAndValues(t *testing.T) {
	r := poolResolver(t, map[string]string{"org": "header:X-Org", "region": "value:eu", "model": "body:model"})
	id, err := r.Resolve(http.Header{"X-User-Id": {"u"}, "X-Plan": {"paid"}, "X-Org": {" acme "}})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"org": "acme", "region": "eu"}; !reflect.DeepEqual(id.Pools, want) {
		t.Errorf("Pools = %v; want %v (the body source is BodyPools')", id.Pools, want)
	}
	if !r.ReadsBody() {
		t.Error("ReadsBody = false with a body source")
	}

	// No header: no key of that pool.
	id, err = r.Resolve(http.Header{"X-User-Id": {"u"}, "X-Plan": {"paid"}})
	if err != nil || !reflect.DeepEqual(id.Pools, map[string]string{"region": "eu"}) {
		t.Errorf("without X-Org: %v, %v; want only region", id.Pools, err)
	}
	// Sent empty, or blank: no key, which is not the header absent. Taken
	// as absent, it would let the request past the pool's cap; refused as
	// the body's empty field is, naming the pool, the source and the bound.
	for _, v := range []string{"", " ", "\t ", "  "} {
		_, err = r.Resolve(http.Header{"X-User-Id": {"u"}, "X-Plan": {"paid"}, "X-Org": {v}})
		if !errors.Is(err, identity.ErrInvalidPoolValue) || !strings.Contains(err.Error(), "pool org (from header:X-Org): the header is empty") ||
			!strings.Contains(err.Error(), "1-128 bytes") {
			t.Errorf("X-Org %q: %v; want ErrInvalidPoolValue naming the pool, the source and the 1-128 bytes bound", v, err)
			continue
		}
		if ref := identity.Refusal(err); ref.Status != http.StatusBadRequest || ref.Error.Code != "invalid_pool_key" {
			t.Errorf("X-Org %q, its refusal: %d %s; want 400 invalid_pool_key", v, ref.Status, ref.Error.Code)
		}
	}
	// Twice, in any spelling: which one the hop in front meant cannot be told.
	_, err = r.Resolve(http.Header{"X-User-Id": {"u"}, "X-Plan": {"paid"}, "X-Org": {"acme", "other"}})
	if !errors.Is(err, identity.ErrAmbiguous) || identity.Refusal(err).Status != http.StatusBadRequest {
		t.Errorf("X-Org twice: %v; want ErrAmbiguous, 400", err)
	}
	// A value outside the key charset: 400 invalid_pool_key, naming the pool.
	_, err = r.Resolve(http.Header{"X-User-Id": {"u"}, "X-Plan": {"paid"}, "X-Org": {"a{b}"}})
	if !errors.Is(err, identity.ErrInvalidPoolValue) || !strings.Contains(err.Error(), "pool org (from header:X-Org)") {
		t.Errorf("X-Org a{b}: %v; want ErrInvalidPoolValue naming the pool and source", err)
	}
	if ref := identity.Refusal(err); ref.Status != http.StatusBadRequest || ref.Error.Code != "invalid_pool_key" {
		t.Errorf("its refusal: %d %s; want 400 invalid_pool_key", ref.Status, ref.Error.Code)
	}
	// Whitespace other than spaces and tabs is kept, and refused: not
	// another key's.
	_, err = r.Resolve(http.Header{"X-User-Id": {"u"}, "X-Plan": {"paid"}, "X-Org": {"acme\u00a0"}})
	if !errors.Is(err, identity.ErrInvalidPoolValue) {
		t.Errorf("X-Org acme followed by U+00A0: %v; want ErrInvalidPoolValue", err)
	}

	plain := poolResolver(t, map[string]string{"org": "header:X-Org"})
	if plain.ReadsBody() {
		t.Error("ReadsBody = true with no body source: the proxy would buffer for nothing")
	}
}

// A pool keyed by header:Host takes one key per host, however spelt: the
// name's case, a trailing dot and the scheme's default port are not the
// host's.
func TestHostPoolKeyIsCanonical(t *testing.T) {
	r := poolResolver(t, map[string]string{"site": "header:Host"})
	for _, tc := range []struct{ host, scheme, want string }{
		{"acme.example.com", "https", "acme.example.com"},
		{"ACME.Example.COM", "https", "acme.example.com"},
		{"acme.example.com.", "https", "acme.example.com"},
		{"acme.example.com:443", "https", "acme.example.com"},
		{"Acme.Example.com.:443", "HTTPS", "acme.example.com"},
		{"acme.example.com:", "https", "acme.example.com"},
		{"acme.example.com:80", "http", "acme.example.com"},
		{"acme.example.com:80", "https", "acme.example.com:80"},
		{"acme.example.com:443", "http", "acme.example.com:443"},
		{"acme.example.com:8443", "https", "acme.example.com:8443"},
		{"acme.example.com:443", "", "acme.example.com:443"},
		{"10.0.0.1:443", "https", "10.0.0.1"},
		{"acme.example.com:0443", "https", "acme.example.com"},
		{"acme.example.com:00080", "http", "acme.example.com"},
		{"acme.example.com:08443", "https", "acme.example.com:8443"},
	} {
		h := http.Header{"X-User-Id": {"u"}, "X-Plan": {"paid"}, "Host": {tc.host}}
		if tc.scheme != "" {
			h[":scheme"] = []string{tc.scheme}
		}
		id, err := r.Resolve(h)
		if err != nil || id.Pools["site"] != tc.want {
			t.Errorf("Host %q over %q: key %q, %v; want %q", tc.host, tc.scheme, id.Pools["site"], err, tc.want)
		}
	}
	// A Host with no name left once canonical is no host's key: refused,
	// not let in uncapped by joining none.
	for _, tc := range []struct{ host, scheme string }{{"", "https"}, {" ", "http"}, {".", "https"}, {":443", "https"}, {":80", "http"}, {":", "https"}, {".:443", "https"}, {":8080", "https"}} {
		_, err := r.Resolve(http.Header{"X-User-Id": {"u"}, "X-Plan": {"paid"}, "Host": {tc.host}, ":scheme": {tc.scheme}})
		if !errors.Is(err, identity.ErrInvalidPoolValue) {
			t.Errorf("Host %q over %s: %v; want ErrInvalidPoolValue", tc.host, tc.scheme, err)
		}
	}
	// The Kelvin sign folds to k in Unicode: it stays, and is refused.
	if _, err := r.Resolve(http.Header{"X-User-Id": {"u"}, "X-Plan": {"paid"}, "Host": {"\u212aey.example.com"}}); !errors.Is(err, identity.ErrInvalidPoolValue) {
		t.Errorf("Host with a Kelvin sign: %v; want ErrInvalidPoolValue", err)
	}
	// An IPv6 literal's brackets are outside the key charset: refused,
	// naming the pool, its default port dropped first.
	_, err := r.Resolve(http.Header{"X-User-Id": {"u"}, "X-Plan": {"paid"}, "Host": {"[2001:DB8::1]:443"}, ":scheme": {"https"}})
	if !errors.Is(err, identity.ErrInvalidPoolValue) || !strings.Contains(err.Error(), `"[2001:db8::1]"`) {
		t.Errorf("Host [2001:DB8::1]:443: %v; want ErrInvalidPoolValue naming [2001:db8::1]", err)
	}
}

func TestPoolKeysFromClaims(t *testing.T) {
	if _, err := identity.New(identity.Options{Pools: identity.PoolSources{{Pool: "org", Kind: identity.PoolFromClaim, Name: "org"}}}); err == nil {
		t.Error("a claim source with identities from headers: accepted; want an error (there are no claims)")
	}

	dir := t.TempDir()
	s := newSigner(t, "k1", "ES256")
	file := filepath.Join(dir, "jwks.json")
	writeFile(t, file, jwks(s))
	sources, err := identity.ParsePoolSources(map[string]string{"org": "claim:org.id", "team": "claim:team"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := identity.New(identity.Options{Pools: sources, JWT: &identity.JWT{JWKSFile: file, Issuer: issuer, Audience: audience, PlanClaim: "plan"}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		edit    func(jwt.MapClaims)
		want    map[string]string
		wantErr error
	}{
		{"string and number", func(c jwt.MapClaims) { c["org"] = map[string]any{"id": "acme"}; c["team"] = 42 },
			map[string]string{"org": "acme", "team": "42"}, nil},
		{"absent", nil, nil, nil},
		{"spaces around a string are trimmed", func(c jwt.MapClaims) { c["team"] = " blue\t" }, map[string]string{"team": "blue"}, nil},
		// Other whitespace is kept, and refused: not another key's.
		{"a no-break space after a string", func(c jwt.MapClaims) { c["team"] = "blue\u00a0" }, nil, identity.ErrInvalidPoolValue},
		{"null", func(c jwt.MapClaims) { c["team"] = nil }, nil, nil},
		// An empty or blank string is no key, not the claim absent:
		// taken as absent, the request would run past the pool's cap.
		{"an empty string", func(c jwt.MapClaims) { c["team"] = "" }, nil, identity.ErrInvalidPoolValue},
		{"a blank string", func(c jwt.MapClaims) { c["team"] = " \t" }, nil, identity.ErrInvalidPoolValue},
		{"an empty string in an object", func(c jwt.MapClaims) { c["org"] = map[string]any{"id": ""} }, nil, identity.ErrInvalidPoolValue},
		{"an integer past 2^53 keeps its digits", func(c jwt.MapClaims) { c["team"] = int64(1234567890123456789) },
			map[string]string{"team": "1234567890123456789"}, nil},
		{"and one a float64 rounds alike is another key", func(c jwt.MapClaims) { c["team"] = int64(1234567890123456700) },
			map[string]string{"team": "1234567890123456700"}, nil},
		{"a negative integer", func(c jwt.MapClaims) { c["team"] = -7 }, map[string]string{"team": "-7"}, nil},
		{"a fraction", func(c jwt.MapClaims) { c["team"] = 4.5 }, map[string]string{"team": "4.5"}, nil},
		{"an object", func(c jwt.MapClaims) { c["team"] = map[string]any{"a": 1} }, nil, identity.ErrInvalidPoolValue},
		{"a boolean", func(c jwt.MapClaims) { c["team"] = true }, nil, identity.ErrInvalidPoolValue},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id, err := r.Resolve(bearer(s.sign(t, claims("u", tc.edit))))
			if !errors.Is(err, tc.wantErr) || (err == nil && !reflect.DeepEqual(id.Pools, tc.want)) {
				t.Errorf("Resolve = %v, %v; want %v, %v", id.Pools, err, tc.want, tc.wantErr)
			}
		})
	}

	// A payload verified in front: the claims and the headers.
	psources, _ := identity.ParsePoolSources(map[string]string{"org": "claim:org", "model": "header:x-ai-eg-model"})
	pr, err := identity.New(identity.Options{Pools: psources, Payload: &identity.Payload{}, DefaultPlan: "paid"})
	if err != nil {
		t.Fatal(err)
	}
	id, err := pr.FromClaims(map[string]any{"sub": "u", "org": "acme"}, http.Header{"X-Ai-Eg-Model": {"gpt-4o"}})
	if want := map[string]string{"org": "acme", "model": "gpt-4o"}; err != nil || !reflect.DeepEqual(id.Pools, want) {
		t.Errorf("FromClaims = %v, %v; want %v", id.Pools, err, want)
	}
	for _, tc := range []struct {
		name   string
		claims map[string]any
		header http.Header
		want   string
	}{
		{"an empty claim", map[string]any{"sub": "u", "org": ""}, http.Header{"X-Ai-Eg-Model": {"gpt-4o"}}, "pool org (from claim:org): the claim is empty"},
		{"a blank claim", map[string]any{"sub": "u", "org": " "}, http.Header{"X-Ai-Eg-Model": {"gpt-4o"}}, "pool org (from claim:org): the claim is empty"},
		{"an empty header", map[string]any{"sub": "u", "org": "acme"}, http.Header{"X-Ai-Eg-Model": {""}}, "pool model (from header:x-ai-eg-model): the header is empty"},
	} {
		if _, err := pr.FromClaims(tc.claims, tc.header); !errors.Is(err, identity.ErrInvalidPoolValue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("FromClaims with %s = %v; want ErrInvalidPoolValue saying %q", tc.name, err, tc.want)
		}
	}
}

func TestBodyPools(t *testing.T) {
	r := poolResolver(t, map[string]string{"model": "body:model", "org": "body:organization", "region": "value:eu"})
	cases := []struct {
		name      string
		body      string
		want      map[string]string
		wantLabel string
		wantErr   error
		wantCode  string
	}{
		{"model after messages", `{"messages":[{"role":"user","content":"{\"model\":\"x\"}"}],"model":"gpt-4o","organization":"acme"}`,
			map[string]string{"model": "gpt-4o", "org": "acme", "region": "eu"}, "gpt-4o", nil, ""},
		{"no model", `{"messages":[]}`, map[string]string{"region": "eu"}, "", nil, ""},
		{"null model", `{"model":null,"organization":"acme"}`, map[string]string{"org": "acme", "region": "eu"}, "acme", nil, ""},
		{"escaped model", `{"model":"meta-llama\/Llama-3.1-70B"}`, map[string]string{"model": "meta-llama/Llama-3.1-70B", "region": "eu"}, "meta-llama/Llama-3.1-70B", nil, ""},
		{"not JSON", `model=gpt-4o`, nil, "", identity.ErrInvalidBody, "invalid_body"},
		{"not an object", `["model"]`, nil, "", identity.ErrInvalidBody, "invalid_body"},
		{"model a number", `{"model":4}`, nil, "", identity.ErrInvalidPoolValue, "invalid_pool_key"},
		{"model outside the key charset", `{"model":"a b"}`, nil, "", identity.ErrInvalidPoolValue, "invalid_pool_key"},
		{"model empty", `{"model":""}`, nil, "", identity.ErrInvalidPoolValue, "invalid_pool_key"},
		{"model blank", `{"model":" "}`, nil, "", identity.ErrInvalidPoolValue, "invalid_pool_key"},
		{"model twice", `{"model":"big","model":"small"}`, nil, "", identity.ErrInvalidBody, "invalid_body"},
		{"model twice, spelt apart", `{"model":"big","mod\u0065l":"small"}`, nil, "", identity.ErrInvalidBody, "invalid_body"},
		{"model in capitals", `{"MODEL":"gpt-4o","Organization":"acme"}`, map[string]string{"model": "gpt-4o", "org": "acme", "region": "eu"}, "gpt-4o", nil, ""},
		{"model twice, in two cases", `{"Model":"big","model":"small"}`, nil, "", identity.ErrInvalidBody, "invalid_body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := identity.Identity{UserID: "u", Plan: "paid", Pools: map[string]string{"region": "eu"}}
			err := r.BodyPools(&id, []byte(tc.body))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("BodyPools(%s) = %v; want %v", tc.body, err, tc.wantErr)
			}
			if err != nil {
				if ref := identity.Refusal(err); ref.Status != http.StatusBadRequest || ref.Error.Code != tc.wantCode {
					t.Errorf("refusal %d %s (%s); want 400 %s", ref.Status, ref.Error.Code, ref.Error.Message, tc.wantCode)
				}
				return
			}
			if !reflect.DeepEqual(id.Pools, tc.want) || id.BodyLabel != tc.wantLabel {
				t.Errorf("Pools %v label %q; want %v label %q", id.Pools, id.BodyLabel, tc.want, tc.wantLabel)
			}
		})
	}
}

// TestNumericClaimsInAPayloadKeepTheirDigits: a payload verified in front
// is read as the JWT's claims are: two organisation ids that differ past
// 2^53 are two keys, each the id's own digits.
func TestNumericClaimsInAPayloadKeepTheirDigits(t *testing.T) {
	sources, err := identity.ParsePoolSources(map[string]string{"org": "claim:org"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := identity.New(identity.Options{DefaultPlan: "paid", Payload: &identity.Payload{Header: "X-Jwt-Payload"}, Pools: sources})
	if err != nil {
		t.Fatal(err)
	}
	for payload, want := range map[string]string{
		`{"sub":"u","org":1234567890123456789}`: "1234567890123456789",
		`{"sub":"u","org":1234567890123456700}`: "1234567890123456700",
		`{"sub":"u","org":42}`:                  "42",
		`{"sub":"u","org":42.0}`:                "42",
		`{"sub":"u","org":1e3}`:                 "1000",
	} {
		id, err := r.Resolve(http.Header{"X-Jwt-Payload": {base64.RawURLEncoding.EncodeToString([]byte(payload))}})
		if err != nil || id.Pools["org"] != want {
			t.Errorf("%s: pools %v, %v; want org %s", payload, id.Pools, err, want)
		}
	}
	if _, err := r.Resolve(http.Header{"X-Jwt-Payload": {base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"u","org":1e400}`))}}); !errors.Is(err, identity.ErrInvalidPoolValue) {
		t.Errorf("an org of 1e400: %v; want ErrInvalidPoolValue", err)
	}
}

// TestClaimNamesWithDots: a claim's name may hold dots of its own, as
// namespaced claims do (`https://acme.example.com/org`, which some issuers
// require of custom claims). A name is first read whole, then split at
// its dots into objects, at every level; whole wins where both are there.
func TestClaimNamesWithDots(t *testing.T) {
	dir := t.TempDir()
	s := newSigner(t, "k1", "ES256")
	file := filepath.Join(dir, "jwks.json")
	writeFile(t, file, jwks(s))
	sources, err := identity.ParsePoolSources(map[string]string{"org": "claim:https://acme.example.com/org", "team": "claim:app.team.id"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := identity.New(identity.Options{Pools: sources, JWT: &identity.JWT{JWKSFile: file, Issuer: issuer, Audience: audience, PlanClaim: "https://acme.example.com/plan"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(jwt.MapClaims)
		want map[string]string
	}{
		{"a namespaced claim, whole", func(c jwt.MapClaims) {
			c["https://acme.example.com/org"] = "acme"
		}, map[string]string{"org": "acme"}},
		{"objects all the way", func(c jwt.MapClaims) {
			c["app"] = map[string]any{"team": map[string]any{"id": "red"}}
		}, map[string]string{"team": "red"}},
		{"a dotted name inside an object", func(c jwt.MapClaims) {
			c["app"] = map[string]any{"team.id": "blue"}
		}, map[string]string{"team": "blue"}},
		{"a dotted name holding an object", func(c jwt.MapClaims) {
			c["app.team"] = map[string]any{"id": "green"}
		}, map[string]string{"team": "green"}},
		{"whole before objects", func(c jwt.MapClaims) {
			c["app.team.id"] = "whole"
			c["app"] = map[string]any{"team": map[string]any{"id": "split"}}
		}, map[string]string{"team": "whole"}},
		{"a namespaced name split at every dot", func(c jwt.MapClaims) {
			c["https://acme"] = map[string]any{"example": map[string]any{"com/org": "objects"}}
		}, map[string]string{"org": "objects"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := r.Resolve(bearer(s.sign(t, claims("u", func(c jwt.MapClaims) {
				c["https://acme.example.com/plan"] = "paid"
				tc.edit(c)
			}))))
			if err != nil || !reflect.DeepEqual(id.Pools, tc.want) {
				t.Errorf("Resolve = %v, %v; want %v", id.Pools, err, tc.want)
			}
			if id.Plan != "paid" {
				t.Errorf("plan %q, want paid from the namespaced plan claim", id.Plan)
			}
		})
	}
}

// TestNumericClaimsAsDoubles: Envoy's dynamic metadata (jwt_authn's
// payload_in_metadata) carries a claim's number as a double, whose
// digits past 2^53 are lost: two organisations would share one key that
// is neither's. Such a number is refused; below 2^53 it is its digits.
func TestNumericClaimsAsDoubles(t *testing.T) {
	sources, err := identity.ParsePoolSources(map[string]string{"org": "claim:org"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := identity.New(identity.Options{Pools: sources, Payload: &identity.Payload{}, DefaultPlan: "paid"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		org  float64
		want string
	}{
		{42, "42"},
		{-7, "-7"},
		{4.5, "4.5"},
		{1<<53 - 1, "9007199254740991"},
		{1 << 53, ""},
		{-(1 << 53), ""},
		{1234567890123456789, ""},
		{1e300, ""},
	} {
		id, err := r.FromClaims(map[string]any{"sub": "u", "org": tc.org}, nil)
		if tc.want == "" {
			if !errors.Is(err, identity.ErrInvalidPoolValue) || !strings.Contains(fmt.Sprint(err), "2^53") {
				t.Errorf("org %g: pools %v, %v; want ErrInvalidPoolValue naming 2^53", tc.org, id.Pools, err)
			}
			continue
		}
		if err != nil || id.Pools["org"] != tc.want {
			t.Errorf("org %g: pools %v, %v; want org %s", tc.org, id.Pools, err, tc.want)
		}
	}
}
