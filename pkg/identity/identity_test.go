package identity_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/joishi/limiter/pkg/identity"
)

const (
	issuer   = "https://issuer.test"
	audience = "limiter-proxy"
)

// signer is a private key and the JWK of its public half.
type signer struct {
	kid    string
	method jwt.SigningMethod
	key    crypto.Signer
}

func newSigner(t testing.TB, kid, alg string) signer {
	t.Helper()
	var key crypto.Signer
	var err error
	var method jwt.SigningMethod
	switch alg {
	case "RS256":
		key, err = rsa.GenerateKey(rand.Reader, 2048)
		method = jwt.SigningMethodRS256
	case "ES256":
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		method = jwt.SigningMethodES256
	case "EdDSA":
		_, key, err = ed25519.GenerateKey(rand.Reader)
		method = jwt.SigningMethodEdDSA
	}
	if err != nil {
		t.Fatal(err)
	}
	return signer{kid: kid, method: method, key: key}
}

func (s signer) jwk() map[string]any {
	enc := base64.RawURLEncoding.EncodeToString
	switch pub := s.key.Public().(type) {
	case *rsa.PublicKey:
		return map[string]any{"kty": "RSA", "kid": s.kid, "use": "sig", "alg": "RS256", "n": enc(pub.N.Bytes()), "e": enc(big.NewInt(int64(pub.E)).Bytes())}
	case *ecdsa.PublicKey:
		b, _ := pub.Bytes()
		return map[string]any{"kty": "EC", "kid": s.kid, "crv": "P-256", "x": enc(b[1:33]), "y": enc(b[33:])}
	case ed25519.PublicKey:
		return map[string]any{"kty": "OKP", "kid": s.kid, "crv": "Ed25519", "x": enc(pub)}
	}
	return nil
}

func jwks(signers ...signer) []byte {
	keys := []any{}
	for _, s := range signers {
		keys = append(keys, s.jwk())
	}
	b, _ := json.Marshal(map[string]any{"keys": keys})
	return b
}

