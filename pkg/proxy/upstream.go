package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/hold"
	"go.opentelemetry.io/otel/propagation"
)

// Phases of limiter_proxy_upstream_errors_total.
const (
	phaseResponse = "response"
	phaseBody     = "body"
)

// exchange is what the proxy learns about one limited request while the
// reverse proxy runs it.
type exchange struct {
	stream *hold.Stream
	// failed: the upstream failed (no response, or its body broke off
	// while the client was still there).
	failed atomic.Bool
	// aborted: copying the response to the client stopped short.
	aborted atomic.Bool
	// stalled: a write to the client blocked for Options.StallTimeout.
	stalled atomic.Bool
	// wouldRefuse is a shadow grant's hold.WouldRefuse; "" on others.
	wouldRefuse string
}

// answerHeaders sets the headers the limiter adds to the answer of x's
// request, replacing any of the upstream's: the stream id and, on a
// shadow grant, X-Limiter-Would-Refuse. They are set on the final
// response (modifyResponse) or the proxy's own failure answer, never
// before the proxying: the reverse proxy clears the header map it has
// written once an upstream's 1xx (103 Early Hints, 100 Continue) goes to
// the client.
func (x *exchange) answerHeaders(h http.Header) {
	h.Set(HeaderStreamID, x.stream.ID())
	if x.wouldRefuse != "" {
		h.Set(hold.HeaderWouldRefuse, x.wouldRefuse)
	} else {
		h.Del(hold.HeaderWouldRefuse) // the upstream's (a limiter behind this one) is not this one's word
	}
}

// limiterHeaders are the response headers that are the limiter's word
// (answerHeaders). An upstream's of the same name (a limiter behind this
// one, or an upstream that sends them for any reason) never reaches the
// client: on a limited request the limiter's replace them or they are
// dropped, and on every other one (a route the proxy does not limit, a
// preflight) they are dropped, the limiter having said nothing. They are
// dropped from the upstream's interim (1xx) answers (interimFilter) and
// trailers (modifyResponse, upstreamBody) too, on every request.
var limiterHeaders = [...]string{HeaderStreamID, hold.HeaderWouldRefuse}

// dropLimiterHeaders deletes limiterHeaders from h.
func dropLimiterHeaders(h http.Header) {
	for _, name := range limiterHeaders {
		h.Del(name)
	}
}

// interimFilter sends requests upstream with rt, and drops limiterHeaders
// from each interim (1xx) answer before the reverse proxy relays it to
// the client as it comes. The reverse proxy learns of them by a client
// trace added before RoundTrip; a trace added later is called first
// (httptrace.WithClientTrace), with the same header map.
type interimFilter struct{ rt http.RoundTripper }

func (f interimFilter) RoundTrip(r *http.Request) (*http.Response, error) {
	// A fresh trace each time: WithClientTrace composes the one it is
	// given with the context's, in place.
	trace := &httptrace.ClientTrace{Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
		dropLimiterHeaders(http.Header(h))
		return nil
	}}
	return f.rt.RoundTrip(r.WithContext(httptrace.WithClientTrace(r.Context(), trace)))
}

type exchangeKey struct{}

// preflightKey marks the context of a CORS preflight's request (see
// preflight): its answer goes back without a body.
type preflightKey struct{}

func exchangeOf(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	return x
}

// reverseProxy streams: every write is flushed at once (SSE, chunked
// tokens), upgrades (WebSocket) are tunnelled for the connection's life,
// hop-by-hop headers are dropped both ways, and nothing is buffered whole.
func (p *Proxy) reverseProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      interimFilter{p.opts.Transport},
		FlushInterval:  -1,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.upstreamFailed,
		BufferPool:     copyBuffers{},
		// Body copy errors: the handler classifies and logs them.
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
}

// copyBuffers lends the reverse proxy the buffer it copies a response
// body through: without them each response would allocate (and zero) its
// own 32 KiB, half of all a stream allocates.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *copyBufferPool.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { copyBufferPool.Put(&b) }

