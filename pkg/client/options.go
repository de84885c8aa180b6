package client

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
)

// EnvToken is the environment variable New reads the caller token from
// when no WithToken option is given.
const EnvToken = "LIMITER_TOKEN"

// Defaults of the options.
const (
	// DefaultRequestTimeout bounds each HTTP call the client makes.
	DefaultRequestTimeout = 5 * time.Second
	// DefaultAcquireRetries is how many times Acquire sends an unanswered
	// acquire again (see WithAcquireRetries).
	DefaultAcquireRetries = 2
	// fallbackHeartbeatInterval applies when an acquire answer names
	// neither a heartbeat interval nor a TTL (it always should).
	fallbackHeartbeatInterval = 10 * time.Second
)

// An Option configures a Client.
type Option func(*config) error

type config struct {
	httpClient     *http.Client
	wrappers       []func(http.RoundTripper) http.RoundTripper
	logger         *slog.Logger
	interval       time.Duration
	requestTimeout time.Duration
	acquireRetries *int
	token          string
	tokenSet       bool
	tlsConfig      *tls.Config
}

// WithTLSConfig makes the client's own transport use cfg (cloned) for an
// https:// base URL: the CAs trusted for the service's certificate
// (RootCAs) and, for mutual TLS, the client certificate that names the
// caller (Certificates or GetClientCertificate). Default: the system
// roots and no client certificate. It cannot be combined with
// WithHTTPClient: set that client's transport's TLSClientConfig instead.
func WithTLSConfig(cfg *tls.Config) Option {
	return func(c *config) error {
		if cfg == nil {
			return fmt.Errorf("WithTLSConfig: config must not be nil")
		}
		c.tlsConfig = cfg.Clone()
		return nil
	}
}

// WithToken makes the client send token as its bearer token on every call
// of the slot API: a token of the service's api.tokensFile, which names
// the caller and the plans it may use. Default: the LIMITER_TOKEN
// environment variable; none when it is empty too (a service without
// api.tokensFile needs none). NewAdmin takes its token as an argument and
// ignores this option.
func WithToken(token string) Option {
	return func(c *config) error {
		token = strings.TrimSpace(token)
		if token == "" {
			return fmt.Errorf("WithToken: token must not be empty")
		}
		c.token, c.tokenSet = token, true
		return nil
	}
}

// WithHTTPClient makes the client send its requests with hc. The client
// does not modify hc (WithTransport wraps a copy). Default: a client of its
// own with dial and TLS-handshake timeouts, whose idle connections Close
// closes, and that follows no redirect (the limiter sends none: a 3xx is
// an *Error with code "http_<status>" naming its Location). hc keeps its
// own CheckRedirect: net/http's default follows up to 10 redirects, with
// the bearer token to the same host and its subdomains; set CheckRedirect
// to return http.ErrUseLastResponse to follow none. Each call is bounded by
// WithRequestTimeout, whatever hc's Timeout.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *config) error {
		if hc == nil {
			return fmt.Errorf("WithHTTPClient: client must not be nil")
		}
		c.httpClient = hc
		return nil
	}
}

// WithTransport wraps the HTTP client's transport (http.DefaultTransport
// when it has none), e.g. to record client spans or metrics. Several
// wrappers apply in order: the last one given is outermost.
//
// No wrapper is needed to continue the application's traces through the
// limiter into Redis: every request carries the W3C trace context
// (traceparent) of its ctx's span. To also record a client span per
// request, wrap it with otelhttp (go.opentelemetry.io/contrib/.../otelhttp),
// naming the propagator so that the limiter's spans hang under that client
// span: otelhttp's default is the global one, which injects nothing unless
// the application set it.
//
//	client.WithTransport(func(rt http.RoundTripper) http.RoundTripper {
//		return otelhttp.NewTransport(rt,
//			otelhttp.WithTracerProvider(tp),
//			otelhttp.WithPropagators(propagation.TraceContext{}))
//	})
func WithTransport(wrap func(http.RoundTripper) http.RoundTripper) Option {
	return func(c *config) error {
		if wrap == nil {
			return fmt.Errorf("WithTransport: wrapper must not be nil")
		}
		c.wrappers = append(c.wrappers, wrap)
		return nil
	}
}

