package proxy_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

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
	stack    *limitertest.Stack
	holder   *hold.Holder
	tel      *telemetry.Telemetry
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
}

func newEnv(t *testing.T, handler http.Handler, o envOptions) *env {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tel, err := telemetry.New(context.Background(), telemetry.Options{SpanExporter: spans})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	if o.stack.Redis.Timeout == 0 && len(o.stack.Redis.Addrs) == 0 {
		o.stack.Redis.Timeout = 5 * time.Second // correctness, not latency
	}
	stack := limitertest.New(t, o.stack)
	h, err := hold.New(stack.Limiter, hold.Options{Mode: "proxy", MeterProvider: tel.MeterProvider})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	ident, err := identity.New(o.identity)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{stack: stack, holder: h, tel: tel, spans: spans}
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
	opts.Tiers = stack.Table
	opts.MeterProvider = tel.MeterProvider
	opts.Propagator = tel.Propagator
	opts.Middleware = tel.Middleware
	p, err := proxy.New(h, ident, opts)
	if err != nil {
		t.Fatal(err)
	}
	e.proxy = httptest.NewServer(p.Handler())
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

func (e *env) used(t *testing.T, user string) int {
	t.Helper()
	slots, err := e.stack.Limiter.Slots(context.Background(), user)
	if err != nil {
		t.Fatal(err)
	}
	return slots.Used
}

// waitUsed waits up to within for user to hold want slots.
func (e *env) waitUsed(t *testing.T, user string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := e.used(t, user)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("user %s holds %d slots %v on, want %d", user, got, within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metric returns the value of the /metrics line that starts with series.
func (e *env) metric(t *testing.T, series string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	e.tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for line := range strings.SplitSeq(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, series+" ") {
			return strings.TrimPrefix(line, series+" ")
		}
	}
	return ""
}

func newUser() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "proxy-" + hex.EncodeToString(b[:])
}

// errorBody is the OpenAI-shaped error body.
type errorBody struct {
	Error struct {
		Message      string  `json:"message"`
		Type         string  `json:"type"`
		Code         string  `json:"code"`
		Param        *string `json:"param"`
		RetryAfterMs *int64  `json:"retry_after_ms"`
		Used         *int    `json:"used"`
		Limit        *int    `json:"limit"`
	} `json:"error"`
}

func decodeError(t *testing.T, resp *http.Response) errorBody {
	t.Helper()
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var body errorBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("decoding the error body: %v", err)
	}
	return body
}

// sse is an upstream that speaks OpenAI's chat completion SSE: it sends
// one chunk per value received on tokens and [DONE] when tokens closes.
type sse struct {
	tokens  chan string
	started chan *http.Request // each request, as it arrives
}

func newSSE() *sse { return &sse{tokens: make(chan string), started: make(chan *http.Request, 16)} }

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

// events reads SSE data lines from body as they arrive.
func events(body io.Reader) <-chan string {
	out := make(chan string, 64)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				out <- data
			}
		}
	}()
	return out
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