// pathHeaders name a request's path in place of its target, to the
// servers that read them.
var pathHeaders = [...]string{"X-Original-Url", "X-Rewrite-Url", "X-Original-Uri"}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(p.opts.Upstream)
	// Only a WebSocket upgrade is tunnelled. After any other (h2c above
	// all, which some servers accept from "Upgrade: h2c" alone) the
	// connection would carry HTTP/2 streams that the proxy only relays,
	// each one past every cap; without the header the request is served
	// as plain HTTP/1.1.
	if up := pr.Out.Header.Get("Upgrade"); up != "" && !strings.EqualFold(strings.TrimSpace(up), "websocket") {
		pr.Out.Header.Del("Upgrade")
		pr.Out.Header.Del("Connection")
	}
	// The path the proxy judged is the one the upstream serves: headers
	// that name another one to servers that honour them (IIS's URL
	// Rewrite, frameworks behind it) are a client's to spoof, and would
	// serve a limited route on a path that passes through.
	for _, h := range pathHeaders {
		pr.Out.Header.Del(h)
	}
	// Append to the X-Forwarded-For of the hops in front, as a proxy in a
	// chain should; Host and Proto are this hop's.
	if xff := pr.In.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		pr.Out.Header["X-Forwarded-For"] = append([]string(nil), xff...)
	}
	pr.SetXForwarded()
	if p.opts.StripAuthorization {
		pr.Out.Header.Del("Authorization")
	}
	pr.Out.Header.Del(HeaderStreamID) // never the client's own
	x := exchangeOf(pr.In.Context())
	if x != nil {
		pr.Out.Header.Set(HeaderStreamID, x.stream.ID())
	}
	if p.ident.UsesJWT() || p.ident.UsesPayload() {
		// The identity is the token's: the user and plan headers carry
		// the user and plan the limiter counted, never the client's own
		// (an upstream reading them would bill another user), and no
		// value at all where no slot was held.
		user, plan := p.ident.Headers()
		pr.Out.Header.Del(user)
		pr.Out.Header.Del(plan)
		if x != nil {
			pr.Out.Header.Set(user, x.stream.UserID())
			pr.Out.Header.Set(plan, x.stream.Plan())
		}
	}
	p.opts.Propagator.Inject(pr.In.Context(), propagation.HeaderCarrier(pr.Out.Header))
}

// modifyResponse adds the limiter's headers to a limited request's
// response, and watches its body, to tell an upstream that broke off from
// a client that went away; it drops the upstream's copies of them from
// every other response, and from every response's trailers: those
// announced here (the reverse proxy announces to the client what
// resp.Trailer names now), and those that come with the body's end
// (upstreamBody).
func (p *Proxy) modifyResponse(resp *http.Response) error {
	x := exchangeOf(resp.Request.Context())
	if x == nil {
		dropLimiterHeaders(resp.Header)
	}
	dropLimiterHeaders(resp.Trailer)
	if resp.Request.Context().Value(preflightKey{}) != nil {
		// A preflight's answer: its status and headers, and no body (a
		// browser reads none). Closing the upstream's ends whatever it
		// streams: nothing runs uncounted through a preflight.
		resp.Body.Close()
		resp.Body, resp.ContentLength, resp.TransferEncoding = http.NoBody, 0, nil
		resp.Header.Set("Content-Length", "0")
		return nil
	}
	if x != nil {
		x.answerHeaders(resp.Header)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return nil // an upgraded body must stay the io.ReadWriteCloser it is
	}
	resp.Body = &upstreamBody{ReadCloser: resp.Body, resp: resp, p: p, x: x, ctx: resp.Request.Context()}
	return nil
}

// upstreamBody is the upstream's response body: it records a read error
// of a limited request's (x set), and drops limiterHeaders from the
// trailers that came with its end, which the reverse proxy reads once it
// has closed it.
type upstreamBody struct {
	io.ReadCloser
	resp *http.Response
	p    *Proxy
	x    *exchange // nil on a request that holds no slot
	ctx  context.Context
}

func (b *upstreamBody) Close() error {
	err := b.ReadCloser.Close()
	dropLimiterHeaders(b.resp.Trailer)
	return err
}

