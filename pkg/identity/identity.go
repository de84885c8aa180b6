// Package identity decides whose stream a request is, and under which
// plan: from a verified JWT (JWKS from a file, re-read when it changes,
// and/or from a URL, cached), or, when no JWT is configured, from headers
// that a hop in front has set after authenticating the caller. The proxy
// and the ext_proc server resolve identities through it.
package identity

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Defaults of Options.
const (
	DefaultUserHeader = "X-User-Id"
	DefaultPlanHeader = "X-Plan"
	DefaultUserClaim  = "sub"
	// DefaultLeeway absorbs clock skew between the issuer and this host
	// when checking exp, nbf and iat.
	DefaultLeeway = 30 * time.Second
	// NoLeeway, as JWT.Leeway, allows no clock skew at all (a zero
	// Leeway is DefaultLeeway).
	NoLeeway time.Duration = -1
	// DefaultJWKSCacheTTL is how long a JWKS fetched from a URL is used
	// before it is fetched again.
	DefaultJWKSCacheTTL = 5 * time.Minute
)

// Errors of Resolve. Each but ErrAmbiguous wraps ErrUnauthenticated:
// answer 401, and never take a slot (Refusal maps them all).
var (
	// ErrUnauthenticated is wrapped by every error of Resolve but
	// ErrAmbiguous.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrMissing: the request carries no credentials (no bearer token, no
	// user header).
	ErrMissing = fmt.Errorf("%w: no credentials", ErrUnauthenticated)
	// ErrInvalidToken: the token did not verify (signature, algorithm,
	// issuer, audience, expiry) or lacks the user claim.
	ErrInvalidToken = fmt.Errorf("%w: invalid token", ErrUnauthenticated)
	// ErrNoPlan: neither the token nor the headers name a plan, and there
	// is no default plan.
	ErrNoPlan = fmt.Errorf("%w: no plan", ErrUnauthenticated)
	// ErrAmbiguous: a header that decides the identity (the user or plan
	// header, Authorization with a JWT, the payload header) came more than
	// once, whatever its values. A hop in front that appends its value to
	// the client's instead of replacing it would otherwise let the
	// client's come first and choose the user; the request is malformed
	// (400), not unauthenticated.
	ErrAmbiguous = errors.New("ambiguous identity")
)

// Sources of an Identity.
const (
	SourceJWT    = "jwt"
	SourceHeader = "header"
)

// Identity is who a request is for.
type Identity struct {
	UserID string
	Plan   string
	// Source is SourceJWT, SourceHeader or SourcePayload.
	Source string
	// Pools are the pool keys the request joins, pool → key, from the
	// sources of Options.Pools: Resolve and FromClaims fill those of
	// headers, claims and constants, BodyPools those of the body. nil:
	// none.
	Pools map[string]string
	// BodyLabel is a key BodyPools read from the body, the field "model"
	// first: what the front end labels the slot with when the request
	// names no label. "" when none was read.
	BodyLabel string
}

// Options configure a Resolver. Zero values take the documented defaults.
type Options struct {
	// UserHeader names the user when no JWT is configured. Default
	// "X-User-Id". Trust it only behind a hop that authenticates the
	// caller and sets it (and strips any the caller sent).
	UserHeader string
	// PlanHeader names the plan when no JWT is configured. Default
	// "X-Plan".
	PlanHeader string
	// DefaultPlan is the plan of a request whose token or headers name
	// none. Default "": such a request is refused (ErrNoPlan).
	DefaultPlan string
	// JWT, when set, makes a verified bearer token the only source of
	// identity; the headers are then ignored.
	JWT *JWT
	// Payload, when set (and JWT is not), makes a JWT payload that a hop
	// in front verified the only source of identity: its header (Resolve)
	// or dynamic metadata (FromClaims). The user and plan headers are then
	// ignored.
	Payload *Payload
	// Pools say where the keys of the pools a request joins come from
	// (ParsePoolSources). A claim source needs JWT or Payload. Default
	// none: requests join no pool.
	Pools PoolSources
	// Logger receives JWKS reload failures. Default slog.Default().
	Logger *slog.Logger
}

// Headers is what Resolve reads: an http.Header, or the request headers of
// an ext_proc message behind the same methods. Values returns every value
// of a header, one per field line (or header map entry), so that a
// repeated one is seen. A pool keyed by header:Host reads "Host", and
// ":scheme" ("http", "https") to tell the host's default port.
type Headers interface {
	Get(name string) string
	Values(name string) []string
}

// Resolver resolves the identity of requests. It is safe for concurrent
// use.
type Resolver struct {
	opts       Options
	verifier   *verifier // nil: trusted headers
	bodyFields []string  // the body fields of Options.Pools
}

