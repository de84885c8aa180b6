package extproc

import (
	"context"
	"crypto/tls"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/server"
)

// headerMap reads the headers of an ext_proc message as identity.Headers:
// Envoy lower-cases their names and puts each value in raw_value (older
// versions in value). A header Envoy holds more than once comes as one
// entry per value (an appending request_headers_to_add, a client's
// repeated field line): Get returns the first, as http.Header.Get does,
// and Values all of them. Names are matched without regard to case, so
// that no entry escapes Values by its spelling.
type headerMap struct{ m *corev3.HeaderMap }

func (h headerMap) Get(name string) string {
	name = envoyName(name)
	for _, hv := range h.m.GetHeaders() {
		if strings.EqualFold(hv.GetKey(), name) {
			return valueOf(hv)
		}
	}
	return ""
}

func (h headerMap) Values(name string) []string {
	name = envoyName(name)
	var values []string
	for _, hv := range h.m.GetHeaders() {
		if strings.EqualFold(hv.GetKey(), name) {
			values = append(values, valueOf(hv))
		}
	}
	return values
}

// envoyName is the name Envoy gives a header: Host is :authority (HTTP/1's
// Host header included), so that a pool keyed by header:Host reads it.
func envoyName(name string) string {
	if strings.EqualFold(name, "Host") {
		return ":authority"
	}
	return name
}

func valueOf(hv *corev3.HeaderValue) string {
	if raw := hv.GetRawValue(); len(raw) > 0 {
		return string(raw)
	}
	return hv.GetValue()
}

// payloadClaims returns the verified JWT payload in md's filter metadata
// under namespace and key, as jwt_authn's payload_in_metadata puts it.
func payloadClaims(md *corev3.Metadata, namespace, key string) (map[string]any, bool) {
	v, ok := md.GetFilterMetadata()[namespace].GetFields()[key]
	if !ok || v.GetStructValue() == nil {
		return nil, false
	}
	return v.GetStructValue().AsMap(), true
}

// metadataCarrier reads a trace context from gRPC metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// authenticate returns the caller of a gRPC stream: by its client
// certificate over mutual TLS, else by the bearer token of its
// authorization metadata (Envoy's grpc_service.initial_metadata).
func (s *Server) authenticate(ctx context.Context) (server.Caller, error) {
	var state *tls.ConnectionState
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			state = &info.State
		}
	}
	var authorization []string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		authorization = md.Get("authorization")
	}
	return s.opts.Callers.Authenticate(state, authorization...)
}

// grantHeaders are the request headers set for the upstream on st's
// grant, each replacing the client's: the stream id and, with identities
// from a JWT (or its payload), the user and plan headers carrying the
// user and plan the limiter counted, so that an upstream reading them
// never sees the client's own.
func (s *Server) grantHeaders(st *hold.Stream) []*corev3.HeaderValueOption {
	set := []*corev3.HeaderValueOption{header(s.opts.StreamIDHeader, st.ID())}
	if user, plan, ok := s.identityHeaders(); ok {
		set = append(set, header(user, st.UserID()), header(plan, st.Plan()))
	}
	return set
}

// identityHeaders returns the names of the user and plan headers, in
// lower case as Envoy holds them, when they name no identity (ok: the
// identity is a JWT's).
func (s *Server) identityHeaders() (user, plan string, ok bool) {
	if !s.ident.UsesJWT() && !s.ident.UsesPayload() {
		return "", "", false
	}
	user, plan = s.ident.Headers()
	return strings.ToLower(user), strings.ToLower(plan), true
}
