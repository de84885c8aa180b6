package config

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/proxy"
	"github.com/joishi/limiter/pkg/route"
	"github.com/joishi/limiter/pkg/tiers"
)

// Proxy is `limiter proxy`: the reverse proxy that holds a slot for each
// stream it forwards.
type Proxy struct {
	// Listen is the proxy's listen address, host:port. Default ":8000".
	Listen string `mapstructure:"listen"`
	// Upstream is the URL requests are forwarded to: http(s)://host:port,
	// with an optional path prefix. Required by `limiter proxy`.
	Upstream string `mapstructure:"upstream"`
	// Routes are the path prefixes whose requests hold a slot; the rest
	// pass through with no identity needed. Each is a plain path (no //,
	// ".", "..", %, \, ;, ?), matched on segment boundaries against every
	// spelling of a request's path (pkg/route). Default []: every request.
	Routes []string `mapstructure:"routes"`
	// PassAuthorization passes the client's Authorization header upstream.
	// Default true.
	PassAuthorization bool `mapstructure:"passAuthorization"`
	// UpstreamCAFile is a PEM bundle of the CAs trusted for an https
	// upstream. Default "": the system roots.
	UpstreamCAFile string `mapstructure:"upstreamCAFile"`
	// DialTimeout bounds connecting to the upstream (TLS handshake apart).
	// Default 5s.
	DialTimeout time.Duration `mapstructure:"dialTimeout"`
	// TLSHandshakeTimeout bounds the TLS handshake with an https upstream.
	// Default 5s.
	TLSHandshakeTimeout time.Duration `mapstructure:"tlsHandshakeTimeout"`
	// ResponseHeaderTimeout bounds the wait for the upstream's response
	// headers; a non-streaming completion sends them only once it is
	// done, so keep it above the longest one. The stream itself is never
	// bounded. Default 5m.
	ResponseHeaderTimeout time.Duration `mapstructure:"responseHeaderTimeout"`
	// IdleConnTimeout is how long an idle upstream connection is kept.
	// Default 90s.
	IdleConnTimeout time.Duration `mapstructure:"idleConnTimeout"`
	// StallTimeout bounds each write of a stream to its client: a client
	// that reads nothing for that long, its connection open, has its
	// stream cut and its slot (and pool places) released, as one that
	// went away. 1s-1h. Default 2m, a slot's default TTL.
	StallTimeout time.Duration `mapstructure:"stallTimeout"`
	// MaxHeaderBytes bounds a request's headers; larger ones are refused
	// with 431 and no slot. Default 32768.
	MaxHeaderBytes int `mapstructure:"maxHeaderBytes"`
	// MaxBodyBytes bounds the request body the proxy buffers to read a
	// pool's key from it (identity.pools with a body: source); a larger
	// body is refused with 413 and no slot. Bodies are buffered only
	// then, and only on limited routes. 1024 to 268435456 (256 MiB).
	// Default 8388608 (8 MiB).
	MaxBodyBytes int64 `mapstructure:"maxBodyBytes"`
	// LabelHeader names the request header whose value becomes the slot's
	// label, shown to support beside the stream (a model, a pod, a
	// request id). A request without it is labelled with the key a body:
	// source of identity.pools read, the model first. Default
	// "X-Limiter-Label"; "" records no label from a header.
	LabelHeader string `mapstructure:"labelHeader"`
	// Wait is how long a request whose user holds every slot of its plan
	// may wait for one to free up, first come first served across the
	// proxy's replicas, before it is refused with 429; the plan's maxWait
	// caps it, and a client that goes away leaves the queue at once.
	// 0s-60s. Default 0s: refused at once.
	Wait time.Duration `mapstructure:"wait"`
}

