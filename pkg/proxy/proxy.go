// Package proxy is `limiter proxy`: a reverse proxy that caps the
// concurrent streams of each user in front of any HTTP streaming endpoint
// (an OpenAI-compatible server, vLLM, an internal gateway). Each request
// on a limited route resolves its identity (pkg/identity), holds a slot
// for as long as its response streams (pkg/hold), and is proxied with
// immediate flushing; everything else passes through untouched.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/ratelog"
	"github.com/joishi/limiter/pkg/route"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// HeaderStreamID carries the slot's stream id to the upstream and back to
// the client, so that the logs of every side join on it.
const HeaderStreamID = "X-Limiter-Stream-Id"

// Defaults of Options.
const (
	// DefaultLabelHeader is the header whose value labels the slot.
	DefaultLabelHeader           = "X-Limiter-Label"
	DefaultMaxHeaderBytes        = 32 << 10
	DefaultMaxBodyBytes          = 8 << 20
	DefaultDialTimeout           = 5 * time.Second
	DefaultTLSHandshakeTimeout   = 5 * time.Second
	DefaultResponseHeaderTimeout = 5 * time.Minute
	DefaultIdleConnTimeout       = 90 * time.Second
	// DefaultStallTimeout is how long a write to a limited request's
	// client may block: a slot's default TTL, the time after which a
	// client that crashed would have lost its slot anyway.
	DefaultStallTimeout = 2 * time.Minute
)

// Options configure a Proxy. Zero values take the documented defaults.
type Options struct {
	// Upstream is where requests go: scheme, host and an optional path
	// prefix (http://vllm:8000, https://gateway.internal/openai).
	// Required.
	Upstream *url.URL
	// Routes are the path prefixes whose requests hold a slot
	// ("/v1/chat/completions"), each a plain path (route.Check). A route
	// holds its path and what lies under it on a segment boundary
	// (/v1/chat holds /v1/chat/x, not /v1/chatty), however the client
	// spells it: case aside, and by any reading of the path that the
	// upstream may take (pkg/route). A target with an opaque part, which
	// names no path to judge (x:http:/v1/chat/completions), is refused
	// 400 invalid_target on any route. Default none: every request holds
	// one.
	Routes []string
	// LabelHeader names the request header whose value becomes the
	// slot's label (limiter.AcquireRequest.Label): what support sees
	// beside the stream, e.g. the model or the calling pod. A value the
	// limiter refuses as a label (over 128 bytes, whitespace or control
	// characters), or the header sent more than once, is answered 400
	// invalid_label, before any slot. Default "": no
	// label (config's proxy.labelHeader defaults to DefaultLabelHeader).
	// With no label in the header, a key that a body source read (the
	// model, with body:model) labels the slot.
	LabelHeader string
	// StripAuthorization removes the client's Authorization header before
	// the request goes upstream (set it when the token is for the proxy
	// only). Default false: it is passed on.
	StripAuthorization bool
	// MaxHeaderBytes bounds a request's header lines; a request over it is
	// refused with 431 and a JSON error, before any slot. Default 32 KiB.
	MaxHeaderBytes int
	// MaxBodyBytes bounds the request body the proxy buffers when a pool's
	// key comes from it (the resolver's body sources): a larger one is
	// refused with 413 and a JSON error, before any slot. Requests are
	// buffered only then, and only on limited routes. Default 8 MiB.
	MaxBodyBytes int64
	// Transport sends requests upstream. Default: NewTransport with the
	// timeouts below.
	Transport http.RoundTripper
	// Timeouts of the default Transport: dialling, the TLS handshake, the
	// wait for the response headers (a non-streaming completion sends them
	// only once it is done), and how long an idle upstream connection is
	// kept. Defaults 5s, 5s, 5m, 90s.
	DialTimeout           time.Duration
	TLSHandshakeTimeout   time.Duration
	ResponseHeaderTimeout time.Duration
	IdleConnTimeout       time.Duration
	// StallTimeout bounds each write of a limited request's response to
	// its client: a client that reads nothing for that long (its
	// connection open, its buffers full) has its stream cut and its slot
	// released, as one that went away, rather than holding the slot and
	// its pool places for as long as the connection stays open. Default
	// DefaultStallTimeout; negative: never cut.
	StallTimeout time.Duration
	// Tiers is the table the limiter enforces; /readyz waits for it to
	// sync. Required.
	Tiers *tiers.Table
	// Warmed reports whether the Redis client has warmed up (learnt the
	// cluster's slots, dialled every node, loaded the scripts) or given up
	// within its bound (cluster.Client.Warmed): /readyz waits for it, so a
	// new replica's first streams are neither unenforced nor slow; and,
	// with redis.requiredForReadiness, Redis's first answer too. It must
	// stay true once true. Default nil: not waited for.
	Warmed func() bool
	// Logger receives stream grants, ends and upstream failures. Default
	// slog.Default().
	Logger *slog.Logger
	// MeterProvider receives limiter_proxy_upstream_errors_total. Default:
	// none recorded.
	MeterProvider metric.MeterProvider
	// Propagator writes the trace context into the upstream request.
	// Default: W3C trace context.
	Propagator propagation.TextMapPropagator
	// Middleware wraps the proxy's handler (tracing and HTTP metrics).
	// Default none.
	Middleware func(http.Handler) http.Handler
	// Metrics serves GET /metrics on the ops listener. Default: 404.
	Metrics http.Handler
}

