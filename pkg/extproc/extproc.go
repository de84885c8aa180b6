// Package extproc is the limiter as an Envoy external processor: the
// envoy.service.ext_proc.v3.ExternalProcessor gRPC service that `limiter
// serve` offers on extproc.addr. Envoy opens one gRPC stream per HTTP
// stream it sends through the ext_proc filter, and the stream lives as
// long as the HTTP stream does, so one slot is held per gRPC stream:
//
//   - request_headers: the identity (pkg/identity) is resolved and a slot
//     acquired (pkg/hold). Refused: an ImmediateResponse (429 with
//     Retry-After at the limit; 401, 403, 422, 503 otherwise) with an
//     OpenAI-shaped JSON body. Granted: CONTINUE, with the stream id in a
//     header added for the upstream. With a wait (extproc.wait, the
//     holder's) the request may first wait in the user's queue, having
//     extended Envoy's message timer (wait.go).
//   - request_body, when a pool's key comes from the body (identity
//     body: sources) and the request has one: the request headers only
//     resolve the identity (CONTINUE, no slot yet); the body (BUFFERED:
//     one message; STREAMED: chunks up to MaxBodyBytes, else 413) decides
//     as above, its answer carrying the stream id; a bad body is 400.
//   - response_headers, response_body chunks, response_trailers: CONTINUE,
//     the response headers carrying the stream id to the client, and on a
//     shadow grant (a scope with enforce: false would have refused it)
//     x-limiter-would-refuse (hold.WouldRefuse);
//     the holder's batched heartbeat keeps the slot alive, a body chunk
//     marks the stream active, and the response's end of stream (or its
//     trailers) releases the slot.
//   - the gRPC stream ending first (the client went away, Envoy closed or
//     reset the stream, restarted, or gave up on a message timeout)
//     releases it too.
//
// The processing mode Envoy needs is request headers SEND, and request
// body BUFFERED with a body: pool source; everything else is optional
// (see docs/envoy.md).
package extproc

