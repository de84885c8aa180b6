package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		{"a label header with a colon", func(c *Config) { c.Proxy.LabelHeader = "X-Model:" }, "proxy.labelHeader", "HTTP header name, or empty for no label"},
		{"a missing CA file", func(c *Config) { c.Proxy.UpstreamCAFile = "/nonexistent/ca.pem" }, "proxy.upstreamCAFile", "readable file"},
		{"a header name with a space", func(c *Config) { c.Identity.UserHeader = "X User" }, "identity.userHeader", "HTTP header name"},
		{"a default plan no tier could have", func(c *Config) { c.Identity.DefaultPlan = "free plan" }, "identity.defaultPlan", "plan name"},
		{"an issuer without a key source", func(c *Config) { c.Identity.JWT.Issuer = "https://auth" }, "identity.jwt.issuer", "requires identity.jwt.jwksFile"},
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
}
