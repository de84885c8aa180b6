package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/proxytest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/proxy"
	"github.com/joishi/limiter/pkg/tiers"
)

// A stream's chunks reach the client as the upstream sends them, its slot
// is held while it streams and freed when it ends, and both sides see the
// same stream id.
func TestStreamIsFlushedHeldAndReleased(t *testing.T) {
	up := newSSE()
	e := newEnv(t, up, envOptions{})
	user := newUser()
	resp := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", strings.NewReader(`{"stream":true}`)))
	defer resp.Body.Close()
	upReq := <-up.started
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	id := resp.Header.Get(proxy.HeaderStreamID)
	if id == "" || upReq.Header.Get(proxy.HeaderStreamID) != id {
		t.Errorf("stream id: client saw %q, upstream %q; want the same, non-empty", id, upReq.Header.Get(proxy.HeaderStreamID))
	}
	got, _ := proxytest.SSEData(resp.Body)
	for _, tok := range []string{"Hel", "lo"} {
		up.tokens <- tok
		// The upstream has not finished: the chunk came on its own.
		if chunk := next(t, got, 2*time.Second); !strings.Contains(chunk, `"content":"`+tok+`"`) {
			t.Fatalf("chunk %q, want the token %q", chunk, tok)
		}
	}
	if n := e.Used(t, user); n != 1 {
		t.Errorf("%d slots held mid-stream, want 1", n)
	}
	close(up.tokens)
	if last := next(t, got, 2*time.Second); last != "[DONE]" {
		t.Errorf("last event %q, want [DONE]", last)
	}
	e.AwaitUsed(t, user, 0, time.Second)
	if got := e.Metric(t, `limiter_streams_held_total{end="complete",mode="proxy"}`); got != "1" {
		t.Errorf(`held_total{end="complete"}: got %q, want 1`, got)
	}
}

// The second concurrent stream of a plan of one is refused with OpenAI's
// 429 shape and no retry invitation; the upstream never sees it.
func TestLimitReachedIsAnOpenAI429(t *testing.T) {
	up := newSSE()
	e := newEnv(t, up, envOptions{})
	user := newUser()
	first := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", nil))
	defer first.Body.Close()
	<-up.started
	resp := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", nil))
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second stream: status %d, want 429", resp.StatusCode)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 10 {
		t.Errorf("Retry-After %q, want whole seconds, 1..10 (the plan's TTL is 10s)", resp.Header.Get("Retry-After"))
	}
	if got := resp.Header.Get("X-Should-Retry"); got != "false" {
		t.Errorf("x-should-retry %q, want false", got)
	}
	body := decodeError(t, resp)
	if body.Error.Type != "rate_limit_error" || body.Error.Code != "stream_limit_reached" || body.Error.Message == "" ||
		body.Error.Used == nil || *body.Error.Used != 1 || body.Error.Limit == nil || *body.Error.Limit != 1 || body.Error.RetryAfterMs == nil {
		t.Errorf("429 body %+v, want rate_limit_error / stream_limit_reached with used 1, limit 1, retry_after_ms", body.Error)
	}
	select {
	case <-up.started:
		t.Error("the refused request reached the upstream")
	case <-time.After(100 * time.Millisecond):
	}
	if got := e.Metric(t, `limiter_streams_refused_total{mode="proxy",reason="limit"}`); got != "1" {
		t.Errorf(`refused_total{reason="limit"}: got %q, want 1`, got)
	}
}