// claims returns valid claims for user, changed by edit.
func claims(user string, edit func(jwt.MapClaims)) jwt.MapClaims {
	now := time.Now()
	c := jwt.MapClaims{"iss": issuer, "aud": audience, "sub": user, "plan": "paid",
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	if edit != nil {
		edit(c)
	}
	return c
}

func (s signer) sign(t testing.TB, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(s.method, c)
	tok.Header["kid"] = s.kid
	out, err := tok.SignedString(s.key)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	// Write and rename, as a Secret volume swaps its files.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func jwtResolver(t testing.TB, file string, edit func(*identity.JWT)) *identity.Resolver {
	t.Helper()
	opts := identity.JWT{JWKSFile: file, Issuer: issuer, Audience: audience, PlanClaim: "plan", Leeway: 5 * time.Second}
	if edit != nil {
		edit(&opts)
	}
	r, err := identity.New(identity.Options{JWT: &opts, DefaultPlan: "free"})
	if err != nil {
		t.Fatalf("identity.New: %v", err)
	}
	return r
}

func bearer(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

func TestJWT(t *testing.T) {
	rs, es, ed := newSigner(t, "rs", "RS256"), newSigner(t, "es", "ES256"), newSigner(t, "ed", "EdDSA")
	stranger := newSigner(t, "rs", "RS256") // same kid, another key
	file := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, file, jwks(rs, es, ed))
	r := jwtResolver(t, file, nil)

	none := func() string {
		tok := jwt.NewWithClaims(jwt.SigningMethodNone, claims("mallory", nil))
		s, err := tok.SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	// HS256 keyed with the RSA public key's bytes: the classic confusion.
	hmac := func() string {
		pub := rs.jwk()["n"].(string)
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims("mallory", nil))
		tok.Header["kid"] = "rs"
		s, err := tok.SignedString([]byte(pub))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()

	cases := []struct {
		name     string
		header   http.Header
		wantErr  error
		wantUser string
		wantPlan string
	}{
		{"RS256 token", bearer(rs.sign(t, claims("alice", nil))), nil, "alice", "paid"},
		{"ES256 token", bearer(es.sign(t, claims("bob", nil))), nil, "bob", "paid"},
		{"EdDSA token", bearer(ed.sign(t, claims("carol", nil))), nil, "carol", "paid"},
		{"no plan claim takes the default plan", bearer(rs.sign(t, claims("dave", func(c jwt.MapClaims) { delete(c, "plan") }))), nil, "dave", "free"},
		{"expired a minute ago", bearer(rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Minute).Unix() }))), identity.ErrInvalidToken, "", ""},
		{"expired within the leeway", bearer(rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-2 * time.Second).Unix() }))), nil, "alice", "paid"},
		{"no exp", bearer(rs.sign(t, claims("alice", func(c jwt.MapClaims) { delete(c, "exp") }))), identity.ErrInvalidToken, "", ""},
		{"not valid before a minute from now", bearer(rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Minute).Unix() }))), identity.ErrInvalidToken, "", ""},
		{"wrong audience", bearer(rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["aud"] = "another-service" }))), identity.ErrInvalidToken, "", ""},
		{"audience among several", bearer(rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["aud"] = []string{"x", audience} }))), nil, "alice", "paid"},
		{"wrong issuer", bearer(rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["iss"] = "https://evil.test" }))), identity.ErrInvalidToken, "", ""},
		{"signed by a key not in the set", bearer(stranger.sign(t, claims("mallory", nil))), identity.ErrInvalidToken, "", ""},
		{"alg none", bearer(none), identity.ErrInvalidToken, "", ""},
		{"HS256 keyed with the public key", bearer(hmac), identity.ErrInvalidToken, "", ""},
		{"tampered payload", bearer(tamper(rs.sign(t, claims("alice", nil)))), identity.ErrInvalidToken, "", ""},
		{"no user claim", bearer(rs.sign(t, claims("", func(c jwt.MapClaims) { delete(c, "sub") }))), identity.ErrInvalidToken, "", ""},
		{"plan claim not a string", bearer(rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["plan"] = 3 }))), identity.ErrInvalidToken, "", ""},
		{"no Authorization header", http.Header{}, identity.ErrMissing, "", ""},
		{"Basic credentials", http.Header{"Authorization": {"Basic YTpi"}}, identity.ErrMissing, "", ""},
		{"headers are ignored when a JWT is configured", http.Header{"X-User-Id": {"alice"}, "X-Plan": {"paid"}}, identity.ErrMissing, "", ""},
		{"garbage token", bearer("not.a.token"), identity.ErrInvalidToken, "", ""},
		// Only ASCII spaces and tabs are trimmed: an id with other
		// whitespace is kept as sent, for the limiter to refuse
		// (invalid_user_id), not made into another user's.
		{"a user claim with spaces around it", bearer(rs.sign(t, claims(" \talice ", nil))), nil, "alice", "paid"},
		{"a user claim with a no-break space after it", bearer(rs.sign(t, claims("alice\u00a0", nil))), nil, "alice\u00a0", "paid"},
		{"a plan claim with an ideographic space before it", bearer(rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["plan"] = "\u3000paid" }))), nil, "alice", "\u3000paid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Resolve(tc.header)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !errors.Is(err, identity.ErrUnauthenticated) {
					t.Fatalf("Resolve = %+v, %v; want %v (an ErrUnauthenticated)", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got.UserID != tc.wantUser || got.Plan != tc.wantPlan || got.Source != identity.SourceJWT {
				t.Fatalf("Resolve = %+v, %v; want user %s, plan %s from the JWT", got, err, tc.wantUser, tc.wantPlan)
			}
		})
	}
}

