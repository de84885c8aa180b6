package identity

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"sync"
	"time"
)

// errNoKey: no key of a set suits the token.
var errNoKey = errors.New("no key")

// Bounds of the key sources.
const (
	fileCheckEvery   = time.Second      // a JWKS file is stat'ed at most this often
	urlRefreshEvery  = 10 * time.Second // an unknown kid refetches a JWKS URL at most this often
	maxJWKSBytes     = 1 << 20
	minRSAKeyBits    = 2048
	jwksFetchTimeout = 5 * time.Second
	maxJWKSRedirects = 5
)

// keySet is the usable keys of one JSON Web Key Set.
type keySet struct {
	keys []jwk
	// none says why the set has no usable key (it has none, or none that
	// can verify a token); nil when it has one.
	none error
}

type jwk struct {
	kid string
	alg string // "" when the JWK names none
	key crypto.PublicKey
}

// lookup returns the key for kid that suits alg; with no kid, the only
// key that suits alg (errNoKey when none or several do).
func (s *keySet) lookup(kid, alg string) (crypto.PublicKey, error) {
	var found []jwk
	for _, k := range s.keys {
		if (kid == "" || k.kid == kid) && suits(k.key, alg) && (k.alg == "" || k.alg == alg) {
			found = append(found, k)
		}
	}
	switch {
	case len(found) == 1:
		return found[0].key, nil
	case len(found) > 1 && kid == "":
		return nil, fmt.Errorf("%w: the token names no kid and %d keys suit %s", errNoKey, len(found), alg)
	case len(found) > 1:
		return nil, fmt.Errorf("%w: kid %q names %d keys", errNoKey, kid, len(found))
	}
	return nil, errNoKey
}

// parseJWKS reads a JSON Web Key Set. Keys it cannot use (encryption keys,
// other key types and curves, RSA keys under 2048 bits, private keys) are
// skipped. A set left with no usable key is still a set, its none saying
// why: published, it revokes every key. The error is for data that is no
// JSON Web Key Set (not JSON, or no "keys" array), which revokes nothing.
func parseJWKS(data []byte) (*keySet, error) {
	var doc struct {
		Keys *[]json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("not a JSON Web Key Set: %w", err)
	}
	if doc.Keys == nil {
		return nil, errors.New(`not a JSON Web Key Set: no "keys" array`)
	}
	set := &keySet{}
	var skipped []error
	for i, raw := range *doc.Keys {
		k, err := parseJWK(raw)
		if err != nil {
			skipped = append(skipped, fmt.Errorf("keys[%d]: %w", i, err))
			continue
		}
		set.keys = append(set.keys, k)
	}
	if len(set.keys) == 0 {
		set.none = fmt.Errorf("no usable key (RS256, ES256 or EdDSA public keys) among %d", len(*doc.Keys))
		if len(skipped) > 0 {
			set.none = fmt.Errorf("%w: %w", set.none, errors.Join(skipped...))
		}
	}
	return set, nil
}

func parseJWK(raw json.RawMessage) (jwk, error) {
	var k struct {
		Kty, Kid, Use, Alg, Crv, N, E, X, Y, D string
	}
	if err := json.Unmarshal(raw, &k); err != nil {
		return jwk{}, err
	}
	if k.Use != "" && k.Use != "sig" {
		return jwk{}, fmt.Errorf("use %q, not sig", k.Use)
	}
	if k.D != "" {
		return jwk{}, errors.New("a private key: publish only public keys")
	}
	out := jwk{kid: k.Kid, alg: k.Alg}
	switch k.Kty {
	case "RSA":
		n, e := b64Int(k.N), b64Int(k.E)
		if n == nil || e == nil || !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31-1 {
			return jwk{}, errors.New("RSA key without a valid n and e")
		}
		if n.BitLen() < minRSAKeyBits {
			return jwk{}, fmt.Errorf("RSA key of %d bits, under %d", n.BitLen(), minRSAKeyBits)
		}
		out.key = &rsa.PublicKey{N: n, E: int(e.Int64())}
		return out, nil
	case "EC":
		if k.Crv != "P-256" {
			return jwk{}, fmt.Errorf("EC curve %q (only P-256, for ES256)", k.Crv)
		}
		x, y := b64(k.X), b64(k.Y)
		if len(x) != 32 || len(y) != 32 {
			return jwk{}, errors.New("P-256 key without 32-byte x and y")
		}
		// Checks that the point is on the curve.
		pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
		if err != nil {
			return jwk{}, fmt.Errorf("P-256 key: %w", err)
		}
		out.key = pub
		return out, nil
	case "OKP":
		x := b64(k.X)
		if k.Crv != "Ed25519" || len(x) != ed25519.PublicKeySize {
			return jwk{}, fmt.Errorf("OKP key: curve %q with a %d-byte x (only Ed25519, for EdDSA)", k.Crv, len(x))
		}
		out.key = ed25519.PublicKey(x)
		return out, nil
	}
	return jwk{}, fmt.Errorf("key type %q", k.Kty)
}