// Requests refused before a slot get a JSON error and take none; the
// upstream never sees them.
func TestBadRequestsTakeNoSlot(t *testing.T) {
	up := newSSE()
	e := newEnv(t, up, envOptions{})
	user := newUser()
	huge := strings.Repeat("x", proxy.DefaultMaxHeaderBytes+100)
	cases := []struct {
		name       string
		user, plan string
		header     http.Header
		wantStatus int
		wantCode   string
	}{
		{"no identity", "", "", nil, http.StatusUnauthorized, "unauthenticated"},
		{"a plan outside the tier table", user, "platinum", nil, http.StatusUnprocessableEntity, "unknown_plan"},
		{"a user id that cannot be a key", "a}b", "one", nil, http.StatusBadRequest, "invalid_user_id"},
		{"oversized headers", user, "one", http.Header{"X-Padding": {huge}}, http.StatusRequestHeaderFieldsTooLarge, "headers_too_large"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// With a body, as SDKs send it: the refusal must reach the client
			// all the same (not a reset over unread bytes).
			req := e.request(t, context.Background(), "POST", "/v1/chat/completions", tc.user, tc.plan, strings.NewReader(`{"model":"m","stream":true}`))
			for k, v := range tc.header {
				req.Header[k] = v
			}
			resp := e.do(t, req)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.wantStatus)
			}
			if body := decodeError(t, resp); body.Error.Code != tc.wantCode || body.Error.Type != "invalid_request_error" {
				t.Errorf("body %+v, want invalid_request_error / %s", body.Error, tc.wantCode)
			}
		})
	}
	if n := e.Used(t, user); n != 0 {
		t.Errorf("%d slots held after refused requests, want 0", n)
	}
	up.checkNoneStarted(t)
}