// tamper changes the payload of a signed token, keeping its signature.
func tamper(token string) string {
	parts := strings.Split(token, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	payload = []byte(strings.Replace(string(payload), `"alice"`, `"admin"`, 1))
	parts[1] = base64.RawURLEncoding.EncodeToString(payload)
	return strings.Join(parts, ".")
}

func TestJWKSFileRotation(t *testing.T) {
	old, next := newSigner(t, "2024", "RS256"), newSigner(t, "2025", "ES256")
	file := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, file, jwks(old))
	r := jwtResolver(t, file, nil)
	oldToken, nextToken := old.sign(t, claims("alice", nil)), next.sign(t, claims("alice", nil))
	if _, err := r.Resolve(bearer(oldToken)); err != nil {
		t.Fatalf("the old key's token before the rotation: %v", err)
	}
	if _, err := r.Resolve(bearer(nextToken)); !errors.Is(err, identity.ErrInvalidToken) {
		t.Fatalf("the next key's token before the rotation: %v, want ErrInvalidToken", err)
	}

	// The new key is published beside the old one, then the old removed.
	writeFile(t, file, jwks(old, next))
	waitFor(t, func() bool { _, err := r.Resolve(bearer(nextToken)); return err == nil }, "the next key's token accepted after it was added")
	if _, err := r.Resolve(bearer(oldToken)); err != nil {
		t.Fatalf("the old key's token while both are published: %v", err)
	}
	writeFile(t, file, jwks(next))
	waitFor(t, func() bool { _, err := r.Resolve(bearer(oldToken)); return err != nil }, "the old key's token refused after it was removed")

	// A file caught half-written keeps the keys in force.
	writeFile(t, file, []byte(`{"keys": [`))
	time.Sleep(1100 * time.Millisecond)
	if _, err := r.Resolve(bearer(nextToken)); err != nil {
		t.Fatalf("a token of the key in force while the file does not parse: %v", err)
	}
}

// A broken or missing JWKS file keeps the keys in force and is logged once
// per bad version, not at every check (about once a second under traffic).
func TestABadJWKSFileIsLoggedOncePerVersion(t *testing.T) {
	key := newSigner(t, "2025", "EdDSA")
	file := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, file, jwks(key))
	var log bytes.Buffer
	r, err := identity.New(identity.Options{
		JWT:         &identity.JWT{JWKSFile: file, Issuer: issuer, Audience: audience},
		DefaultPlan: "free",
		Logger:      slog.New(slog.NewTextHandler(&log, nil)),
	})
	if err != nil {
		t.Fatalf("identity.New: %v", err)
	}
	token := key.sign(t, claims("alice", nil))
	// check resolves the token after the file's next check is due, n times.
	check := func(n int, what string) {
		t.Helper()
		for range n {
			time.Sleep(1100 * time.Millisecond)
			if _, err := r.Resolve(bearer(token)); err != nil {
				t.Fatalf("%s: the key in force refused its token: %v", what, err)
			}
		}
	}
	for _, step := range []struct {
		name   string
		change func()
		checks int
		want   int // WARN lines about the file so far
	}{
		{"a file that does not parse, checked twice", func() { writeFile(t, file, []byte(`{"keys": [`)) }, 2, 1},
		{"another broken version", func() { writeFile(t, file, []byte(`{"keys": [{`)) }, 1, 2},
		{"the file removed, checked twice", func() {
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
		}, 2, 3},
	} {
		step.change()
		check(step.checks, step.name)
		if got := strings.Count(log.String(), "JWKS file unreadable"); got != step.want {
			t.Fatalf("after %s: got %d WARN lines, want %d; log:\n%s", step.name, got, step.want, log.String())
		}
	}
	// The file back is read again, and a later break is reported anew.
	writeFile(t, file, jwks(key))
	check(1, "the file back")
	writeFile(t, file, []byte(`{"keys": [`))
	check(1, "broken again")
	if got := strings.Count(log.String(), "JWKS file unreadable"); got != 4 {
		t.Errorf("after the file came back and broke again: got %d WARN lines, want 4; log:\n%s", got, log.String())
	}
}