// Identity says whose stream a request is and under which plan (`limiter
// proxy`, and the ext_proc server).
type Identity struct {
	// UserHeader names the user when no JWT is configured. Trusted as is:
	// use it only behind a hop that authenticates the caller and sets
	// it. With a JWT (or JWTPayload) it goes upstream carrying the user
	// the limiter counted, replacing the client's. Default "X-User-Id".
	UserHeader string `mapstructure:"userHeader"`
	// PlanHeader names the plan when no JWT is configured; with one, it
	// goes upstream carrying the plan counted, as UserHeader. Default
	// "X-Plan".
	PlanHeader string `mapstructure:"planHeader"`
	// DefaultPlan is the plan of a request whose token or headers name
	// none. Default "": such a request is refused (401).
	DefaultPlan string `mapstructure:"defaultPlan"`
	// JWT, when jwksFile or jwksURL is set, makes a verified bearer token
	// the only source of identity.
	JWT JWT `mapstructure:"jwt"`
	// JWTPayload, when its header or metadataKey is set, makes a JWT
	// payload that Envoy's jwt_authn verified the only source (see
	// extproc.go).
	JWTPayload JWTPayload `mapstructure:"jwtPayload"`
	// Pools say where the proxy and the ext_proc server find the keys of
	// the pools a request joins: pool → source, one of header:NAME,
	// claim:NAME (a claim of the verified JWT or JWT payload), value:KEY
	// (the same key for every request) or body:FIELD (a top-level field of
	// the JSON request body, which is then buffered). A request without
	// the header, claim or field joins no key of that pool; one sent
	// empty is refused 400 invalid_pool_key. In the
	// environment: pool=source pairs, comma-separated
	// (model=body:model,org=header:X-Org). Default none.
	Pools map[string]string `mapstructure:"pools"`
}

// JWT is the verification of bearer tokens (RS256, ES256, EdDSA).
type JWT struct {
	// JWKSFile is a JSON Web Key Set file, re-read when it changes.
	// Default "".
	JWKSFile string `mapstructure:"jwksFile"`
	// JWKSURL is a JSON Web Key Set URL (the issuer's jwks_uri), cached
	// for CacheTTL. Its fetch follows at most 5 redirects, none from https
	// to plain http. Default "".
	JWKSURL string `mapstructure:"jwksURL"`
	// Issuer must equal the token's iss. Required with a JWT.
	Issuer string `mapstructure:"issuer"`
	// Audience must be among the token's aud. Required with a JWT.
	Audience string `mapstructure:"audience"`
	// UserClaim holds the user id; dots reach into objects. Default "sub";
	// another needs JWKSFile or JWKSURL.
	UserClaim string `mapstructure:"userClaim"`
	// PlanClaim holds the plan. Default "": identity.defaultPlan; set, it
	// needs JWKSFile or JWKSURL.
	PlanClaim string `mapstructure:"planClaim"`
	// Leeway is the clock skew allowed on exp, nbf and iat (0-5m).
	// Default 30s.
	Leeway time.Duration `mapstructure:"leeway"`
	// CacheTTL is how long a set fetched from JWKSURL is used. Default 5m.
	CacheTTL time.Duration `mapstructure:"cacheTTL"`
}

// Enabled reports whether tokens are verified (a key source is set).
func (j JWT) Enabled() bool { return j.JWKSFile != "" || j.JWKSURL != "" }

func defaultProxy() Proxy {
	return Proxy{
		Listen: ":8000", Routes: []string{}, PassAuthorization: true,
		DialTimeout: proxy.DefaultDialTimeout, TLSHandshakeTimeout: proxy.DefaultTLSHandshakeTimeout,
		ResponseHeaderTimeout: proxy.DefaultResponseHeaderTimeout, IdleConnTimeout: proxy.DefaultIdleConnTimeout,
		StallTimeout:   proxy.DefaultStallTimeout,
		MaxHeaderBytes: proxy.DefaultMaxHeaderBytes, MaxBodyBytes: proxy.DefaultMaxBodyBytes, LabelHeader: proxy.DefaultLabelHeader,
	}
}

func defaultIdentity() Identity {
	return Identity{
		UserHeader: identity.DefaultUserHeader, PlanHeader: identity.DefaultPlanHeader,
		JWT:        JWT{UserClaim: identity.DefaultUserClaim, Leeway: identity.DefaultLeeway, CacheTTL: identity.DefaultJWKSCacheTTL},
		JWTPayload: defaultJWTPayload(), Pools: map[string]string{},
	}
}