// Only the configured routes hold a slot; the rest pass through without
// an identity.
func TestUnlimitedRoutesPassThrough(t *testing.T) {
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"data":[]}`)
	}), envOptions{proxy: proxy.Options{Routes: []string{"/v1/chat/completions", "/v1/completions/"}}})
	for path, want := range map[string]int{
		"/v1/models":               http.StatusOK,
		"/v1/chat/completionsX":    http.StatusOK, // not under the prefix
		"/v1/chat/completions":     http.StatusUnauthorized,
		"/v1/completions":          http.StatusUnauthorized,
		"/v1/completions/abc":      http.StatusUnauthorized,
		"/v1/chat/completions/xyz": http.StatusUnauthorized,
	} {
		resp := e.do(t, e.request(t, context.Background(), "GET", path, "", "", nil))
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s without identity: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// withConnection is h with a Connection header of connection.
func withConnection(h http.Header, connection string) http.Header {
	out := h.Clone()
	out.Set("Connection", connection)
	return out
}

// A browser's CORS preflight of a limited route (OPTIONS with Origin and
// Access-Control-Request-Method) reaches the upstream, which answers it,
// without an identity and without a slot, even for a user at its limit;
// an OPTIONS without both headers, or a POST with them, is limited as
// any request of the route is.
func TestACORSPreflightPassesWithoutASlot(t *testing.T) {
	done := make(chan struct{})
	var upstreamOptions atomic.Int32 // OPTIONS the upstream saw
	cut := make(chan struct{})       // an OPTIONS's stream was cut
	var cutOnce sync.Once
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions {
			upstreamOptions.Add(1)
		}
		if r.Method == http.MethodOptions && r.Header.Get("X-Any-Method") == "" {
			w.Header().Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
			w.Header().Set("Access-Control-Allow-Headers", "authorization, content-type")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		fmt.Fprint(w, "data: tok\n\n") // a stream that runs until the test ends
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			if r.Method == http.MethodOptions {
				cutOnce.Do(func() { close(cut) })
			}
		case <-done:
		}
	}), envOptions{proxy: proxy.Options{Routes: []string{"/v1/chat/completions"}}})
	t.Cleanup(func() { close(done) })
	user := newUser()
	held := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", nil))
	defer held.Body.Close()
	cors := http.Header{"Origin": {"https://chat.example"}, "Access-Control-Request-Method": {"POST"}}
	for _, tc := range []struct {
		name, method string
		header       http.Header
		user         string
		want         int
	}{
		{"a preflight", "OPTIONS", cors, "", http.StatusNoContent},
		{"a preflight of a user at its limit", "OPTIONS", cors, user, http.StatusNoContent},
		{"an OPTIONS without Origin", "OPTIONS", http.Header{"Access-Control-Request-Method": {"POST"}}, "", http.StatusUnauthorized},
		{"an OPTIONS without Access-Control-Request-Method", "OPTIONS", http.Header{"Origin": {"https://chat.example"}}, "", http.StatusUnauthorized},
		{"a POST with a preflight's headers", "POST", cors, "", http.StatusUnauthorized},
		// The upstream never receives headers the client names in
		// Connection: so named, Origin makes no preflight of it.
		{"an OPTIONS naming Origin in Connection", "OPTIONS", withConnection(cors, "Origin"), "", http.StatusUnauthorized},
		{"an OPTIONS naming Access-Control-Request-Method in Connection", "OPTIONS", withConnection(cors, "keep-alive, access-control-request-method"), "", http.StatusUnauthorized},
		{"a POST with a preflight's headers, of a user at its limit", "POST", cors, user, http.StatusTooManyRequests},
		// A preflight has no body: an OPTIONS with one, to an upstream
		// that streams for any method, is limited as any request.
		{"an OPTIONS with a preflight's headers and a body, of a user at its limit", "OPTIONS", withBody(cors), user, http.StatusTooManyRequests},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.header.Get("X-Body") != "" {
				body = strings.NewReader(`{"model":"m","stream":true}`)
			}
			req := e.request(t, context.Background(), tc.method, "/v1/chat/completions", tc.user, "one", body)
			for k, v := range tc.header {
				req.Header[k] = v
			}
			resp := e.do(t, req)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.want)
			}
			if tc.want == http.StatusNoContent && (resp.Header.Get("Access-Control-Allow-Origin") != "https://chat.example" || resp.Header.Get(proxy.HeaderStreamID) != "") {
				t.Errorf("%s: the upstream's CORS answer %q, stream id %q; want the upstream's, no slot", tc.name, resp.Header.Get("Access-Control-Allow-Origin"), resp.Header.Get(proxy.HeaderStreamID))
			}
		})
	}

	// A preflight to an upstream that streams in answer to any method:
	// its status and headers come back with an empty body, at once, and
	// the upstream's stream is cut, however long it runs.
	seen := upstreamOptions.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := e.request(t, ctx, "OPTIONS", "/v1/chat/completions", user, "one", nil)
	for k, v := range cors {
		req.Header[k] = v
	}
	req.Header.Set("X-Any-Method", "1")
	start := time.Now()
	resp := e.do(t, req)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(got) != 0 || time.Since(start) > 5*time.Second || upstreamOptions.Load() != seen+1 {
		t.Errorf("a preflight the upstream streams in answer to: %d, body %q, %v, after %v; want its status, an empty body, at once", resp.StatusCode, got, err, time.Since(start))
	}
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Error("the upstream's stream in answer to a preflight still ran 5s on; want it cut")
	}
}

// withBody is h with X-Body set: the case sends a body.
func withBody(h http.Header) http.Header {
	out := h.Clone()
	out.Set("X-Body", "1")
	return out
}

func TestClientDisconnectFreesTheSlot(t *testing.T) {
	up := newSSE()
	e := newEnv(t, up, envOptions{})
	user := newUser()
	ctx, cancel := context.WithCancel(context.Background())
	resp := e.do(t, e.request(t, ctx, "POST", "/v1/chat/completions", user, "one", nil))
	<-up.started
	got, _ := proxytest.SSEData(resp.Body)
	up.tokens <- "a"
	next(t, got, 2*time.Second)
	cancel() // the client aborts mid-stream
	e.AwaitUsed(t, user, 0, time.Second)
	waitMetric(t, e, `limiter_streams_held_total{end="client_gone",mode="proxy"}`, "1")
}

// The upstream breaking off mid-stream, or not answering at all, frees
// the slot and counts an upstream error.
func TestUpstreamFailureFreesTheSlot(t *testing.T) {
	t.Run("breaks off mid-stream", func(t *testing.T) {
		e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
			panic(http.ErrAbortHandler) // the upstream's connection drops
		}), envOptions{})
		user := newUser()
		resp := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", nil))
		_, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Error("the client read a complete body from a stream the upstream broke off; want it cut")
		}
		e.AwaitUsed(t, user, 0, time.Second)
		waitMetric(t, e, `limiter_streams_held_total{end="upstream_error",mode="proxy"}`, "1")
		waitMetric(t, e, `limiter_proxy_upstream_errors_total{phase="body"}`, "1")
	})
	t.Run("refuses connections", func(t *testing.T) {
		e := newEnv(t, nil, envOptions{upstream: "http://" + testenv.FreeAddr(t)})
		user := newUser()
		resp := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", nil))
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d, want 502", resp.StatusCode)
		}
		if body := decodeError(t, resp); body.Error.Code != "upstream_unavailable" {
			t.Errorf("code %q, want upstream_unavailable", body.Error.Code)
		}
		e.AwaitUsed(t, user, 0, time.Second)
		waitMetric(t, e, `limiter_streams_held_total{end="upstream_error",mode="proxy"}`, "1")
	})
}

// The upstream error counter is on /metrics at 0 for each phase from the
// start, so that rate() sees the first failure.
func TestUpstreamErrorCountersStartAtZero(t *testing.T) {
	e := newEnv(t, http.NotFoundHandler(), envOptions{})
	for _, phase := range []string{"response", "body"} {
		series := `limiter_proxy_upstream_errors_total{phase="` + phase + `"}`
		if got := e.Metric(t, series); got != "0" {
			t.Errorf("%s before any request: got %q, want 0", series, got)
		}
	}
}

// panicking is a transport that panics, as a bug in the request path
// would.
type panicking struct{}

func (panicking) RoundTrip(*http.Request) (*http.Response, error) { panic("a bug") }

func TestPanicFreesTheSlot(t *testing.T) {
	e := newEnv(t, nil, envOptions{upstream: "http://127.0.0.1:1", proxy: proxy.Options{Transport: panicking{}}})
	user := newUser()
	if resp, err := http.DefaultClient.Do(e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", nil)); err == nil {
		resp.Body.Close()
		t.Errorf("status %d from a handler that panicked, want the connection cut", resp.StatusCode)
	}
	e.AwaitUsed(t, user, 0, time.Second)
	waitMetric(t, e, `limiter_streams_held_total{end="panic",mode="proxy"}`, "1")
}

// A slot lost while streaming (support unlocked the account) cuts the
// stream.
func TestLostSlotCutsTheStream(t *testing.T) {
	up := newSSE()
	e := newEnv(t, up, envOptions{})
	user := newUser()
	resp := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "short-one", nil))
	<-up.started
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(resp.Body); done <- err }()
	if _, err := e.Stack.Limiter.ReleaseAll(context.Background(), user, "audit-"+user); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("the stream still runs 2s after its slot was removed (heartbeat 100ms)")
	}
	waitMetric(t, e, `limiter_streams_held_total{end="lost",mode="proxy"}`, "1")
}

// Hop-by-hop headers go no further, X-Forwarded-* are set, Authorization
// passes unless stripped, and the trace continues upstream.
func TestUpstreamRequestHeaders(t *testing.T) {
	for _, strip := range []bool{false, true} {
		t.Run(fmt.Sprintf("StripAuthorization %v", strip), func(t *testing.T) {
			seen := make(chan http.Header, 1)
			e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h := r.Header.Clone()
				h.Set("Host", r.Host)
				seen <- h
				w.Header().Set("Connection", "X-Upstream-Hop")
				w.Header().Set("X-Upstream-Hop", "1")
				w.Header().Set("Keep-Alive", "timeout=5")
				fmt.Fprint(w, "{}")
			}), envOptions{proxy: proxy.Options{StripAuthorization: strip}})
			req := e.request(t, context.Background(), "POST", "/v1/chat/completions", newUser(), "one", nil)
			req.Header.Set("Authorization", "Bearer sk-upstream")
			req.Header.Set("Connection", "X-Hop, TE")
			req.Header.Set("X-Hop", "1")
			req.Header.Set("TE", "trailers")
			req.Header.Set("X-Forwarded-For", "203.0.113.7")
			req.Header.Set(proxy.HeaderStreamID, "forged")
			const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			req.Header.Set("Traceparent", parent)
			resp := e.do(t, req)
			resp.Body.Close()
			h := <-seen
			if h.Get("X-Hop") != "" {
				t.Error("a header the client named in Connection reached the upstream")
			}
			if got := h.Get("Te"); got != "trailers" {
				t.Errorf("TE upstream %q, want trailers: the client's, named in Connection as TE must be, is this hop's to send too", got)
			}
			if got := h.Get("X-Forwarded-For"); got != "203.0.113.7, 127.0.0.1" {
				t.Errorf("X-Forwarded-For %q, want the client's list with this hop appended", got)
			}
			if h.Get("X-Forwarded-Host") == "" || h.Get("X-Forwarded-Proto") != "http" {
				t.Errorf("X-Forwarded-Host %q, -Proto %q; want both set", h.Get("X-Forwarded-Host"), h.Get("X-Forwarded-Proto"))
			}
			if got, want := h.Get("Authorization"), map[bool]string{false: "Bearer sk-upstream", true: ""}[strip]; got != want {
				t.Errorf("Authorization upstream %q, want %q", got, want)
			}
			if got := h.Get(proxy.HeaderStreamID); got == "forged" || got != resp.Header.Get(proxy.HeaderStreamID) {
				t.Errorf("stream id upstream %q, to the client %q: want the slot's own, not the client's", got, resp.Header.Get(proxy.HeaderStreamID))
			}
			tp := h.Get("Traceparent")
			if !strings.HasPrefix(tp, "00-0af7651916cd43dd8448eb211c80319c-") || tp == parent {
				t.Errorf("traceparent upstream %q, want the client's trace with the proxy's span", tp)
			}
			if resp.Header.Get("X-Upstream-Hop") != "" || resp.Header.Get("Keep-Alive") != "" {
				t.Error("hop-by-hop response headers reached the client")
			}
		})
	}
}

// A WebSocket upgrade holds its slot for the life of the connection,
// whatever else its Connection header names.
func TestWebSocketHoldsTheSlotForTheConnection(t *testing.T) {
	for _, connection := range []string{"Upgrade", "keep-alive, Upgrade, X-Hop"} {
		t.Run(connection, func(t *testing.T) { testWebSocket(t, connection) })
	}
}

func testWebSocket(t *testing.T, connection string) {
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "upgrade required", http.StatusUpgradeRequired)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprint(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		rw.Flush()
		_, _ = io.Copy(conn, rw) // echo until the client closes
	}), envOptions{})
	user := newUser()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.proxy.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: %s\r\nX-Hop: 1\r\nX-User-Id: %s\r\nX-Plan: one\r\n\r\n", connection, user)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v, %v; want 101", resp, err)
	}
	for i := range 3 {
		msg := fmt.Sprintf("ping %d\n", i)
		fmt.Fprint(conn, msg)
		line, err := br.ReadString('\n')
		if err != nil || line != msg {
			t.Fatalf("echo %q, %v; want %q", line, err, msg)
		}
		if n := e.Used(t, user); n != 1 {
			t.Fatalf("%d slots held on an open WebSocket, want 1", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	conn.Close()
	e.AwaitUsed(t, user, 0, time.Second)
}

// Redis not answering: an Open plan passes through (counted degraded), a
// Closed one is refused with 503 in the same body shape.
func TestOutageFollowsTheFailureMode(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "{}") })
	e := newEnv(t, up, envOptions{stack: limitertest.Options{
		Redis:  cluster.Options{Addrs: []string{testenv.BlackHole(t)}, Timeout: 100 * time.Millisecond},
		NoWait: true,
		Tiers: []tiers.Tier{
			{Plan: "open", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
			{Plan: "closed", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailClosed},
		},
	}})
	resp := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", newUser(), "open", nil))
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "{}" {
		t.Errorf("Open plan during an outage: %d %q, want the upstream's 200", resp.StatusCode, body)
	}
	resp = e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", newUser(), "closed", nil))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("Closed plan during an outage: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if b := decodeError(t, resp); b.Error.Code != "limiter_unavailable" || b.Error.Type != "server_error" {
		t.Errorf("503 body %+v, want server_error / limiter_unavailable", b.Error)
	}
}

func waitMetric(t *testing.T, e *env, series, want string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		got := e.Metric(t, series)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: got %q, want %s", series, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An upgrade to any protocol but WebSocket does not reach the upstream:
// after an h2c upgrade (which some servers take from "Upgrade: h2c"
// alone, such as Python's Hypercorn) the connection would carry HTTP/2
// streams that the proxy only relays, each a stream past every cap. The
// request goes on as plain HTTP/1.1; a WebSocket upgrade still passes.
func TestOnlyWebSocketUpgradesReachTheUpstream(t *testing.T) {
	upgrades := make(chan string, 8)
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upgrades <- r.Header.Get("Upgrade") + "|" + r.Header.Get("Connection") + "|" + r.Header.Get("Http2-Settings")
		w.WriteHeader(http.StatusOK)
	}), envOptions{})
	for _, path := range []string{"/v1/models", "/v1/chat/completions"} {
		for _, upgrade := range []string{"h2c", "H2C", "websocket, h2c", "h2c, websocket", "tls/1.2"} {
			conn, err := net.Dial("tcp", strings.TrimPrefix(e.proxy.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nUpgrade: %s\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nX-User-Id: %s\r\nX-Plan: three\r\n\r\n",
				path, upgrade, newUser())
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			conn.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("%s with Upgrade: %s: %v, %v; want 200, the request served as HTTP/1.1", path, upgrade, resp, err)
				continue
			}
			if got := <-upgrades; got != "||" {
				t.Errorf("%s with Upgrade: %s: the upstream read Upgrade|Connection|HTTP2-Settings %q; want none", path, upgrade, got)
			}
		}
	}
}

// A server behind IIS's URL Rewrite (and frameworks that honour it)
// serves the path X-Original-URL or X-Rewrite-URL names, not the request
// target: /v1/models, which passes through, would be served as the chat
// route with no slot. The upstream reads no such header, in any spelling.
func TestNoHeaderNamesAnotherPathToTheUpstream(t *testing.T) {
	seen := make(chan http.Header, 8)
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		w.WriteHeader(http.StatusOK)
	}), envOptions{})
	for _, name := range []string{"X-Original-URL", "x-original-url", "X-Rewrite-URL", "X-Original-URI"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.proxy.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /v1/models HTTP/1.1\r\nHost: x\r\n%s: /v1/chat/completions\r\nX-User-Id: %s\r\nX-Plan: three\r\n\r\n", name, newUser())
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/v1/models with %s: %v, %v; want 200", name, resp, err)
		}
		h := <-seen
		for _, got := range []string{"X-Original-Url", "X-Rewrite-Url", "X-Original-Uri"} {
			if v := h.Values(got); len(v) > 0 {
				t.Errorf("sent %s: the upstream read %s: %q; want none", name, got, v)
			}
		}
	}
}

// An upstream under a path (http://gw/openai) that resolves dot segments
// reads /../openai/v1/chat/completions as its chat route: the proxy
// judges the path as that upstream reads it too, and a stream so spelt
// holds a slot. Two slashes first (//evil/v1/chat/completions), which a
// server parsing the target against a base URL reads as a host and the
// route, hold one as well.
func TestNoSpellingOfAPathClimbsPastTheUpstreamsPath(t *testing.T) {
	up := newSSE()
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	e := newEnv(t, nil, envOptions{upstream: srv.URL + "/openai/", proxy: proxy.Options{Routes: []string{"/v1/chat/completions"}}})
	user := newUser()
	send := func(path string) int {
		t.Helper()
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.proxy.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\nX-User-Id: %s\r\nX-Plan: one\r\n\r\n{}", path, user)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return resp.StatusCode
	}
	if got := send("/v1/chat/completions"); got != http.StatusOK {
		t.Fatalf("the user's one stream: %d, want 200", got)
	}
	if got := (<-up.started).URL.Path; got != "/openai/v1/chat/completions" {
		t.Errorf("the upstream read %q, want /openai/v1/chat/completions", got)
	}
	for _, path := range []string{"/../openai/v1/chat/completions", "/%2e%2e/openai/v1/chat/completions", "/x/../../openai/v1/chat/completions",
		"//evil/v1/chat/completions", `/\evil/v1/chat/completions`} {
		if got := send(path); got != http.StatusTooManyRequests {
			t.Errorf("%s beside the user's one stream: %d, want 429", path, got)
		}
	}
	up.checkNoneStarted(t)
	if got := send("/v1/models"); got != http.StatusOK {
		t.Errorf("/v1/models: %d, want 200 (not limited)", got)
	}
}
