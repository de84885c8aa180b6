package config

import (
	"strconv"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/extproc"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/tiers"
)

// ExtProc is the Envoy external processor that `limiter serve` offers
// beside its HTTP API (docs/envoy.md).
type ExtProc struct {
	// Addr is the gRPC listen address, host:port, of
	// envoy.service.ext_proc.v3.ExternalProcessor and grpc.health.v1.
	// It authenticates callers as the slot API does (api.tokensFile, and
	// http.tls.* for TLS and client certificates). Default "": off.
	Addr string `mapstructure:"addr"`
	// StreamIDHeader names the header carrying the slot's stream id to the
	// upstream and back to the client. Default "x-limiter-stream-id".
	StreamIDHeader string `mapstructure:"streamIdHeader"`
	// KeepaliveTime is how long a connection may be silent before the
	// server pings Envoy; KeepaliveTimeout how long the ping may go
	// unanswered before the connection is closed and its streams' slots
	// released. Defaults 30s and 10s.
	KeepaliveTime    time.Duration `mapstructure:"keepaliveTime"`
	KeepaliveTimeout time.Duration `mapstructure:"keepaliveTimeout"`
	// MinPingInterval is the most often Envoy may ping (its HTTP/2
	// connection_keepalive interval must not be shorter); a client pinging
	// more often is disconnected. Default 5s.
	MinPingInterval time.Duration `mapstructure:"minPingInterval"`
	// Wait is how long a request whose user holds every slot of its plan
	// may wait for one to free up, first come first served across the
	// replicas, before it is refused with 429; the plan's maxWait caps it
	// (a plan without one never waits). A waiting request extends Envoy's
	// message timer by its wait plus 1s (override_message_timeout), which
	// Envoy honours up to the filter's max_message_timeout. Default 0s:
	// refused at once.
	Wait time.Duration `mapstructure:"wait"`
}

// JWTPayload takes identities from the payload of a JWT that Envoy's
// jwt_authn filter has verified, rather than from the user and plan
// headers (exclusive with identity.jwt).
type JWTPayload struct {
	// Header names the header jwt_authn forwards the payload in
	// (forward_payload_header), base64url JSON. Trusted as it comes.
	// Default "".
	Header string `mapstructure:"header"`
	// MetadataKey is jwt_authn's payload_in_metadata: the ext_proc server
	// reads the payload from the dynamic metadata Envoy forwards (the
	// filter's metadata_options.forwarding_namespaces must list
	// MetadataNamespace). Default "": not read.
	MetadataKey string `mapstructure:"metadataKey"`
	// MetadataNamespace is the namespace of MetadataKey. Default
	// "envoy.filters.http.jwt_authn".
	MetadataNamespace string `mapstructure:"metadataNamespace"`
	// UserClaim holds the user id; dots reach into objects. Default "sub";
	// another needs Header or MetadataKey.
	UserClaim string `mapstructure:"userClaim"`
	// PlanClaim holds the plan. Default "": identity.defaultPlan; set, it
	// needs Header or MetadataKey.
	PlanClaim string `mapstructure:"planClaim"`
}

// Enabled reports whether identities come from a verified payload.
func (p JWTPayload) Enabled() bool { return p.Header != "" || p.MetadataKey != "" }

func defaultExtProc() ExtProc {
	return ExtProc{
		StreamIDHeader: extproc.DefaultStreamIDHeader,
		KeepaliveTime:  extproc.DefaultKeepaliveTime, KeepaliveTimeout: extproc.DefaultKeepaliveTimeout,
		MinPingInterval: extproc.DefaultMinPingInterval,
	}
}

func defaultJWTPayload() JWTPayload {
	return JWTPayload{MetadataNamespace: extproc.DefaultPayloadNamespace, UserClaim: identity.DefaultUserClaim}
}