func (b *upstreamBody) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	if err != nil && err != io.EOF && b.x != nil {
		b.x.aborted.Store(true)
		// A read that failed because the request was cancelled is the
		// client's doing (or the slot's loss), not the upstream's.
		if b.ctx.Err() == nil && b.x.failed.CompareAndSwap(false, true) {
			b.p.upErrors.Add(b.ctx, 1, b.p.phases[phaseBody])
			b.p.log.WarnContext(b.ctx, "upstream broke off the response", "stream_id", b.x.stream.ID(), "err", err)
		}
	}
	return n, err
}

// upstreamFailed answers a request the upstream did not answer: 504 for a
// timeout, 502 otherwise, as JSON; nothing when the client is gone. A
// stream cut before the upstream answered (its slot lost, or the proxy
// shutting down) is answered 503 (cutBeforeResponse): nothing has been
// written yet, and an empty 200 would read as a completion.
func (p *Proxy) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeOf(r.Context())
	if x != nil {
		if lost := x.stream.Err(); lost != nil {
			x.answerHeaders(w.Header())
			cutBeforeResponse(lost).Write(w)
			return
		}
	}
	if r.Context().Err() != nil {
		return // the client went away
	}
	if x != nil {
		x.failed.Store(true)
		x.answerHeaders(w.Header())
	}
	p.upErrors.Add(r.Context(), 1, p.phases[phaseResponse])
	p.log.WarnContext(r.Context(), "upstream request failed", "path", r.URL.Path, "err", err)
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		hold.Refused(http.StatusGatewayTimeout, hold.TypeServer, hold.CodeUpstreamTimeout, "the upstream did not answer in time").Write(w)
		return
	}
	hold.Refused(http.StatusBadGateway, hold.TypeServer, hold.CodeUpstreamUnavailable, "the upstream could not be reached").Write(w)
}

// cutBeforeResponse is the answer of a stream cut, for lost (its
// Stream's Err), before the upstream's response: 503 limiter_unavailable
// when the proxy is shutting down (another replica takes the retry), 503
// slot_lost when the slot was lost (support released it, it expired, a
// failover lost it), as the ext_proc server answers a stream so cut.
func cutBeforeResponse(lost error) hold.Refusal {
	if errors.Is(lost, hold.ErrShutdown) {
		return hold.Refused(http.StatusServiceUnavailable, hold.TypeServer, hold.CodeUnavailable,
			"this stream limiter is shutting down and cut the request before the upstream answered; retry")
	}
	return hold.Refused(http.StatusServiceUnavailable, hold.TypeServer, hold.CodeSlotLost,
		"this stream's slot was released before the upstream answered (by support, by expiry or in a failover)")
}

// TransportOptions configure NewTransport. Zero durations take the
// defaults of Options.
type TransportOptions struct {
	DialTimeout           time.Duration
	TLSHandshakeTimeout   time.Duration
	ResponseHeaderTimeout time.Duration
	IdleConnTimeout       time.Duration
	// CAFile is a PEM bundle of the CAs trusted for an https upstream.
	// Default "": the system roots.
	CAFile string
}

// NewTransport returns the transport to the upstream: HTTP/2 over TLS
// when the upstream offers it, HTTP/1.1 otherwise; no transparent
// compression (bytes pass as the upstream sent them); many idle
// connections per host (one host takes every request).
func NewTransport(o TransportOptions) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil // the upstream is reached directly, whatever HTTP_PROXY says
	t.DialContext = (&net.Dialer{Timeout: orDefault(o.DialTimeout, DefaultDialTimeout), KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = orDefault(o.TLSHandshakeTimeout, DefaultTLSHandshakeTimeout)
	t.ResponseHeaderTimeout = orDefault(o.ResponseHeaderTimeout, DefaultResponseHeaderTimeout)
	t.IdleConnTimeout = orDefault(o.IdleConnTimeout, DefaultIdleConnTimeout)
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 1024
	t.DisableCompression = true
	t.ForceAttemptHTTP2 = true
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("proxy.upstreamCAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("proxy.upstreamCAFile %s: no PEM certificate in it", o.CAFile)
		}
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return t, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
