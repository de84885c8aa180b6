package config

import (
	"strings"
	"testing"
	"time"
)

func TestExtProcValidation(t *testing.T) {
	checkEdits(t, []editCase{
		{"an address that is no host:port", func(c *Config) { c.ExtProc.Addr = "9091" }, "extproc.addr", "host:port"},
		{"the API's address", func(c *Config) { c.ExtProc.Addr = ":8080" }, "extproc.addr", "http.addr"},
		{"the ops address", func(c *Config) { c.ExtProc.Addr = ":9090" }, "extproc.addr", "ops.addr"},
		{"a stream id header with a space", func(c *Config) { c.ExtProc.StreamIDHeader = "x stream" }, "extproc.streamIdHeader", "HTTP header name"},
		{"no keepalive", func(c *Config) { c.ExtProc.KeepaliveTime = 0 }, "extproc.keepaliveTime", "must be > 0"},
		{"no ping interval", func(c *Config) { c.ExtProc.MinPingInterval = -time.Second }, "extproc.minPingInterval", "must be > 0"},
		{"a wait above 60s", func(c *Config) { c.ExtProc.Wait = 90 * time.Second }, "extproc.wait", "must be between 0s (no waiting) and 60s"},
		{"a negative wait", func(c *Config) { c.ExtProc.Wait = -time.Second }, "extproc.wait", "must be between 0s (no waiting) and 60s"},
		{"a payload beside a JWT", func(c *Config) {
			c.Identity.JWT.JWKSURL, c.Identity.JWT.Issuer, c.Identity.JWT.Audience = "https://auth/jwks", "i", "a"
			c.Identity.JWTPayload.Header = "x-jwt-payload"
		}, "identity.jwtPayload", "second source"},
		{"a payload header with a colon", func(c *Config) { c.Identity.JWTPayload.Header = "x:payload" }, "identity.jwtPayload.header", "HTTP header name"},
		{"a metadata key without a namespace", func(c *Config) {
			c.Identity.JWTPayload.MetadataKey, c.Identity.JWTPayload.MetadataNamespace = "jwt_payload", " "
		}, "identity.jwtPayload.metadataNamespace", "must not be empty"},
		// Without a payload source no claim is read: identities would come
		// from the user and plan headers, the claims silently ignored.
		{"a payload plan claim without a payload source", func(c *Config) { c.Identity.JWTPayload.PlanClaim = "plan" },
			"identity.jwtPayload.planClaim", "requires identity.jwtPayload.header or identity.jwtPayload.metadataKey"},
		{"a payload user claim without a payload source", func(c *Config) { c.Identity.JWTPayload.UserClaim = "email" },
			"identity.jwtPayload.userClaim", "requires identity.jwtPayload.header or identity.jwtPayload.metadataKey"},
	})
}

func TestExtProcOptions(t *testing.T) {
	c, err := load(t, "extproc:\n  addr: \":9091\"\n  streamIdHeader: X-Stream\nproxy:\n  maxBodyBytes: 65536\nidentity:\n  jwtPayload:\n    metadataKey: jwt_payload\n    planClaim: plan\n", nil,
		"--extproc-addr", "127.0.0.1:9191", "--extproc-wait", "15s")
	if err != nil {
		t.Fatal(err)
	}
	want(t, "extproc.addr", c.ExtProc.Addr, "127.0.0.1:9191")
	want(t, "extproc.wait", c.ExtProc.Wait, 15*time.Second)
	opts := c.ExtProcOptions()
	want(t, "StreamIDHeader", opts.StreamIDHeader, "x-stream")
	want(t, "PayloadKey", opts.PayloadKey, "jwt_payload")
	want(t, "PayloadNamespace", opts.PayloadNamespace, "envoy.filters.http.jwt_authn")
	want(t, "KeepaliveTime", opts.KeepaliveTime, 30*time.Second)
	want(t, "MaxBodyBytes", opts.MaxBodyBytes, 65536) // proxy.maxBodyBytes: a body: source's bound, in both front ends
	p := c.IdentityOptions().Payload
	if p == nil || p.Header != "" || p.UserClaim != "sub" || p.PlanClaim != "plan" {
		t.Errorf("identity payload options %+v, want claims sub and plan from metadata", p)
	}
	// The proxy receives no metadata: a payload it could never read is refused.
	if err := c.ValidateProxy(); err == nil || !strings.Contains(err.Error(), "identity.jwtPayload.metadataKey") {
		t.Errorf("ValidateProxy with a metadata-only payload: %v, want an error naming identity.jwtPayload.metadataKey", err)
	}
	// Nor does it serve ext_proc: an Envoy pointed at extproc.addr would
	// find nothing there.
	if err := c.ValidateProxy(); err == nil || !strings.Contains(err.Error(), "extproc.addr") || !strings.Contains(err.Error(), "`limiter serve` only") {
		t.Errorf("ValidateProxy with extproc.addr set: %v, want an error naming extproc.addr", err)
	}
	c.ExtProc.Addr = ""
	if err := c.ValidateProxy(); err != nil && strings.Contains(err.Error(), "extproc.addr") {
		t.Errorf("ValidateProxy without extproc.addr: %v, want no error naming it", err)
	}
	// Nor does it name callers by their certificates (serve's mutual TLS,
	// which needs api.tokensFile): unsetting the CA is the one way out.
	mtls := c
	mtls.HTTP.TLS.ClientCAFile = "/etc/limiter/tls/ca.pem"
	if err := mtls.ValidateProxy(); err == nil || !strings.Contains(err.Error(), "http.tls.clientCAFile") || !strings.Contains(err.Error(), "`limiter serve` only") {
		t.Errorf("ValidateProxy with http.tls.clientCAFile set: %v, want an error naming it", err)
	}
	// Nor does it ask for tokens: an operator setting a tokens file would
	// take the proxy's callers for authenticated.
	for _, key := range []string{"api.tokensFile", "admin.tokensFile"} {
		c := c
		if key == "api.tokensFile" {
			c.API.TokensFile = "/etc/limiter/api/tokens"
		} else {
			c.Admin.TokensFile = "/etc/limiter/admin/tokens"
		}
		if err := c.ValidateProxy(); err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "`limiter serve` only") {
			t.Errorf("ValidateProxy with %s set: %v, want an error naming it", key, err)
		}
	}
}