// New returns a Resolver. With a JWT, it loads the JWKS file (an error
// when it holds no usable key); a JWKS URL is first fetched on demand.
func New(opts Options) (*Resolver, error) {
	if opts.UserHeader == "" {
		opts.UserHeader = DefaultUserHeader
	}
	if opts.PlanHeader == "" {
		opts.PlanHeader = DefaultPlanHeader
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.JWT != nil && opts.Payload != nil {
		return nil, errors.New("identity: a JWT and a verified JWT payload are two sources of identity; configure one")
	}
	if opts.Payload != nil {
		p := opts.Payload.withDefaults()
		opts.Payload = &p
	}
	if opts.Pools.NeedsClaims() && opts.JWT == nil && opts.Payload == nil {
		return nil, errors.New("identity: a pool's claim source needs a JWT or a verified JWT payload; with identities from headers there are no claims")
	}
	r := &Resolver{opts: opts, bodyFields: opts.Pools.BodyFields()}
	if opts.JWT != nil {
		v, err := newVerifier(*opts.JWT, opts.Logger)
		if err != nil {
			return nil, err
		}
		r.verifier = v
	}
	return r, nil
}

// UsesJWT reports whether identities come from verified tokens.
func (r *Resolver) UsesJWT() bool { return r.verifier != nil }

// UsesPayload reports whether identities come from a JWT payload verified
// in front (Options.Payload).
func (r *Resolver) UsesPayload() bool { return r.opts.Payload != nil }

// Headers returns the names of the user and plan headers
// (Options.UserHeader, Options.PlanHeader, defaults applied). With a JWT
// or a verified payload they name no identity; a front end sets them on
// the upstream request to the identity it verified, so that an upstream
// reading them sees the user and plan the limiter counted, never the
// client's own.
func (r *Resolver) Headers() (user, plan string) { return r.opts.UserHeader, r.opts.PlanHeader }

// Resolve returns the identity of a request from its headers. Errors are
// ErrAmbiguous, or wrap ErrUnauthenticated (ErrMissing, ErrInvalidToken,
// ErrNoPlan); their messages say what was wrong and never quote the token.
func (r *Resolver) Resolve(h Headers) (Identity, error) {
	if r.verifier != nil {
		return r.fromToken(h)
	}
	if r.opts.Payload != nil {
		return r.fromPayloadHeader(h)
	}
	user, err := single(h, r.opts.UserHeader)
	if err != nil {
		return Identity{}, err
	}
	plan, err := single(h, r.opts.PlanHeader)
	if err != nil {
		return Identity{}, err
	}
	if user == "" {
		return Identity{}, fmt.Errorf("%w: header %s is missing", ErrMissing, r.opts.UserHeader)
	}
	if plan == "" {
		plan = r.opts.DefaultPlan
	}
	if plan == "" {
		return Identity{}, fmt.Errorf("%w: header %s is missing and there is no default plan", ErrNoPlan, r.opts.PlanHeader)
	}
	return r.withPools(Identity{UserID: user, Plan: plan, Source: SourceHeader}, h, nil)
}

// withPools adds to id the pool keys of the sources that read headers,
// claims (nil: none) and constants.
func (r *Resolver) withPools(id Identity, h Headers, claims map[string]any) (Identity, error) {
	if len(r.opts.Pools) == 0 {
		return id, nil
	}
	pools, err := r.opts.Pools.fromRequest(h, claims)
	if err != nil {
		return Identity{}, err
	}
	id.Pools = pools
	return id, nil
}

func (r *Resolver) fromToken(h Headers) (Identity, error) {
	authorization, err := single(h, "Authorization")
	if err != nil {
		return Identity{}, err
	}
	token, ok := bearer(authorization)
	if !ok {
		return Identity{}, fmt.Errorf("%w: no bearer token in the Authorization header", ErrMissing)
	}
	claims, user, plan, err := r.verifier.verify(token)
	if err != nil {
		return Identity{}, err
	}
	if plan == "" {
		plan = r.opts.DefaultPlan
	}
	if plan == "" {
		return Identity{}, fmt.Errorf("%w: the token has no %q claim and there is no default plan", ErrNoPlan, r.verifier.opts.PlanClaim)
	}
	return r.withPools(Identity{UserID: user, Plan: plan, Source: SourceJWT}, h, claims)
}

// bearer returns the token of an "Authorization: Bearer <token>" value.
func bearer(value string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(value), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// trimOWS trims the spaces and tabs around s: HTTP's optional whitespace,
// which a hop in front may leave around a value. Other whitespace (U+00A0,
// U+3000) is kept, for the limiter to refuse: trimmed, "alice\u00a0" would
// become alice's id and take her slots.
func trimOWS(s string) string { return strings.Trim(s, " \t") }

// single returns the value of header name, trimOWS'd; "" when it is absent.
// More than one value, even the same twice, is ErrAmbiguous: which one a
// hop in front meant cannot be told.
func single(h Headers, name string) (string, error) {
	v, _, err := lookup(h, name)
	return v, err
}

// lookup is single, and whether the header is there at all: present with
// value "" is a header sent empty (or blank), not one absent.
func lookup(h Headers, name string) (value string, present bool, err error) {
	values := h.Values(name)
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
		return trimOWS(values[0]), true, nil
	}
	return "", true, fmt.Errorf("%w: header %s came more than once (%d values); the hop in front must set it, replacing any the client sent, not add to it",
		ErrAmbiguous, name, len(values))
}

// ValidHeaderName reports whether name is an HTTP header field name (a
// token: no space, control character or separator).
func ValidHeaderName(name string) bool { return httpguts.ValidHeaderFieldName(name) }

var _ Headers = http.Header(nil)