// A JWKS file emptied, or left with only keys that cannot verify a token,
// revokes every key: the old ones must not stay trusted. It is logged at
// WARN once per version. A file that is no JWKS at all keeps the keys.
func TestAJWKSFileWithNoUsableKeyRevokesEveryKey(t *testing.T) {
	key := newSigner(t, "2024", "RS256")
	file := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, file, jwks(key))
	var log bytes.Buffer
	r, err := identity.New(identity.Options{
		JWT:         &identity.JWT{JWKSFile: file, Issuer: issuer, Audience: audience},
		DefaultPlan: "free",
		Logger:      slog.New(slog.NewTextHandler(&log, nil)),
	})
	if err != nil {
		t.Fatalf("identity.New: %v", err)
	}
	token := bearer(key.sign(t, claims("alice", nil)))
	accepted := func() bool { _, err := r.Resolve(token); return err == nil }
	refused := func() bool { _, err := r.Resolve(token); return errors.Is(err, identity.ErrInvalidToken) }
	warnings := func() int { return strings.Count(log.String(), "JWKS file holds no usable key") }

	for _, step := range []struct {
		name   string
		jwks   string
		revoke bool
		warns  int
	}{
		{"emptied", `{"keys":[]}`, true, 1},
		{"back", string(jwks(key)), false, 1},
		{"only a shared secret", `{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`, true, 2},
		{"back again", string(jwks(key)), false, 2},
		{"a JSON object without keys", `{}`, false, 2},
	} {
		writeFile(t, file, []byte(step.jwks))
		if step.revoke {
			waitFor(t, refused, step.name+": the key's token refused")
		} else {
			time.Sleep(1100 * time.Millisecond)
			waitFor(t, accepted, step.name+": the key's token accepted")
		}
		time.Sleep(1100 * time.Millisecond) // checked again: no second WARN
		if step.revoke && !refused() || !step.revoke && !accepted() {
			t.Fatalf("%s: the token's answer changed at the next check", step.name)
		}
		if got := warnings(); got != step.warns {
			t.Fatalf("%s: %d WARN lines about no usable key, want %d; log:\n%s", step.name, got, step.warns, log.String())
		}
	}
}

func waitFor(t *testing.T, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 3s: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestJWKSURLIsCachedAndRefetchedForANewKid(t *testing.T) {
	first, second := newSigner(t, "a", "EdDSA"), newSigner(t, "b", "EdDSA")
	var served atomic.Value
	served.Store(jwks(first))
	var fetches atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(served.Load().([]byte))
	}))
	defer srv.Close()
	r := jwtResolver(t, "", func(j *identity.JWT) { j.JWKSURL = srv.URL })
	for range 5 {
		if _, err := r.Resolve(bearer(first.sign(t, claims("alice", nil)))); err != nil {
			t.Fatalf("token of the served key: %v", err)
		}
	}
	if got := fetches.Load(); got != 1 {
		t.Errorf("5 tokens fetched the JWKS %d times, want once (cached)", got)
	}
	// A key published since: its kid is unknown, so the set is fetched
	// again at once.
	served.Store(jwks(first, second))
	if _, err := r.Resolve(bearer(second.sign(t, claims("bob", nil)))); err != nil {
		t.Fatalf("token of a key published since the fetch: %v", err)
	}
	// Unknown kids do not make a fetch each.
	for range 5 {
		_, _ = r.Resolve(bearer(newSigner(t, "zz", "EdDSA").sign(t, claims("mallory", nil))))
	}
	if got := fetches.Load(); got != 2 {
		t.Errorf("fetches: got %d, want 2 (one more for the new kid, none for a flood of unknown ones)", got)
	}
}