func b64(s string) []byte {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil
	}
	return b
}

func b64Int(s string) *big.Int {
	b := b64(s)
	if len(b) == 0 {
		return nil
	}
	return new(big.Int).SetBytes(b)
}

// fileSource is a JWKS file, re-read when its size, mode or time changes.
// A version that cannot be used is reported once, not at every check.
type fileSource struct {
	path string
	log  *slog.Logger

	mu      sync.Mutex
	set     *keySet
	stat    os.FileInfo // of the version in force
	bad     os.FileInfo // of the version last reported broken; nil when none
	gone    bool        // the file's absence was reported
	checked time.Time
}

func (f *fileSource) keys(refresh bool) (*keySet, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.set != nil && time.Since(f.checked) < fileCheckEvery {
		return f.set, nil
	}
	f.checked = time.Now()
	info, statErr := os.Stat(f.path)
	if statErr == nil && f.stat != nil && sameFile(info, f.stat) {
		return f.set, nil
	}
	if f.set != nil && ((statErr != nil && f.gone) || (statErr == nil && f.bad != nil && sameFile(info, f.bad))) {
		return f.set, nil // reported already
	}
	var set *keySet
	err := statErr
	if err == nil {
		var data []byte
		if data, err = os.ReadFile(f.path); err == nil {
			set, err = parseJWKS(data)
		}
	}
	if err == nil && set.none != nil && f.set == nil {
		err = set.none // at start: refuse it, naming the problem
	}
	if err != nil {
		err = fmt.Errorf("identity.jwt.jwksFile %s: %w", f.path, err)
		if f.set == nil {
			return nil, err
		}
		// A file caught half-written, or removed mid-rotation: keep the
		// keys in force and look again at the next check, quietly until
		// the file changes.
		f.bad, f.gone = info, statErr != nil
		f.log.Warn("JWKS file unreadable; keeping the keys in force", "err", err)
		return f.set, nil
	}
	f.bad, f.gone = nil, false
	switch {
	case f.set != nil && set.none != nil:
		// The keys were revoked: none stays trusted, whatever the file
		// held before. Logged once: this version is now the one in force.
		f.log.Warn("JWKS file holds no usable key; every token is refused until it does", "err", fmt.Errorf("identity.jwt.jwksFile %s: %w", f.path, set.none))
	case f.set != nil:
		f.log.Info("JWKS file changed; keys reloaded", "path", f.path, "keys", len(set.keys))
	}
	f.set, f.stat = set, info
	return set, nil
}

func sameFile(a, b os.FileInfo) bool {
	return a.Size() == b.Size() && a.ModTime().Equal(b.ModTime()) && a.Mode() == b.Mode() && os.SameFile(a, b)
}

// urlSource is a JWKS URL, fetched on first use and when its copy is older
// than ttl; an unknown kid fetches it again at most every 10s. A failed
// fetch (or one that is no JWKS) keeps the copy in force; a set with no
// usable key replaces it, revoking every key, but is no first copy.
//
// No request waits on the issuer for keys the copy in force holds: a copy
// older than ttl is used while a fetch runs in the background. The first
// fetch, and one for a kid the copy lacks (a key rotated in), are waited
// for, by those requests only; and every request that waits at one time
// waits for one fetch, never one behind another. So an issuer that is
// slow or down holds up no token whose key is known.
type urlSource struct {
	url    string
	client *http.Client
	ttl    time.Duration
	log    *slog.Logger

	mu        sync.Mutex
	set       *keySet
	fetched   time.Time     // of the copy in force
	ended     time.Time     // when the latest fetch ended, failed or not
	lastErr   error         // of the latest fetch; nil when it succeeded
	refreshed time.Time     // when the latest fetch for an unknown kid began
	running   chan struct{} // closed when the fetch under way ends; nil when none is
}