// planPattern is a plan name's form (pkg/tiers checks the same).
var planPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Bounds of the proxy's values.
const (
	MinMaxHeaderBytes = 1 << 10
	MaxMaxHeaderBytes = 1 << 20
	MaxJWTLeeway      = 5 * time.Minute
	MinMaxBodyBytes   = 1 << 10
	MaxMaxBodyBytes   = 256 << 20
	MinStallTimeout   = time.Second
	MaxStallTimeout   = time.Hour
)

// IdentityOptions returns the options of identity.New.
func (c Config) IdentityOptions() identity.Options {
	i := c.Identity
	opts := identity.Options{UserHeader: i.UserHeader, PlanHeader: i.PlanHeader, DefaultPlan: i.DefaultPlan}
	if i.JWT.Enabled() {
		j := i.JWT
		leeway := j.Leeway
		if leeway == 0 { // leeway: 0s, as written (the default is DefaultLeeway's 30s)
			leeway = identity.NoLeeway
		}
		opts.JWT = &identity.JWT{JWKSFile: j.JWKSFile, JWKSURL: j.JWKSURL, Issuer: j.Issuer, Audience: j.Audience,
			UserClaim: j.UserClaim, PlanClaim: j.PlanClaim, Leeway: leeway, CacheTTL: j.CacheTTL}
	}
	opts.Payload = i.JWTPayload.payloadOptions()
	opts.Pools, _ = identity.ParsePoolSources(i.Pools) // Validate reported any error
	return opts
}

// ProxyOptions returns the options of proxy.New that come from the
// configuration; the caller adds the tiers, logger and telemetry.
func (c Config) ProxyOptions() (proxy.Options, error) {
	p := c.Proxy
	upstream, err := url.Parse(p.Upstream)
	if err != nil {
		return proxy.Options{}, &KeyError{Key: "proxy.upstream", Problem: "must be a URL", Err: err}
	}
	transport, err := proxy.NewTransport(proxy.TransportOptions{
		DialTimeout: p.DialTimeout, TLSHandshakeTimeout: p.TLSHandshakeTimeout,
		ResponseHeaderTimeout: p.ResponseHeaderTimeout, IdleConnTimeout: p.IdleConnTimeout, CAFile: p.UpstreamCAFile,
	})
	if err != nil {
		return proxy.Options{}, &KeyError{Key: "proxy.upstreamCAFile", Problem: err.Error(), Err: err}
	}
	return proxy.Options{
		Upstream: upstream, Routes: append([]string(nil), p.Routes...), StripAuthorization: !p.PassAuthorization,
		MaxHeaderBytes: p.MaxHeaderBytes, MaxBodyBytes: p.MaxBodyBytes, Transport: transport, LabelHeader: p.LabelHeader,
		StallTimeout: p.StallTimeout,
	}, nil
}

