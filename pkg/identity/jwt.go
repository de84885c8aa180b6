package identity

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Algorithms accepted. Anything else, "none" and the HMAC family above all
// (a public key must never serve as a shared secret), is refused.
var algorithms = []string{"RS256", "ES256", "EdDSA"}

// JWT configures token verification. JWKSFile or JWKSURL (or both) is
// required, and so are Issuer and Audience.
type JWT struct {
	// JWKSFile is a JSON Web Key Set file. It is checked for changes at
	// most once a second and re-read when it changed, so a rotated key
	// (a new Secret mounted) is used without a restart; a file that does
	// not parse as a key set keeps the previous keys in force, and a set
	// with no usable key revokes them all. Default "".
	JWKSFile string
	// JWKSURL is a JSON Web Key Set URL (an issuer's jwks_uri), fetched
	// on first use and again after CacheTTL, or sooner (at most every
	// 10s) when a token names a key id the set lacks. A failed fetch
	// keeps the previous keys in force; a set with no usable key revokes
	// them all. A redirect from an https URL to plain http fails the
	// fetch (see HTTPClient). Default "".
	JWKSURL string
	// Issuer must equal the token's iss. Required.
	Issuer string
	// Audience must be among the token's aud. Required.
	Audience string
	// UserClaim names the claim holding the user id; a dotted path reaches
	// into objects ("app_metadata.user"). Default "sub".
	UserClaim string
	// PlanClaim names the claim holding the plan, dotted as UserClaim.
	// Default "": the plan is Options.DefaultPlan.
	PlanClaim string
	// Leeway is the clock skew allowed on exp, nbf and iat. Default (0)
	// DefaultLeeway; NoLeeway allows none.
	Leeway time.Duration
	// CacheTTL is how long a set fetched from JWKSURL is used. Default 5m.
	CacheTTL time.Duration
	// HTTPClient fetches JWKSURL. Default: a client with a 5s timeout.
	// Either way the fetch follows at most 5 redirects, and none from an
	// https URL to plain http; a CheckRedirect of its own is asked after.
	HTTPClient *http.Client
}

// verifier checks tokens against the configured key sets.
type verifier struct {
	opts    JWT
	parser  *jwt.Parser
	sources []keySource
}

// keySource is where keys come from: a file or a URL. keys returns its
// current set; refresh asks it to look again now (within its own bounds),
// for a key id the set does not hold.
type keySource interface {
	keys(refresh bool) (*keySet, error)
}

func newVerifier(opts JWT, log *slog.Logger) (*verifier, error) {
	if opts.JWKSFile == "" && opts.JWKSURL == "" {
		return nil, errors.New("identity: a JWT needs a JWKS file or URL")
	}
	if opts.Issuer == "" || opts.Audience == "" {
		return nil, errors.New("identity: a JWT needs an issuer and an audience")
	}
	opts.UserClaim = cmp.Or(opts.UserClaim, DefaultUserClaim)
	switch {
	case opts.Leeway == 0:
		opts.Leeway = DefaultLeeway
	case opts.Leeway < 0: // NoLeeway
		opts.Leeway = 0
	}
	opts.CacheTTL = cmp.Or(opts.CacheTTL, DefaultJWKSCacheTTL)
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 5 * time.Second}
	}
	v := &verifier{opts: opts, parser: jwt.NewParser(
		jwt.WithValidMethods(algorithms),
		jwt.WithIssuer(opts.Issuer),
		jwt.WithAudience(opts.Audience),
		jwt.WithLeeway(opts.Leeway),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithJSONNumber(), // a numeric claim keeps its digits (see claimKey)
	)}
	if opts.JWKSFile != "" {
		f := &fileSource{path: opts.JWKSFile, log: log}
		if _, err := f.keys(true); err != nil {
			return nil, err
		}
		v.sources = append(v.sources, f)
	}
	if opts.JWKSURL != "" {
		client := *opts.HTTPClient // a copy: the redirect policy is the fetch's own
		client.CheckRedirect = checkRedirect(client.CheckRedirect)
		v.sources = append(v.sources, &urlSource{url: opts.JWKSURL, client: &client, ttl: opts.CacheTTL, log: log})
	}
	return v, nil
}

// verify checks token and returns its claims, and its user and plan
// claims (plan "" when PlanClaim is unset or the claim absent).
func (v *verifier) verify(token string) (claims jwt.MapClaims, user, plan string, err error) {
	claims = jwt.MapClaims{}
	if _, err := v.parser.ParseWithClaims(token, claims, v.key); err != nil {
		return nil, "", "", fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	user, ok := claimString(claims, v.opts.UserClaim)
	if !ok || user == "" {
		return nil, "", "", fmt.Errorf("%w: no string claim %q (the user)", ErrInvalidToken, v.opts.UserClaim)
	}
	if v.opts.PlanClaim != "" {
		if plan, ok = claimString(claims, v.opts.PlanClaim); !ok && hasClaim(claims, v.opts.PlanClaim) {
			return nil, "", "", fmt.Errorf("%w: claim %q (the plan) is not a string", ErrInvalidToken, v.opts.PlanClaim)
		}
	}
	return claims, user, plan, nil
}

// key is the parser's keyfunc: the key of the token's kid that suits its
// algorithm, looking again once in each source for a kid none holds.
func (v *verifier) key(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	kid, _ := t.Header["kid"].(string)
	for _, refresh := range []bool{false, true} {
		var errs []error
		for _, src := range v.sources {
			set, err := src.keys(refresh)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if k, err := set.lookup(kid, alg); err == nil {
				return k, nil
			} else if !errors.Is(err, errNoKey) {
				return nil, err
			}
		}
		if refresh && len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
	}
	if kid == "" {
		return nil, fmt.Errorf("%w for %s, and the token names no kid", errNoKey, alg)
	}
	return nil, fmt.Errorf("%w: kid %q (%s)", errNoKey, kid, alg)
}

// suits reports whether key can verify alg.
func suits(key crypto.PublicKey, alg string) bool {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return alg == "RS256"
	case *ecdsa.PublicKey:
		return alg == "ES256" && k.Curve == elliptic.P256()
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}

// claimString returns the string at a dotted path of claims, trimOWS'd.
func claimString(claims jwt.MapClaims, path string) (string, bool) {
	v, ok := claimAt(claims, path)
	s, isString := v.(string)
	return trimOWS(s), ok && isString
}

func hasClaim(claims jwt.MapClaims, path string) bool {
	_, ok := claimAt(claims, path)
	return ok
}

// claimAt returns the claim at path: a name, or names joined by dots
// that reach into objects. A claim's own name may hold dots (a namespaced
// claim such as "https://acme.example.com/org"), so at each level the
// rest of the path is first looked up whole, then split at each of its
// dots in turn.
func claimAt(claims jwt.MapClaims, path string) (any, bool) {
	return claimIn(map[string]any(claims), path)
}

func claimIn(m map[string]any, path string) (any, bool) {
	if v, ok := m[path]; ok {
		return v, true
	}
	for i := range len(path) {
		if path[i] != '.' {
			continue
		}
		if inner, ok := m[path[:i]].(map[string]any); ok {
			if v, ok := claimIn(inner, path[i+1:]); ok {
				return v, true
			}
		}
	}
	return nil, false
}
