package config

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/spf13/pflag"
)

func TestProxyAndIdentityValidation(t *testing.T) {
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(jwks, []byte(`{"keys":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	checkEdits(t, []editCase{
		{"an upstream that is no http URL", func(c *Config) { c.Proxy.Upstream = "vllm:8000" }, "proxy.upstream", "http:// or https://"},
		{"an upstream with credentials", func(c *Config) { c.Proxy.Upstream = "http://u:p@vllm:8000" }, "proxy.upstream", "no user info"},
		{"a route that is no path", func(c *Config) { c.Proxy.Routes = []string{"v1/chat"} }, "proxy.routes", "must start with /"},
		{"a route with a doubled slash", func(c *Config) { c.Proxy.Routes = []string{"/v1//chat"} }, "proxy.routes", "empty segment"},
		{"a route with a dot-dot", func(c *Config) { c.Proxy.Routes = []string{"/v1/../chat"} }, "proxy.routes", `"." or ".." segment`},
		{"a route with an encoded slash", func(c *Config) { c.Proxy.Routes = []string{"/v1%2Fchat"} }, "proxy.routes", "must not hold %"},
		{"a route with a query", func(c *Config) { c.Proxy.Routes = []string{"/v1/chat?x=1"} }, "proxy.routes", "must not hold ?"},
		{"a bad listen address", func(c *Config) { c.Proxy.Listen = "8000" }, "proxy.listen", "host:port"},
		{"no dial timeout", func(c *Config) { c.Proxy.DialTimeout = 0 }, "proxy.dialTimeout", "must be > 0"},
		{"tiny header limit", func(c *Config) { c.Proxy.MaxHeaderBytes = 10 }, "proxy.maxHeaderBytes", "between 1024"},
		{"a body limit one below the least", func(c *Config) { c.Proxy.MaxBodyBytes = MinMaxBodyBytes - 1 }, "proxy.maxBodyBytes", "between 1024 and 268435456"},
		{"a body limit one above the most", func(c *Config) { c.Proxy.MaxBodyBytes = MaxMaxBodyBytes + 1 }, "proxy.maxBodyBytes", "between 1024 and 268435456"},
		{"a pool source of no kind", func(c *Config) { c.Identity.Pools = map[string]string{"model": "model"} }, "identity.pools", "pool model: \"model\" is not a source: want header:NAME, claim:NAME, value:KEY or body:FIELD"},
		{"a pool source of an unknown kind", func(c *Config) { c.Identity.Pools = map[string]string{"model": "query:model"} }, "identity.pools", `unknown kind "query"`},
		{"five pool sources, one over the most a request joins", func(c *Config) {
			c.Tiers.Source = SourceKubernetes
			c.Tiers.Namespace = "default"
			c.Identity.Pools = map[string]string{"a": "value:a", "b": "value:b", "c": "value:c", "d": "value:d", "e": "value:e"}
		}, "identity.pools", "names 5 pools; a request joins at most 4"},
		{"a pool name in capitals", func(c *Config) { c.Identity.Pools = map[string]string{"Model": "body:model"} }, "identity.pools", "invalid pool name"},
		{"a claim source with header identities", func(c *Config) {
			c.Pools.Static = []pools.Pool{{Pool: "org"}}
			c.Identity.Pools = map[string]string{"org": "claim:org_id"}
		}, "identity.pools", "reads a JWT claim, and identities come from headers"},
		{"a pool source for a pool not in the file", func(c *Config) {
			c.Pools.Static = []pools.Pool{{Pool: "org"}}
			c.Identity.Pools = map[string]string{"model": "body:model"}
		}, "identity.pools", "pool model is not in pools.static (which lists org)"},
		{"a label header with a colon", func(c *Config) { c.Proxy.LabelHeader = "X-Model:" }, "proxy.labelHeader", "HTTP header name, or empty for no label"},
		{"a missing CA file", func(c *Config) { c.Proxy.UpstreamCAFile = "/nonexistent/ca.pem" }, "proxy.upstreamCAFile", "readable file"},
		{"a header name with a space", func(c *Config) { c.Identity.UserHeader = "X User" }, "identity.userHeader", "HTTP header name"},
		{"a default plan no tier could have", func(c *Config) { c.Identity.DefaultPlan = "free plan" }, "identity.defaultPlan", "plan name"},
		{"an issuer without a key source", func(c *Config) { c.Identity.JWT.Issuer = "https://auth" }, "identity.jwt.issuer", "requires identity.jwt.jwksFile"},
		{"a plan claim without a key source", func(c *Config) { c.Identity.JWT.PlanClaim = "plan" }, "identity.jwt.planClaim", "requires identity.jwt.jwksFile"},
		{"a user claim without a key source", func(c *Config) { c.Identity.JWT.UserClaim = "email" }, "identity.jwt.userClaim", "requires identity.jwt.jwksFile"},
		{"a JWT without issuer", func(c *Config) { c.Identity.JWT.JWKSFile = jwks; c.Identity.JWT.Audience = "a" }, "identity.jwt.issuer", "is required"},
		{"a JWT without audience", func(c *Config) { c.Identity.JWT.JWKSFile = jwks; c.Identity.JWT.Issuer = "i" }, "identity.jwt.audience", "is required"},
		{"a JWKS URL that is no URL", func(c *Config) {
			c.Identity.JWT.JWKSURL = "auth/jwks"
			c.Identity.JWT.Issuer, c.Identity.JWT.Audience = "i", "a"
		}, "identity.jwt.jwksURL", "http:// or https://"},
		{"a leeway of an hour", func(c *Config) {
			c.Identity.JWT.JWKSFile, c.Identity.JWT.Issuer, c.Identity.JWT.Audience = jwks, "i", "a"
			c.Identity.JWT.Leeway = time.Hour
		}, "identity.jwt.leeway", "between 0s and 5m"},
	})
}

func TestProxyCommandRequiresAnUpstream(t *testing.T) {
	t.Setenv(EnvConfig, "")
	parse := func(args ...string) (Config, error) {
		fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
		AddCommandFlags(fs, CommandProxy)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return Load(LoadOptions{Flags: fs, Command: CommandProxy})
	}
	if _, err := parse(); err == nil || !strings.Contains(err.Error(), "proxy.upstream: is required") || !strings.Contains(err.Error(), "--upstream") {
		t.Errorf("proxy without an upstream: %v, want proxy.upstream required, naming --upstream", err)
	}
	c, err := parse("--upstream", "http://vllm:8000", "--routes", "/v1/chat/completions,/v1/completions", "--pass-authorization=false", "--default-plan", "free")
	if err != nil {
		t.Fatalf("proxy with an upstream: %v", err)
	}
	want(t, "proxy.listen", c.Proxy.Listen, ":8000")
	want(t, "ops.addr", c.Ops.Addr, ":9092")
	want(t, "proxy.routes", c.Proxy.Routes, []string{"/v1/chat/completions", "/v1/completions"})
	want(t, "proxy.passAuthorization", c.Proxy.PassAuthorization, false)
	want(t, "identity.defaultPlan", c.Identity.DefaultPlan, "free")
	// serve needs no upstream.
	if err := Default().Validate(); err != nil {
		t.Errorf("the defaults, for serve: %v", err)
	}
	if _, err := parse("--upstream", "http://vllm:8000", "--ops-addr", ":8000"); err == nil || !strings.Contains(err.Error(), "proxy.listen") {
		t.Errorf("ops.addr on proxy.listen's port: %v, want an error", err)
	}
	// The proxy never listens on http.addr: its port is free for ops.addr.
	if _, err := parse("--upstream", "http://vllm:8000", "--ops-addr", ":8080"); err != nil {
		t.Errorf("ops.addr on http.addr's port (:8080), which the proxy does not open: %v, want it accepted", err)
	}
}

// A proxy and a replica run side by side on one host with their defaults:
// no listener of the one is on a port of the other's, the ext_proc
// port of the examples and the chart (:9091) included.
func TestServeAndProxyDefaultsDoNotCollide(t *testing.T) {
	serve, proxy := DefaultFor(CommandServe), DefaultFor(CommandProxy)
	serveAddrs := map[string]string{"http.addr": serve.HTTP.Addr, "ops.addr": serve.Ops.Addr, "admin.addr": serve.Admin.Addr, "extproc.addr (examples)": ":9091"}
	proxyAddrs := map[string]string{"proxy.listen": proxy.Proxy.Listen, "ops.addr": proxy.Ops.Addr}
	for sk, sa := range serveAddrs {
		for pk, pa := range proxyAddrs {
			if sameListener(sa, pa) {
				t.Errorf("serve's %s %s and the proxy's %s %s collide", sk, sa, pk, pa)
			}
		}
	}
	if err := proxy.ValidateProxy(); err == nil || !strings.Contains(err.Error(), "proxy.upstream") {
		t.Errorf("the proxy's defaults: %v, want only proxy.upstream missing", err)
	}
	if err := proxy.Validate(); err != nil {
		t.Errorf("the proxy's defaults: %v", err)
	}
}

func TestIdentityOptions(t *testing.T) {
	c := Default()
	if opts := c.IdentityOptions(); opts.JWT != nil || opts.UserHeader != "X-User-Id" || opts.PlanHeader != "X-Plan" {
		t.Errorf("default identity options %+v, want trusted headers X-User-Id and X-Plan", opts)
	}
	c.Identity.JWT = JWT{JWKSURL: "https://auth/jwks", Issuer: "i", Audience: "a", UserClaim: "sub", PlanClaim: "plan", Leeway: time.Second, CacheTTL: time.Minute}
	opts := c.IdentityOptions()
	if opts.JWT == nil || opts.JWT.JWKSURL != "https://auth/jwks" || opts.JWT.PlanClaim != "plan" || opts.JWT.Leeway != time.Second {
		t.Errorf("JWT identity options %+v, want the configured JWT", opts.JWT)
	}
	// leeway: 0s allows none; it is not taken for unset.
	c.Identity.JWT.Leeway = 0
	if opts := c.IdentityOptions(); opts.JWT.Leeway != identity.NoLeeway {
		t.Errorf("JWT identity options of leeway 0s: leeway %v, want identity.NoLeeway", opts.JWT.Leeway)
	}
}

// identity.pools is a map in the file and key=value pairs in the
// environment, where the source's case is kept (a body field and a claim
// are case-sensitive).
func TestIdentityPoolsLoad(t *testing.T) {
	file := "pools:\n  static:\n    - pool: model\n      keys: {big: 1}\n    - pool: org\n" +
		"identity:\n  pools:\n    model: body:Model\n    org: header:X-Org\n"
	c, err := load(t, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"model": "body:Model", "org": "header:X-Org"}; !maps.Equal(c.Identity.Pools, want) {
		t.Errorf("identity.pools from the file = %v; want %v", c.Identity.Pools, want)
	}
	sources := c.IdentityOptions().Pools
	if len(sources) != 2 || sources[0].String() != "body:Model" || sources[1].String() != "header:X-Org" {
		t.Errorf("IdentityOptions().Pools = %v; want the model's body:Model, then the org's header:X-Org", sources)
	}

	c, err = load(t, file, map[string]string{"LIMITER_IDENTITY_POOLS": " model=body:model , org=value:acme"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"model": "body:model", "org": "value:acme"}; !maps.Equal(c.Identity.Pools, want) {
		t.Errorf("identity.pools from the environment = %v; want %v", c.Identity.Pools, want)
	}
	c, err = load(t, file, map[string]string{"LIMITER_IDENTITY_POOLS": `{"model":"header:x-ai-eg-model"}`})
	if err != nil || !maps.Equal(c.Identity.Pools, map[string]string{"model": "header:x-ai-eg-model"}) {
		t.Errorf("identity.pools as a JSON object = %v, %v", c.Identity.Pools, err)
	}
	for _, bad := range []string{"model", "model=body:model,model=body:x", "=body:model"} {
		if _, err := load(t, file, map[string]string{"LIMITER_IDENTITY_POOLS": bad}); err == nil || !strings.Contains(err.Error(), "LIMITER_IDENTITY_POOLS") {
			t.Errorf("LIMITER_IDENTITY_POOLS=%q: %v; want an error naming the variable", bad, err)
		}
	}
	if c, err := load(t, "proxy:\n  maxBodyBytes: 1048576\n", map[string]string{"LIMITER_IDENTITY_POOLS": ""}); err != nil || c.Proxy.MaxBodyBytes != 1<<20 {
		t.Errorf("proxy.maxBodyBytes: %d, %v; want 1048576", c.Proxy.MaxBodyBytes, err)
	}
	if c := Default(); c.Proxy.MaxBodyBytes != 8<<20 {
		t.Errorf("default proxy.maxBodyBytes %d; want 8 MiB", c.Proxy.MaxBodyBytes)
	}
}

// Four pool sources, the most a request joins, are accepted.
func TestFourPoolSourcesAreAccepted(t *testing.T) {
	c := Default()
	c.Tiers.Source, c.Tiers.Namespace = SourceKubernetes, "default"
	c.Identity.Pools = map[string]string{"a": "value:a", "b": "header:X-B", "c": "body:c", "d": "value:d"}
	if err := c.Validate(); err != nil {
		t.Errorf("four pool sources: %v; want none", err)
	}
}

// An identity claim written empty, or as its default, with no source to
// read it from is a value left unset (generated configs write them so):
// it loads, where another value is refused (TestProxyAndIdentityValidation,
// TestExtProcValidation).
func TestUnsetIdentityClaimsLoadWithoutTheirSource(t *testing.T) {
	for _, file := range []string{
		"identity:\n  jwt:\n    userClaim: \"\"\n",
		"identity:\n  jwt:\n    userClaim: sub\n",
		"identity:\n  jwtPayload:\n    userClaim: \"\"\n",
		"identity:\n  jwtPayload:\n    userClaim: sub\n",
	} {
		if _, err := load(t, file, nil); err != nil {
			t.Errorf("%q: %v; want it loaded, the claim unset", file, err)
		}
	}
}