// ValidateProxy reports, beyond Validate, what `limiter proxy` needs:
// proxy.upstream, and a listen address apart from ops.addr; and refuses
// what it would not do: serve extproc.addr (an Envoy sent there, failing
// open, would let every request through uncapped), or ask callers for the
// tokens of api.tokensFile and admin.tokensFile (an operator would take
// its callers for authenticated).
func (c Config) ValidateProxy() error {
	v := validator{}
	if c.Proxy.Upstream == "" {
		v.add("proxy.upstream", "is required: the URL of the server to put the cap in front of, like http://vllm:8000", "")
	}
	if sameListener(c.Proxy.Listen, c.Ops.Addr) {
		v.add("ops.addr", "must not be the address of proxy.listen ("+c.Proxy.Listen+")", strconv.Quote(c.Ops.Addr))
	}
	for _, f := range []struct{ key, file string }{{"api.tokensFile", c.API.TokensFile}, {"admin.tokensFile", c.Admin.TokensFile}} {
		if f.file != "" {
			v.add(f.key, "is read by `limiter serve` only: `limiter proxy` serves no slot or admin API, and takes its callers' identity from identity.jwt (verified) or identity headers (trusted as they come); unset it", strconv.Quote(f.file))
		}
	}
	if f := c.HTTP.TLS.ClientCAFile; f != "" {
		// serve names a caller by its certificate, scoped by api.tokensFile,
		// which the proxy refuses: one could never be set without the other.
		v.add("http.tls.clientCAFile", "is read by `limiter serve` only: `limiter proxy` takes no caller from a client certificate (identity.jwt or identity headers name the user); unset it", strconv.Quote(f))
	}
	if c.ExtProc.Addr != "" {
		v.add("extproc.addr", "is served by `limiter serve` only: `limiter proxy` serves no ext_proc; run `limiter serve` for Envoy, or unset it", strconv.Quote(c.ExtProc.Addr))
	}
	if p := c.Identity.JWTPayload; p.MetadataKey != "" && p.Header == "" {
		v.add("identity.jwtPayload.metadataKey", "is read by the ext_proc server only: the proxy receives no Envoy metadata; set identity.jwtPayload.header", strconv.Quote(p.MetadataKey))
	}
	return errors.Join(v.errs...)
}

func (c Config) validateProxy(v *validator) {
	p := c.Proxy
	v.listenAddr("proxy.listen", p.Listen)
	if p.Upstream != "" {
		u, err := url.Parse(p.Upstream)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			v.add("proxy.upstream", "must be an http:// or https:// URL with a host", strconv.Quote(p.Upstream))
		case u.User != nil || u.RawQuery != "" || u.Fragment != "":
			v.add("proxy.upstream", "must have no user info, query or fragment", strconv.Quote(u.Redacted()))
		}
	}
	for _, r := range p.Routes {
		var invalid *route.InvalidError
		if err := route.Check(r); errors.As(err, &invalid) {
			v.add("proxy.routes", "each route "+invalid.Problem, strconv.Quote(r))
		}
	}
	v.readable("proxy.upstreamCAFile", p.UpstreamCAFile)
	for _, d := range []struct {
		key   string
		value time.Duration
	}{
		{"proxy.dialTimeout", p.DialTimeout},
		{"proxy.tlsHandshakeTimeout", p.TLSHandshakeTimeout},
		{"proxy.responseHeaderTimeout", p.ResponseHeaderTimeout},
		{"proxy.idleConnTimeout", p.IdleConnTimeout},
	} {
		if d.value <= 0 {
			v.add(d.key, "must be > 0", d.value.String())
		}
	}
	if p.LabelHeader != "" && !identity.ValidHeaderName(p.LabelHeader) {
		v.add("proxy.labelHeader", "must be an HTTP header name, or empty for no label", strconv.Quote(p.LabelHeader))
	}
	if p.StallTimeout < MinStallTimeout || p.StallTimeout > MaxStallTimeout {
		v.add("proxy.stallTimeout", "must be between 1s and 1h: how long a client may read nothing of its stream before the stream is cut and its slot released", p.StallTimeout.String())
	}
	if p.Wait < 0 || p.Wait > tiers.MaxMaxWait {
		v.add("proxy.wait", "must be between 0s (no waiting) and 60s (the plan's maxWait caps it)", p.Wait.String())
	}
	if p.MaxHeaderBytes < MinMaxHeaderBytes || p.MaxHeaderBytes > MaxMaxHeaderBytes {
		v.add("proxy.maxHeaderBytes", fmt.Sprintf("must be between %d and %d", MinMaxHeaderBytes, MaxMaxHeaderBytes), strconv.Itoa(p.MaxHeaderBytes))
	}
	if p.MaxBodyBytes < MinMaxBodyBytes || p.MaxBodyBytes > MaxMaxBodyBytes {
		v.add("proxy.maxBodyBytes", fmt.Sprintf("must be between %d and %d (256 MiB)", MinMaxBodyBytes, MaxMaxBodyBytes), strconv.FormatInt(p.MaxBodyBytes, 10))
	}
}