// A JWKS URL's redirects are followed within https; one from https to
// plain http is refused (anyone on the path could serve keys that verify
// forged tokens), naming its target, and the plain server is never asked.
func TestJWKSURLRedirects(t *testing.T) {
	key := newSigner(t, "a", "EdDSA")
	var plainHits atomic.Int32
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plainHits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(jwks(key))
	}))
	defer plain.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/jwks", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(jwks(key))
	})
	mux.Handle("/moved", http.RedirectHandler("/jwks", http.StatusFound))
	mux.Handle("/to-plain", http.RedirectHandler(plain.URL+"/jwks", http.StatusFound))
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/loop?"+r.URL.RawQuery+"x", http.StatusFound)
	})
	// /chain/n redirects n times, then to the set.
	mux.HandleFunc("/chain/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.PathValue("n"))
		if n <= 1 {
			http.Redirect(w, r, "/jwks", http.StatusFound)
			return
		}
		http.Redirect(w, r, "/chain/"+strconv.Itoa(n-1), http.StatusFound)
	})
	srv := httptest.NewTLSServer(mux)
	defer srv.Close()
	token := bearer(key.sign(t, claims("alice", nil)))
	for _, tc := range []struct {
		name, path string
		wantErr    []string // "" when the token verifies
	}{
		{"a redirect within https is followed", "/moved", nil},
		{"a redirect from https to http is refused", "/to-plain", []string{plain.URL + "/jwks", "leaves https"}},
		{"5 redirects are followed", "/chain/5", nil},
		{"a 6th is refused", "/chain/6", []string{"followed 5 redirects", "refused a 6th", "/jwks"}},
		{"redirects are bounded", "/loop", []string{"followed 5 redirects", "refused a 6th"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := jwtResolver(t, "", func(j *identity.JWT) { j.JWKSURL, j.HTTPClient = srv.URL+tc.path, srv.Client() })
			_, err := r.Resolve(token)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("got %v, want the token verified", err)
				}
				return
			}
			if !errors.Is(err, identity.ErrInvalidToken) {
				t.Fatalf("got %v, want ErrInvalidToken", err)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error: got %q, want it to say %q", err, want)
				}
			}
		})
	}
	if got := plainHits.Load(); got != 0 {
		t.Errorf("the plain http server got %d requests, want none", got)
	}
}

// A JWKS URL that answers a set with no usable key revokes every key; one
// that fails, or answers what is no JWKS, keeps the keys in force.
func TestAJWKSURLWithNoUsableKeyRevokesEveryKey(t *testing.T) {
	key := newSigner(t, "a", "EdDSA")
	var served atomic.Value
	served.Store(jwks(key))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := served.Load().([]byte)
		if string(body) == "500" {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	var log bytes.Buffer
	r, err := identity.New(identity.Options{
		JWT:         &identity.JWT{JWKSURL: srv.URL, Issuer: issuer, Audience: audience, CacheTTL: time.Millisecond},
		DefaultPlan: "free",
		Logger:      slog.New(slog.NewTextHandler(&log, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	token := bearer(key.sign(t, claims("alice", nil)))
	if _, err := r.Resolve(token); err != nil {
		t.Fatalf("the served key's token: %v", err)
	}
	for _, answer := range []string{"500", `{}`} {
		served.Store([]byte(answer))
		for range 2 { // the first fetches, the second sees its outcome
			time.Sleep(1100 * time.Millisecond) // the copy is stale: each resolve starts a fetch
			if _, err := r.Resolve(token); err != nil {
				t.Fatalf("the issuer answering %s: the key's token refused: %v; want the keys kept", answer, err)
			}
		}
	}
	served.Store([]byte(`{"keys":[]}`))
	time.Sleep(1100 * time.Millisecond)
	waitFor(t, func() bool { _, err := r.Resolve(token); return errors.Is(err, identity.ErrInvalidToken) },
		"the key's token refused once the issuer publishes no key")
	if got := strings.Count(log.String(), "JWKS holds no usable key"); got != 1 {
		t.Errorf("%d WARN lines about no usable key, want 1; log:\n%s", got, log.String())
	}
}

// A zero Leeway is DefaultLeeway's 30 s; NoLeeway allows none: a token
// that expired 2 s ago passes the one and not the other.
func TestJWTLeeway(t *testing.T) {
	rs := newSigner(t, "a", "RS256")
	file := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, file, jwks(rs))
	token := bearer(rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-2 * time.Second).Unix() })))
	for _, tc := range []struct {
		leeway time.Duration
		ok     bool
	}{{0, true}, {identity.NoLeeway, false}} {
		r := jwtResolver(t, file, func(j *identity.JWT) { j.Leeway = tc.leeway })
		if _, err := r.Resolve(token); (err == nil) != tc.ok || err != nil && !errors.Is(err, identity.ErrInvalidToken) {
			t.Errorf("Leeway %v, a token expired 2s ago: %v; want accepted %v", tc.leeway, err, tc.ok)
		}
	}
}