// ExtProcOptions returns the options of extproc.New that come from the
// configuration; the caller adds the tiers, callers, logger and telemetry.
func (c Config) ExtProcOptions() extproc.Options {
	e, p := c.ExtProc, c.Identity.JWTPayload
	return extproc.Options{
		StreamIDHeader: strings.ToLower(e.StreamIDHeader),
		PayloadKey:     p.MetadataKey, PayloadNamespace: p.MetadataNamespace,
		KeepaliveTime: e.KeepaliveTime, KeepaliveTimeout: e.KeepaliveTimeout, MinPingInterval: e.MinPingInterval,
		MaxBodyBytes: int(c.Proxy.MaxBodyBytes), // the body a body: source reads, whichever front end reads it
	}
}

// payloadOptions returns identity.Options.Payload; nil when off.
func (p JWTPayload) payloadOptions() *identity.Payload {
	if !p.Enabled() {
		return nil
	}
	return &identity.Payload{Header: p.Header, UserClaim: p.UserClaim, PlanClaim: p.PlanClaim}
}

func (c Config) validateExtProc(v *validator) {
	e := c.ExtProc
	if e.Addr != "" {
		v.listenAddr("extproc.addr", e.Addr)
		others := []struct{ key, addr string }{{"http.addr", c.HTTP.Addr}, {"ops.addr", c.Ops.Addr}}
		if c.Admin.TokensFile != "" {
			others = append(others, struct{ key, addr string }{"admin.addr", c.Admin.Addr})
		}
		for _, other := range others {
			if sameListener(e.Addr, other.addr) {
				v.add("extproc.addr", "must not be the address of "+other.key+" ("+other.addr+")", strconv.Quote(e.Addr))
			}
		}
	}
	if e.Wait < 0 || e.Wait > tiers.MaxMaxWait {
		v.add("extproc.wait", "must be between 0s (no waiting) and 60s (the plan's maxWait caps it)", e.Wait.String())
	}
	if !identity.ValidHeaderName(e.StreamIDHeader) {
		v.add("extproc.streamIdHeader", "must be an HTTP header name", strconv.Quote(e.StreamIDHeader))
	}
	for _, d := range []struct {
		key   string
		value time.Duration
	}{
		{"extproc.keepaliveTime", e.KeepaliveTime},
		{"extproc.keepaliveTimeout", e.KeepaliveTimeout},
		{"extproc.minPingInterval", e.MinPingInterval},
	} {
		if d.value <= 0 {
			v.add(d.key, "must be > 0", d.value.String())
		}
	}

	p := c.Identity.JWTPayload
	if !p.Enabled() {
		// The claims would be ignored, and identities taken from the user
		// and plan headers: refused, as identity.jwt's are without a key
		// source.
		for _, s := range []setting{{"identity.jwtPayload.userClaim", p.UserClaim != "" && p.UserClaim != identity.DefaultUserClaim}, {"identity.jwtPayload.planClaim", p.PlanClaim != ""}} {
			if s.set {
				v.add(s.key, "requires identity.jwtPayload.header or identity.jwtPayload.metadataKey (without a payload source no claim is read, and identities come from the user and plan headers)", "")
			}
		}
		return
	}
	if c.Identity.JWT.Enabled() {
		v.add("identity.jwtPayload", "is a second source of identity beside identity.jwt; configure one "+
			"(identity.jwt when the limiter verifies tokens itself, identity.jwtPayload when Envoy's jwt_authn does)", "")
	}
	if p.Header != "" && !identity.ValidHeaderName(p.Header) {
		v.add("identity.jwtPayload.header", "must be an HTTP header name", strconv.Quote(p.Header))
	}
	if p.MetadataKey != "" && strings.TrimSpace(p.MetadataNamespace) == "" {
		v.add("identity.jwtPayload.metadataNamespace", "must not be empty with identity.jwtPayload.metadataKey", "")
	}
	if strings.TrimSpace(p.UserClaim) == "" {
		v.add("identity.jwtPayload.userClaim", "must not be empty", "")
	}
}