// Proxy is the handler of `limiter proxy`.
type Proxy struct {
	holder *hold.Holder
	ident  *identity.Resolver
	routes route.Set
	// under are the routes under the upstream's own path (base), for an
	// upstream such as http://gw/openai: see New.
	under route.Set
	base  string
	opts  Options
	log   *slog.Logger
	// failed logs acquires that failed past any refusal (Redis refusing
	// the scripts) at most once per failedEvery: in a misconfiguration
	// every request fails alike.
	failed   *ratelog.Logger
	rp       *httputil.ReverseProxy
	upErrors metric.Int64Counter
	phases   map[string]metric.MeasurementOption
	draining atomic.Bool
}

// New returns a Proxy that holds its streams' slots with h and resolves
// identities with ident.
func New(h *hold.Holder, ident *identity.Resolver, opts Options) (*Proxy, error) {
	if opts.Upstream == nil || opts.Upstream.Host == "" || (opts.Upstream.Scheme != "http" && opts.Upstream.Scheme != "https") {
		return nil, fmt.Errorf("proxy: the upstream must be an http:// or https:// URL with a host, got %v", opts.Upstream)
	}
	if opts.Tiers == nil {
		return nil, errors.New("proxy: Options.Tiers is required")
	}
	routes, err := route.New(opts.Routes)
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	if opts.MaxHeaderBytes <= 0 {
		opts.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.StallTimeout == 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = noop.NewMeterProvider()
	}
	if opts.Propagator == nil {
		opts.Propagator = propagation.TraceContext{}
	}
	if opts.Transport == nil {
		t, err := NewTransport(TransportOptions{
			DialTimeout: opts.DialTimeout, TLSHandshakeTimeout: opts.TLSHandshakeTimeout,
			ResponseHeaderTimeout: opts.ResponseHeaderTimeout, IdleConnTimeout: opts.IdleConnTimeout,
		})
		if err != nil {
			return nil, err
		}
		opts.Transport = t
	}
	p := &Proxy{holder: h, ident: ident, routes: routes, opts: opts, log: opts.Logger,
		failed: ratelog.New(opts.Logger, failedEvery)}
	// An upstream under a path (http://gw/openai) reads a request's path
	// after its own, and resolves a dot-dot across both:
	// /../openai/v1/chat/completions reaches its /openai/v1/chat/completions.
	// A request is judged as that upstream reads it too, against the
	// routes under its path.
	if base := strings.TrimRight(opts.Upstream.EscapedPath(), "/"); base != "" && len(opts.Routes) > 0 {
		under := make([]string, len(opts.Routes))
		for i, r := range opts.Routes {
			under[i] = base + r
		}
		if p.under, err = route.New(under); err != nil {
			return nil, fmt.Errorf("proxy: the upstream's path %q with the routes: %w", base, err)
		}
		p.base = base
	}
	p.upErrors, err = opts.MeterProvider.Meter(meterName).Int64Counter("limiter.proxy.upstream.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Requests the upstream failed, by phase: response (no response: refused, timed out; answered 502 or 504) or body (the response broke off mid-stream)."))
	if err != nil {
		return nil, err
	}
	p.phases = map[string]metric.MeasurementOption{}
	for _, phase := range []string{phaseResponse, phaseBody} {
		p.phases[phase] = metric.WithAttributeSet(attribute.NewSet(attribute.String("phase", phase)))
		// At 0 from the start: rate() cannot see a series' first value.
		p.upErrors.Add(context.Background(), 0, p.phases[phase])
	}
	p.rp = p.reverseProxy()
	return p, nil
}

// meterName is the instrumentation scope of the proxy's own metrics.
const meterName = "github.com/joishi/limiter/pkg/proxy"