import (
	"errors"
	"log/slog"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/ratelog"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Defaults of Options.
const (
	DefaultStreamIDHeader   = "x-limiter-stream-id"
	DefaultPayloadNamespace = "envoy.filters.http.jwt_authn"
	DefaultMaxBodyBytes     = 8 << 20
	// DefaultKeepaliveTime is how long a connection may be silent before
	// the server pings it; DefaultKeepaliveTimeout how long it then waits
	// for the answer before it closes the connection, and so ends (and
	// releases) every stream on it: a dead Envoy behind a silent network
	// holds no slot for longer than their sum plus a slot TTL.
	DefaultKeepaliveTime    = 30 * time.Second
	DefaultKeepaliveTimeout = 10 * time.Second
	// DefaultMinPingInterval is the most often a client may ping; a client
	// pinging more often is sent GOAWAY. Keep Envoy's HTTP/2
	// connection_keepalive interval above it.
	DefaultMinPingInterval = 5 * time.Second
)

// warnEvery bounds the repeated lines (failed authentication, streams
// without request headers, acquires that failed).
const warnEvery = 10 * time.Second

// tracerName is the instrumentation scope of the per-stream spans.
const tracerName = "github.com/joishi/limiter/pkg/extproc"

// Options configure a Server. Zero values take the documented defaults.
type Options struct {
	// Tiers is the table the limiter enforces: gRPC health answers
	// SERVING once it has synced. Required.
	Tiers *tiers.Table
	// Callers, when set, authenticates every gRPC stream as the slot API
	// authenticates a request (a bearer token in the authorization
	// metadata, or a client certificate over mutual TLS) and scopes it to
	// the caller's plans. Default nil: any caller, every plan.
	Callers *server.Callers
	// StreamIDHeader names the header that carries the slot's stream id
	// to the upstream (added to the request) and to the client (added to
	// the response). Default "x-limiter-stream-id".
	StreamIDHeader string
	// PayloadKey, when set, is where a verified JWT payload is looked for
	// in the dynamic metadata Envoy forwards: the struct under
	// PayloadNamespace's key PayloadKey (jwt_authn's payload_in_metadata).
	// Found, it decides the identity (identity.Resolver.FromClaims, which
	// needs identity.Options.Payload); absent, the headers do. Default "":
	// metadata is not read.
	PayloadKey string
	// PayloadNamespace is the metadata namespace of PayloadKey. Default
	// "envoy.filters.http.jwt_authn".
	PayloadNamespace string
	// Keepalive of the gRPC connections: KeepaliveTime (default 30s) of
	// silence before a ping, KeepaliveTimeout (default 10s) for its
	// answer, MinPingInterval (default 5s) the most often a client may
	// ping.
	KeepaliveTime, KeepaliveTimeout, MinPingInterval time.Duration
	// MaxBodyBytes bounds the request body read to find a pool's key
	// (identity body: sources); a larger one is refused with 413. Envoy's
	// own buffer limit (per_connection_buffer_limit_bytes) bounds a
	// BUFFERED body first. Default 8 MiB.
	MaxBodyBytes int
	// Logger receives stream grants and ends, and failures. Default
	// slog.Default().
	Logger *slog.Logger
	// TracerProvider receives a span per Envoy stream. Default: none.
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context Envoy sends in the gRPC metadata.
	// Default: W3C trace context.
	Propagator propagation.TextMapPropagator
}

// Server is the ext_proc service. Serve it with Run.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	holder *hold.Holder
	ident  *identity.Resolver
	opts   Options
	log    *slog.Logger
	tracer trace.Tracer

	// Rate-limited warnings: one caller's bad token or one filter's bad
	// processing mode repeats on every request.
	authWarn *ratelog.Logger
	modeWarn *ratelog.Logger
	// failed logs acquires that failed past any refusal (Redis refusing
	// the scripts): in a misconfiguration every request fails alike.
	failed *ratelog.Logger

	stopping chan struct{} // closed when the drain's grace is over
}

// New returns a Server that holds its streams' slots with h (whose
// Options.Mode should be "extproc") and resolves identities with ident.
func New(h *hold.Holder, ident *identity.Resolver, opts Options) (*Server, error) {
	if h == nil || ident == nil {
		return nil, errors.New("extproc: a holder and an identity resolver are required")
	}
	if opts.Tiers == nil {
		return nil, errors.New("extproc: Options.Tiers is required")
	}
	if opts.PayloadKey != "" && !ident.UsesPayload() {
		return nil, errors.New("extproc: a payload metadata key needs an identity resolver reading verified JWT payloads (identity.Options.Payload)")
	}
	if opts.StreamIDHeader == "" {
		opts.StreamIDHeader = DefaultStreamIDHeader
	}
	if opts.PayloadNamespace == "" {
		opts.PayloadNamespace = DefaultPayloadNamespace
	}
	if opts.KeepaliveTime <= 0 {
		opts.KeepaliveTime = DefaultKeepaliveTime
	}
	if opts.KeepaliveTimeout <= 0 {
		opts.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if opts.MinPingInterval <= 0 {
		opts.MinPingInterval = DefaultMinPingInterval
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.TracerProvider == nil {
		opts.TracerProvider = noop.NewTracerProvider()
	}
	if opts.Propagator == nil {
		opts.Propagator = propagation.TraceContext{}
	}
	return &Server{
		holder: h, ident: ident, opts: opts, log: opts.Logger,
		tracer:   opts.TracerProvider.Tracer(tracerName),
		authWarn: ratelog.New(opts.Logger, warnEvery),
		modeWarn: ratelog.New(opts.Logger, warnEvery),
		failed:   ratelog.New(opts.Logger, warnEvery),
		stopping: make(chan struct{}),
	}, nil
}