func (u *urlSource) keys(refresh bool) (*keySet, error) {
	u.mu.Lock()
	// Bound the fetches a flood of tokens with unknown key ids (or an
	// issuer that is down) can cause: one at a time, a second after the
	// last ended, and for unknown kids every urlRefreshEvery.
	idle := u.running == nil && time.Since(u.ended) >= time.Second
	switch {
	case u.set == nil && !idle && u.running == nil:
		err := u.lastErr
		u.mu.Unlock()
		return nil, fmt.Errorf("identity.jwt.jwksURL %s: not fetched yet (retrying): %w", u.url, err)
	case u.set == nil, refresh && (u.running != nil || time.Since(u.refreshed) >= urlRefreshEvery):
		if refresh && u.running == nil {
			u.refreshed = time.Now()
		}
		done := u.start()
		u.mu.Unlock()
		<-done
		u.mu.Lock()
		defer u.mu.Unlock()
		if u.set == nil {
			return nil, fmt.Errorf("identity.jwt.jwksURL %s: %w", u.url, u.lastErr)
		}
		return u.set, nil
	case !refresh && idle && time.Since(u.fetched) >= u.ttl:
		u.start() // the copy in force serves meanwhile
	}
	defer u.mu.Unlock()
	return u.set, nil
}

// start starts a fetch, unless one is under way, and returns the channel
// closed when it ends. u.mu is held.
func (u *urlSource) start() <-chan struct{} {
	if u.running != nil {
		return u.running
	}
	done := make(chan struct{})
	u.running = done
	go func() {
		set, err := u.fetch()
		u.mu.Lock()
		defer u.mu.Unlock()
		if err == nil && set.none != nil && u.set == nil {
			err = set.none // no first copy: fetched again, as a failure is
		}
		u.running, u.ended, u.lastErr = nil, time.Now(), err
		switch {
		case err == nil:
			if set.none != nil && (u.set.none == nil || u.set.none.Error() != set.none.Error()) {
				u.log.Warn("fetched JWKS holds no usable key; every token is refused until it does", "err", fmt.Errorf("identity.jwt.jwksURL %s: %w", u.url, set.none))
			}
			u.set, u.fetched = set, time.Now()
		case u.set != nil:
			u.log.Warn("fetching the JWKS failed; keeping the keys in force", "err", fmt.Errorf("identity.jwt.jwksURL %s: %w", u.url, err))
		}
		close(done)
	}()
	return done
}

// checkRedirect is the redirect policy of a JWKS URL's fetch: at most
// maxJWKSRedirects, and none that leaves https when the URL is https
// (anyone on a plain http path could serve keys that verify forged
// tokens); then own, the HTTPClient's policy, when it has one.
func checkRedirect(own func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		switch {
		case via[0].URL.Scheme == "https" && req.URL.Scheme != "https":
			return &redirectError{fmt.Sprintf("redirected to %s, which leaves https: refused (a key set fetched over plain http could be anyone's)", req.URL.Redacted())}
		case len(via) > maxJWKSRedirects: // via: the requests before req, the first one's included
			return &redirectError{fmt.Sprintf("followed %d redirects and refused a %dth, to %s", maxJWKSRedirects, maxJWKSRedirects+1, req.URL.Redacted())}
		case own != nil:
			return own(req, via)
		}
		return nil
	}
}

// redirectError is a redirect checkRedirect refused. Its message names the
// target, so fetch returns it without the *url.Error around it.
type redirectError struct{ msg string }

func (e *redirectError) Error() string { return e.msg }

func (u *urlSource) fetch() (*keySet, error) {
	ctx, cancel := context.WithTimeout(context.Background(), jwksFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := u.client.Do(req)
	if refused := (*redirectError)(nil); errors.As(err, &refused) {
		return nil, refused
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("answered %s", resp.Status)
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, io.LimitReader(resp.Body, maxJWKSBytes+1)); err != nil {
		return nil, err
	}
	if buf.Len() > maxJWKSBytes {
		return nil, fmt.Errorf("over %d bytes", maxJWKSBytes)
	}
	return parseJWKS(buf.Bytes())
}