func (c Config) validateIdentity(v *validator) {
	i := c.Identity
	for _, h := range []struct{ key, value string }{{"identity.userHeader", i.UserHeader}, {"identity.planHeader", i.PlanHeader}} {
		if !identity.ValidHeaderName(h.value) {
			v.add(h.key, "must be an HTTP header name", strconv.Quote(h.value))
		}
	}
	if i.DefaultPlan != "" && !planPattern.MatchString(i.DefaultPlan) {
		v.add("identity.defaultPlan", "must be a plan name (1-63 of [A-Za-z0-9._-]) or empty", strconv.Quote(i.DefaultPlan))
	}
	c.validatePoolSources(v)
	j := i.JWT
	if !j.Enabled() {
		for _, s := range []setting{{"identity.jwt.issuer", j.Issuer != ""}, {"identity.jwt.audience", j.Audience != ""},
			{"identity.jwt.userClaim", j.UserClaim != "" && j.UserClaim != identity.DefaultUserClaim}, {"identity.jwt.planClaim", j.PlanClaim != ""}} {
			if s.set {
				v.add(s.key, "requires identity.jwt.jwksFile or identity.jwt.jwksURL (without a key source no token is verified)", "")
			}
		}
		return
	}
	v.readable("identity.jwt.jwksFile", j.JWKSFile)
	if j.JWKSURL != "" {
		if u, err := url.Parse(j.JWKSURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			v.add("identity.jwt.jwksURL", "must be an http:// or https:// URL", strconv.Quote(j.JWKSURL))
		}
	}
	if j.Issuer == "" {
		v.add("identity.jwt.issuer", "is required with a JWT: the iss every token must carry", "")
	}
	if j.Audience == "" {
		v.add("identity.jwt.audience", "is required with a JWT: the aud every token must carry (this service's name)", "")
	}
	if strings.TrimSpace(j.UserClaim) == "" {
		v.add("identity.jwt.userClaim", "must not be empty", "")
	}
	if j.Leeway < 0 || j.Leeway > MaxJWTLeeway {
		v.add("identity.jwt.leeway", fmt.Sprintf("must be between 0s and %s", MaxJWTLeeway), j.Leeway.String())
	}
	if j.CacheTTL <= 0 {
		v.add("identity.jwt.cacheTTL", "must be > 0", j.CacheTTL.String())
	}
}

// validatePoolSources checks identity.pools: each source's form, a claim
// source only where there are claims, and, with the pools in the file,
// only pools it lists.
func (c Config) validatePoolSources(v *validator) {
	i := c.Identity
	names := make([]string, 0, len(i.Pools))
	for pool := range i.Pools {
		names = append(names, pool)
	}
	slices.Sort(names)
	if len(names) > limiter.MaxPools {
		v.add("identity.pools", fmt.Sprintf("names %d pools; a request joins at most %d", len(names), limiter.MaxPools), strings.Join(names, ", "))
	}
	var listed []string
	for _, p := range c.Pools.Static {
		listed = append(listed, p.Pool)
	}
	for _, pool := range names {
		spec := i.Pools[pool]
		s, err := identity.ParsePoolSource(pool, spec)
		if err != nil {
			v.add("identity.pools", "pool "+pool+": "+err.Error(), "")
			continue
		}
		if s.Kind == identity.PoolFromClaim && !i.JWT.Enabled() && !i.JWTPayload.Enabled() {
			v.add("identity.pools", "pool "+pool+": "+spec+" reads a JWT claim, and identities come from headers: set identity.jwt or identity.jwtPayload, or take the key from a header:, value: or body: source", "")
		}
		if c.Tiers.Source == SourceStatic && !slices.Contains(listed, pool) {
			v.add("identity.pools", fmt.Sprintf("pool %s is not in pools.static (%s): list it there, with its caps", pool, orNone(listed)), "")
		}
	}
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "which lists none"
	}
	return "which lists " + strings.Join(names, ", ")
}