// failedEvery bounds the "acquire failed" lines, as serve bounds its
// "request failed" ones (docs/observability.md).
const failedEvery = 10 * time.Second

// Handler returns the proxy's handler, wrapped in Options.Middleware.
func (p *Proxy) Handler() http.Handler {
	var h http.Handler = http.HandlerFunc(p.serve)
	if p.opts.Middleware != nil {
		h = p.opts.Middleware(h)
	}
	return h
}

// limited reports whether r holds a slot. Its path is judged as the
// client sent it (RequestURI: raw, in origin form) and as it goes
// upstream (net/http re-escapes a path whose escaping it finds odd, and
// may so turn a %2F beside a backslash into a slash); either one under a
// route holds one.
func (p *Proxy) limited(r *http.Request) bool {
	if len(p.opts.Routes) == 0 {
		return true
	}
	return p.routes.Match(r.RequestURI) || p.routes.Match(r.URL.EscapedPath()) ||
		p.under.Match(p.base+r.URL.EscapedPath()) || strings.HasPrefix(r.RequestURI, "/") && p.under.Match(p.base+r.RequestURI)
}

// preflight reports whether r is a browser's CORS preflight: OPTIONS
// with an Origin and an Access-Control-Request-Method, which a browser
// sends, without credentials, before a page's cross-origin POST. No
// server streams in answer to one, and refusing it (401: no identity)
// would keep every page on another origin from calling the route at
// all: it goes upstream without an identity or a slot, and the POST that
// follows holds one.
//
// A preflight has no body (an OPTIONS with one is a request like any
// other, limited), and its answer is relayed without one (see
// modifyResponse): an upstream that serves the route for any method
// streams nothing to a hostile client through it.
func preflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != "" &&
		r.ContentLength == 0 && len(r.TransferEncoding) == 0
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	// What the upstream will not receive is not read: neither a preflight's
	// headers nor the identity, pool keys and label below.
	dropConnectionHeaders(r.Header)
	switch {
	case r.URL.Opaque != "":
		// x:http:/v1/chat/completions: net/http keeps http:/v1/... as the
		// URL's opaque part, with no path to judge, and the reverse proxy
		// sends it upstream as the target, which a server may well read
		// as /v1/chat/completions. No client means it: refused, before
		// any route is judged.
		p.holder.Refused(r.Context(), hold.ReasonInvalid)
		hold.Refused(http.StatusBadRequest, hold.TypeInvalidRequest, hold.CodeInvalidTarget,
			"the request target must be a path in origin form (/v1/chat/completions) or an absolute http(s):// URL, got "+
				strconv.Quote(r.RequestURI)).Write(w)
		return
	case !p.limited(r):
		p.forward(w, r, noEnd)
		return
	case preflight(r):
		p.forward(w, r.WithContext(context.WithValue(r.Context(), preflightKey{}, true)), noEnd)
		return
	}
	ctx := r.Context()
	if n := headerBytes(r); n > p.opts.MaxHeaderBytes {
		p.holder.Refused(ctx, hold.ReasonInvalid)
		hold.Refused(http.StatusRequestHeaderFieldsTooLarge, hold.TypeInvalidRequest, hold.CodeHeadersTooLarge,
			fmt.Sprintf("the request's headers are %d bytes, over the %d allowed", n, p.opts.MaxHeaderBytes)).Write(w)
		return
	}
	id, err := p.ident.Resolve(requestHeaders{r})
	if err != nil {
		p.holder.Refused(ctx, hold.ReasonIdentity)
		identity.Refusal(err).Write(w)
		return
	}
	label, refusal := p.label(r)
	if refusal != nil {
		p.holder.Refused(ctx, hold.ReasonInvalid)
		refusal.Write(w)
		return
	}
	var wait time.Duration // the holder's
	ok := true
	switch {
	case p.ident.ReadsBody():
		refusal, ok = p.bufferBody(w, r, &id)
	case p.holder.Waits():
		var whole bool
		if refusal, whole, ok = p.readAhead(w, r); !whole {
			wait = -1 // too long to hold: the request does not wait
		}
	}
	if !ok {
		if refusal != nil {
			p.holder.Refused(ctx, hold.ReasonInvalid)
			refusal.Write(w)
		}
		return
	}
	if label == "" {
		label = id.BodyLabel
	}
	st, res, err := p.holder.Acquire(ctx, limiter.AcquireRequest{UserID: id.UserID, Plan: id.Plan, Label: label, Pools: id.Pools, Wait: wait})
	switch {
	case err != nil:
		p.refuse(w, r, err)
	case st == nil:
		hold.Limited(res).Write(w)
	default:
		p.stream(w, r, st, res)
	}
}