// WithLogger sets where heartbeat failures and lost slots are logged.
// Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("WithLogger: logger must not be nil")
		}
		c.logger = l
		return nil
	}
}

// WithHeartbeatInterval fixes how often held leases are heartbeated.
// Default: the smallest heartbeat_interval_ms among held leases, as the
// limiter answered at acquire. An interval longer than a tier's slot TTL
// loses that tier's slots.
func WithHeartbeatInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithHeartbeatInterval: interval must be > 0, got %s", d)
		}
		c.interval = d
		return nil
	}
}

// WithRequestTimeout bounds each HTTP call (acquire, one heartbeat batch,
// release, an Admin call). Default 5s. A call that times out fails with ErrUnavailable.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithRequestTimeout: timeout must be > 0, got %s", d)
		}
		c.requestTimeout = d
		return nil
	}
}

// WithAcquireRetries sets how many times Acquire sends an acquire again,
// under the same stream id, after an attempt went unanswered: a transport
// failure, the request timeout, or 503 limiter_unavailable. Such an
// attempt may have taken the slot in Redis with only its answer lost; the
// retry is then granted that slot, not a second one. Between attempts it
// waits the answer's Retry-After (up to half as long again, for jitter),
// else 200ms doubling up to 2s (from half of each, for jitter), and never
// past ctx. A Retry-After above 2s (something in front of the limiter
// asking for a long pause: the limiter's own 503s ask for 1s) is not
// waited: Acquire gives up at once with that answer's error. When Acquire
// gives up, it releases the
// stream id so that a slot a lost attempt took does not count against the
// user for a whole TTL. 0 disables retrying, not the release. Default 2.
func WithAcquireRetries(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("WithAcquireRetries: retries must be >= 0, got %d", n)
		}
		c.acquireRetries = &n
		return nil
	}
}

// check refuses options that contradict each other.
func (c *config) check() error {
	if c.tlsConfig != nil && c.httpClient != nil {
		return errors.New("WithTLSConfig and WithHTTPClient: set the TLS configuration on the given client's transport instead")
	}
	return nil
}

// build applies the defaults and the transport wrappers. owned reports
// whether the HTTP client is the client's own (so Close may close its idle
// connections).
func (c *config) build() (hc *http.Client, owned bool) {
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.requestTimeout == 0 {
		c.requestTimeout = DefaultRequestTimeout
	}
	if c.acquireRetries == nil {
		n := DefaultAcquireRetries
		c.acquireRetries = &n
	}
	hc, owned = c.httpClient, c.httpClient == nil
	if owned {
		hc = defaultHTTPClient(c.tlsConfig)
	}
	if len(c.wrappers) > 0 {
		copied := *hc
		rt := copied.Transport
		if rt == nil {
			rt = http.DefaultTransport
		}
		for _, wrap := range c.wrappers {
			rt = wrap(rt)
		}
		copied.Transport = rt
		hc = &copied
	}
	return hc, owned
}

func defaultHTTPClient(tlsConfig *tls.Config) *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{
		// The limiter redirects none of its routes, so a 3xx comes from
		// something in between. Following it would send the bearer token
		// along (net/http keeps it for the same host on any port, and for
		// its subdomains) and a POST again as a GET: the 3xx is returned
		// instead, and do makes it an *Error.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{
			TLSClientConfig:       tlsConfig,
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           dialer.DialContext,
			ForceAttemptHTTP2:     true,
			TLSHandshakeTimeout:   5 * time.Second,
			ExpectContinueTimeout: time.Second,
			IdleConnTimeout:       90 * time.Second,
			MaxIdleConns:          64,
			// Acquires run concurrently with heartbeat batches; the default
			// of 2 idle connections per host would redial constantly.
			MaxIdleConnsPerHost: 32,
		},
	}
}