// TestAnIssuerThatHangsHoldsUpNoKnownKey: the JWKS URL stops answering
// once its copy is older than CacheTTL. Tokens of a key the copy holds
// verify while the fetch hangs, none waiting on it, and no second fetch
// starts meanwhile; tokens of a kid the copy lacks (a key rotated in)
// wait, all for that one fetch, and verify once it answers.
func TestAnIssuerThatHangsHoldsUpNoKnownKey(t *testing.T) {
	known, rotated := newSigner(t, "a", "EdDSA"), newSigner(t, "b", "EdDSA")
	var served atomic.Value
	served.Store(jwks(known))
	var fetches atomic.Int32
	var hanging atomic.Bool
	answer := make(chan struct{}) // closed: the issuer answers again
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		if hanging.Load() {
			select {
			case <-answer:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(served.Load().([]byte))
	}))
	defer srv.Close()
	r := jwtResolver(t, "", func(j *identity.JWT) {
		j.JWKSURL, j.CacheTTL, j.HTTPClient = srv.URL, time.Millisecond, &http.Client{Timeout: time.Minute}
	})
	resolve := func(s signer, user string) <-chan error {
		done := make(chan error, 1)
		token := bearer(s.sign(t, claims(user, nil)))
		go func() { _, err := r.Resolve(token); done <- err }()
		return done
	}
	if err := <-resolve(known, "alice"); err != nil {
		t.Fatal(err)
	}
	hanging.Store(true)
	served.Store(jwks(known, rotated))
	time.Sleep(1100 * time.Millisecond) // the copy is stale, and the fetch ended over a second ago
	for i := range 5 {
		select {
		case err := <-resolve(known, "alice"):
			if err != nil {
				t.Fatalf("token %d of a known key while the issuer hangs: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("token %d of a known key: no answer while the issuer hangs; want the copy in force used", i)
		}
	}
	waitFor(t, func() bool { return fetches.Load() == 2 }, "one fetch of the stale copy, in the background")
	var waiting []<-chan error
	for range 3 {
		waiting = append(waiting, resolve(rotated, "bob"))
	}
	select {
	case err := <-waiting[0]:
		t.Fatalf("a token of a kid the copy lacks answered %v while the fetch hangs; want it to wait for the fetch", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(answer)
	for i, done := range waiting {
		if err := <-done; err != nil {
			t.Errorf("token %d of the key rotated in, once the issuer answered: %v", i, err)
		}
	}
	if got := fetches.Load(); got != 2 {
		t.Errorf("fetches: %d, want 2: the one that hung served every token that waited", got)
	}
}

func TestJWTOptionsAreRequired(t *testing.T) {
	file := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, file, jwks(newSigner(t, "a", "RS256")))
	for _, tc := range []struct {
		name string
		jwt  identity.JWT
	}{
		{"no key source", identity.JWT{Issuer: issuer, Audience: audience}},
		{"no issuer", identity.JWT{JWKSFile: file, Audience: audience}},
		{"no audience", identity.JWT{JWKSFile: file, Issuer: issuer}},
		{"a JWKS file that is missing", identity.JWT{JWKSFile: file + ".missing", Issuer: issuer, Audience: audience}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := identity.New(identity.Options{JWT: &tc.jwt}); err == nil {
				t.Error("New accepted it")
			}
		})
	}
	for _, tc := range []struct{ name, jwks, want string }{
		{"a JWKS with only a shared secret", `{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`, `no usable key (RS256, ES256 or EdDSA public keys) among 1: keys[0]: key type "oct"`},
		{"a JWKS of no keys", `{"keys":[]}`, "no usable key (RS256, ES256 or EdDSA public keys) among 0"},
		{"a JSON object without keys", `{}`, `no "keys" array`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			empty := filepath.Join(t.TempDir(), "empty.json")
			writeFile(t, empty, []byte(tc.jwks))
			_, err := identity.New(identity.Options{JWT: &identity.JWT{JWKSFile: empty, Issuer: issuer, Audience: audience}})
			if err == nil || !strings.HasSuffix(err.Error(), tc.want) {
				t.Errorf("New: %v; want an error ending %q", err, tc.want)
			}
		})
	}
}