// stream proxies a request that holds st, and releases st however the
// request ends.
func (p *Proxy) stream(w http.ResponseWriter, r *http.Request, st *hold.Stream, res limiter.AcquireResult) {
	would := hold.WouldRefuse(res)
	state := &exchange{stream: st, wouldRefuse: would}
	ctx, cancel := st.Context(context.WithValue(r.Context(), exchangeKey{}, state))
	defer cancel()
	end := hold.EndComplete
	defer func() {
		v := recover()
		switch {
		case v == nil:
		case v == http.ErrAbortHandler: // the response broke off mid-body
			end = p.endOf(r, st, state)
		default:
			end = hold.EndPanic
			p.log.ErrorContext(r.Context(), "proxy handler panicked; slot released", "stream_id", st.ID(), "path", r.URL.Path, "panic", v)
		}
		st.Release(r.Context(), end)
		if end == hold.EndStalled {
			p.log.WarnContext(r.Context(), "the client read nothing for proxy.stallTimeout; stream cut, slot released",
				"stream_id", st.ID(), "stall_timeout", p.opts.StallTimeout.String())
		}
		if p.log.Enabled(r.Context(), slog.LevelInfo) {
			p.log.LogAttrs(r.Context(), slog.LevelInfo, "stream ended", slog.String("stream_id", st.ID()), slog.String("end", string(end)),
				slog.String("took", time.Since(st.Started()).Round(time.Millisecond).String()))
		}
		if v != nil {
			panic(v) // net/http aborts the connection: the client sees the stream cut
		}
	}()
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("limiter.stream_id", st.ID()), attribute.Bool("limiter.degraded", res.Degraded))
	if would != "" {
		// A scope in shadow mode would have refused the stream: the log
		// says so, and the answer (exchange.answerHeaders).
		trace.SpanFromContext(ctx).SetAttributes(attribute.String("limiter.would_refuse", would))
	}
	if p.log.Enabled(ctx, slog.LevelInfo) { // typed attributes: a stream's two lines cost ~1% of its CPU
		granted := [...]slog.Attr{slog.String("stream_id", st.ID()), slog.String("plan", st.Plan()), slog.String("path", r.URL.Path),
			slog.Bool("degraded", res.Degraded), slog.String("pools", poolsAttr(res.Pools)), slog.String("would_refuse", would)}
		attrs := granted[:]
		if would == "" {
			attrs = attrs[:len(attrs)-1]
		}
		p.log.LogAttrs(ctx, slog.LevelInfo, "stream granted", attrs...)
	}
	if p.opts.StallTimeout > 0 {
		w = &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: p.opts.StallTimeout, x: state}
	}
	end = p.forward(w, r.WithContext(ctx), func(r *http.Request) hold.End { return p.endOf(r, st, state) })
}

// forward proxies r. The upstream may answer, and the answer be flushed,
// while the request body is still on its way up: full duplex keeps
// net/http from closing the body once the response headers are out. (Only
// here: a refusal must leave net/http to read what is left of the body,
// or closing the connection over unread bytes resets it before the
// client reads the answer.)
//
// In full duplex, the transport may close the body it was given after
// the handler has returned (it does, on a failed dial): net/http's body
// then reads to its end beside the next request's read, and panics. The
// transport is given a body whose Close does nothing and whose reads end
// with the handler; the handler closes the request's own.
//
// It returns how the exchange ended (endOf's answer), decided before the
// body is closed: cutting a read of it still under way (the upstream
// answered before the client sent all of it) ends the connection's
// reads, which cancels the request's context as if the client had gone.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, endOf func(*http.Request) hold.End) hold.End {
	_ = http.NewResponseController(w).EnableFullDuplex()
	if r.Body == nil || r.Body == http.NoBody {
		p.rp.ServeHTTP(w, r)
		return endOf(r)
	}
	body := &handlerBody{rc: r.Body, w: w}
	defer body.end()
	// A request cut while its client still sends the body is answered at
	// once (see upstreamFailed), not when the client sends more.
	stop := context.AfterFunc(r.Context(), body.interrupt)
	defer func() { stop(); body.handlerReturns() }()
	r.Body = body
	p.rp.ServeHTTP(w, r)
	return endOf(r)
}

// noEnd is forward's endOf for a request that holds no slot.
func noEnd(*http.Request) hold.End { return "" }

