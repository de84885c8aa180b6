package proxy_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/holdtest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/proxy"
	"github.com/joishi/limiter/pkg/telemetry"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// env is a proxy, on a limiter on the shared standalone Redis, in front
// of an upstream the test writes.
type env struct {
	*holdtest.Env
	spans    *tracetest.InMemoryExporter
	proxy    *httptest.Server
	upstream *httptest.Server
}

type envOptions struct {
	proxy    proxy.Options
	stack    limitertest.Options
	identity identity.Options
	// upstream, when set, is the upstream's URL instead of a test server
	// running handler.
	upstream string
	// wait is how long a request may wait for a slot (hold.Options.Wait).
	wait time.Duration
	// serverLog, when set, is the proxy's http.Server's ErrorLog (where
	// net/http reports a handler's panic).
	serverLog *log.Logger
}

func newEnv(t *testing.T, handler http.Handler, o envOptions) *env {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	e := &env{spans: spans, Env: holdtest.New(t, holdtest.Options{
		Stack:     o.stack,
		Hold:      hold.Options{Mode: "proxy", Wait: o.wait},
		Telemetry: telemetry.Options{SpanExporter: spans},
	})}
	ident, err := identity.New(o.identity)
	if err != nil {
		t.Fatal(err)
	}
	target := o.upstream
	if target == "" {
		e.upstream = httptest.NewServer(handler)
		t.Cleanup(e.upstream.Close)
		target = e.upstream.URL
	}
	opts := o.proxy
	if opts.Upstream == nil {
		opts.Upstream, _ = url.Parse(target)
	}
	opts.Tiers = e.Stack.Table
	opts.MeterProvider = e.Tel.MeterProvider
	opts.Propagator = e.Tel.Propagator
	opts.Middleware = e.Tel.Middleware
	p, err := proxy.New(e.Holder, ident, opts)
	if err != nil {
		t.Fatal(err)
	}
	e.proxy = httptest.NewUnstartedServer(p.Handler())
	e.proxy.Config.ErrorLog = o.serverLog
	e.proxy.Start()
	t.Cleanup(e.proxy.Close)
	return e
}

// request builds a request to the proxy for user on plan.
func (e *env) request(t *testing.T, ctx context.Context, method, path, user, plan string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, e.proxy.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.Header.Set("X-User-Id", user)
	}
	if plan != "" {
		req.Header.Set("X-Plan", plan)
	}
	return req
}

func (e *env) do(t *testing.T, req *http.Request) *http.Response {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	return resp
}

func newUser() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "proxy-" + hex.EncodeToString(b[:])
}

// decodeError decodes the refusal resp carries, and checks it is JSON.
func decodeError(t *testing.T, resp *http.Response) holdtest.ErrorBody {
	t.Helper()
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var body holdtest.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("decoding the error body: %v", err)
	}
	return body
}

// checkRefused checks what refused requests leave behind: user holds held
// slots (those of requests granted), none of the refused reached up, and
// limiter_streams_refused_total counts refused of them under reason.
func (e *env) checkRefused(t *testing.T, up *sse, user string, held int, reason string, refused int) {
	t.Helper()
	if n := e.Used(t, user); n != held {
		t.Errorf("%d slots held after the refused requests, want %d", n, held)
	}
	up.checkNoneStarted(t)
	series := `limiter_streams_refused_total{mode="proxy",reason="` + reason + `"}`
	if got := e.Metric(t, series); got != strconv.Itoa(refused) {
		t.Errorf("%s: got %q, want %d", series, got, refused)
	}
}

// sse is an upstream that speaks OpenAI's chat completion SSE: it sends
// one chunk per value received on tokens and [DONE] when tokens closes.
type sse struct {
	tokens  chan string
	started chan *http.Request // each request, as it arrives
}

func newSSE() *sse { return &sse{tokens: make(chan string), started: make(chan *http.Request, 16)} }

// checkNoneStarted fails the test if a request has reached the upstream
// (and not been taken off started).
func (s *sse) checkNoneStarted(t *testing.T) {
	t.Helper()
	select {
	case <-s.started:
		t.Error("a refused request reached the upstream")
	default:
	}
}

func (s *sse) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.started <- r
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for {
		select {
		case tok, ok := <-s.tokens:
			if !ok {
				fmt.Fprint(w, "data: [DONE]\n\n")
				return
			}
			chunk, _ := json.Marshal(map[string]any{"object": "chat.completion.chunk", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": tok}}}})
			fmt.Fprintf(w, "data: %s\n\n", chunk)
			w.(http.Flusher).Flush()
		case <-r.Context().Done():
			return
		}
	}
}

func next(t *testing.T, ch <-chan string, within time.Duration) string {
	t.Helper()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatal("the stream ended")
		}
		return v
	case <-time.After(within):
		t.Fatalf("nothing within %v", within)
	}
	return ""
}

// once wraps a func to run at most once, for cleanups that a test may run
// earlier itself.
func once(f func()) func() {
	var o sync.Once
	return func() { o.Do(f) }
}