func TestTrustedHeaders(t *testing.T) {
	r, err := identity.New(identity.Options{UserHeader: "X-Auth-User", DefaultPlan: "free"})
	if err != nil {
		t.Fatal(err)
	}
	noDefault, err := identity.New(identity.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		r        *identity.Resolver
		header   http.Header
		want     identity.Identity
		wantErrr error
	}{
		{"user and plan", r, http.Header{"X-Auth-User": {"alice"}, "X-Plan": {"paid"}}, identity.Identity{UserID: "alice", Plan: "paid", Source: identity.SourceHeader}, nil},
		{"no plan takes the default", r, http.Header{"X-Auth-User": {"alice"}}, identity.Identity{UserID: "alice", Plan: "free", Source: identity.SourceHeader}, nil},
		{"no user", r, http.Header{"X-Plan": {"paid"}}, identity.Identity{}, identity.ErrMissing},
		{"a blank user", r, http.Header{"X-Auth-User": {"  "}}, identity.Identity{}, identity.ErrMissing},
		{"default header names", noDefault, http.Header{"X-User-Id": {"bob"}, "X-Plan": {"free"}}, identity.Identity{UserID: "bob", Plan: "free", Source: identity.SourceHeader}, nil},
		{"no plan and no default", noDefault, http.Header{"X-User-Id": {"bob"}}, identity.Identity{}, identity.ErrNoPlan},
		// HTTP's optional whitespace (spaces, tabs) is trimmed; any other
		// whitespace is kept, for the limiter to refuse (invalid_user_id),
		// not made into another user's id.
		{"spaces and tabs around the user", noDefault, http.Header{"X-User-Id": {" \tbob\t "}, "X-Plan": {" free "}},
			identity.Identity{UserID: "bob", Plan: "free", Source: identity.SourceHeader}, nil},
		{"a no-break space after the user", noDefault, http.Header{"X-User-Id": {"alice\u00a0"}, "X-Plan": {"paid"}},
			identity.Identity{UserID: "alice\u00a0", Plan: "paid", Source: identity.SourceHeader}, nil},
		{"an ideographic space before the user", noDefault, http.Header{"X-User-Id": {"\u3000alice"}, "X-Plan": {"paid"}},
			identity.Identity{UserID: "\u3000alice", Plan: "paid", Source: identity.SourceHeader}, nil},
		{"an em space after the plan", noDefault, http.Header{"X-User-Id": {"alice"}, "X-Plan": {"paid\u2003"}},
			identity.Identity{UserID: "alice", Plan: "paid\u2003", Source: identity.SourceHeader}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.r.Resolve(tc.header)
			if !errors.Is(err, tc.wantErrr) || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Resolve = %+v, %v; want %+v, %v", got, err, tc.want, tc.wantErrr)
			}
		})
	}
}