// endOf says how a stream's request ended.
func (p *Proxy) endOf(r *http.Request, st *hold.Stream, state *exchange) hold.End {
	switch err := st.Err(); {
	case errors.Is(err, hold.ErrShutdown):
		return hold.EndShutdown
	case err != nil:
		return hold.EndLost
	case state.stalled.Load():
		// The client read nothing for Options.StallTimeout: the proxy
		// cut the stream (its connection may be gone by now too).
		return hold.EndStalled
	case r.Context().Err() != nil:
		return hold.EndClientGone
	case state.failed.Load():
		return hold.EndUpstreamError
	case state.aborted.Load():
		// The copy to the client failed with the upstream still
		// answering: the client went away.
		return hold.EndClientGone
	}
	return hold.EndComplete
}

// label returns the value of Options.LabelHeader, "" when none is set or
// the request has none. Sent more than once it is refused 400
// invalid_label: which value labels the slot cannot be told, and taking
// the first would drop the second unseen (as the identity headers, a
// label sent twice is not guessed at).
func (p *Proxy) label(r *http.Request) (string, *hold.Refusal) {
	if p.opts.LabelHeader == "" {
		return "", nil
	}
	values := r.Header.Values(p.opts.LabelHeader)
	switch len(values) {
	case 0:
		return "", nil
	case 1:
		return values[0], nil
	}
	refusal := hold.Refused(http.StatusBadRequest, hold.TypeInvalidRequest, hold.CodeInvalidLabel,
		fmt.Sprintf("header %s: invalid label: the header came more than once (%d values); send it once", p.opts.LabelHeader, len(values)))
	return "", &refusal
}

// refuse answers an acquire that failed: the plan is unknown, the user id
// cannot be used, or Redis is down on a Closed plan.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, limiter.ErrInvalidLabel) {
		hold.Refused(http.StatusBadRequest, hold.TypeInvalidRequest, hold.CodeInvalidLabel,
			"header "+p.opts.LabelHeader+": "+err.Error()).Write(w)
		return
	}
	refusal, known := hold.AcquireRefusal(err)
	if !known {
		if r.Context().Err() != nil {
			return // the client left while the acquire was in flight; nobody reads an answer
		}
		p.failed.Log(r.Context(), slog.LevelError, "acquire failed", "path", r.URL.Path, "err", err)
	}
	refusal.Write(w)
}

// headerBytes is the size of r's header lines, as net/http counts them
// against http.Server.MaxHeaderBytes.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4 + len(r.Host) + len("Host: \r\n")
	for name, values := range r.Header {
		for _, v := range values {
			n += len(name) + len(v) + 4
		}
	}
	return n
}

// dropConnectionHeaders deletes from h the headers its Connection header
// names: they are hop-by-hop, and the reverse proxy drops them on the way
// upstream. The identity, pool keys and label are then read from the
// headers the upstream receives: a client naming X-User-Id there would
// otherwise be counted as that user while the upstream saw no user at
// all. Upgrade and TE stay, with Connection itself: the reverse proxy
// reads them from the client's request to send a WebSocket upgrade, or
// "TE: trailers", on its own hop.
func dropConnectionHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			name = textproto.TrimString(name)
			if name == "" || strings.EqualFold(name, "Connection") || strings.EqualFold(name, "Upgrade") || strings.EqualFold(name, "TE") {
				continue
			}
			h.Del(name)
		}
	}
}

// requestHeaders reads a request's headers as identity.Headers, Host
// among them: net/http moves it out of the header map into Request.Host,
// and a pool may be keyed by it (header:Host). ":scheme" is the scheme the
// request came by, "https" over TLS, else "http", which tells the Host's
// default port.
//
// An HTTP/1.1 request must send a Host (net/http refuses one without), so
// an empty Request.Host there is a Host sent empty: the header is there,
// with no value, which a pool keyed by it refuses. Elsewhere (HTTP/1.0,
// HTTP/2 without :authority) none was sent.
type requestHeaders struct{ r *http.Request }

func (h requestHeaders) Get(name string) string {
	if v := h.Values(name); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (h requestHeaders) Values(name string) []string {
	switch {
	case strings.EqualFold(name, "Host"):
		if h.r.Host == "" {
			if h.r.ProtoMajor == 1 && h.r.ProtoMinor >= 1 {
				return []string{""}
			}
			return nil
		}
		return []string{h.r.Host}
	case name == ":scheme":
		if h.r.TLS != nil {
			return []string{"https"}
		}
		return []string{"http"}
	}
	return h.r.Header.Values(name)
}
