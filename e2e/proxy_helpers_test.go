package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
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
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// proxyTiers are the plans of the proxy tests: free holds one stream with
// a 1s TTL (so a crash frees it fast), paid three with a 30s TTL (so a
// slot gone within seconds was released, not expired), queued one whose
// requests may wait 10s for it (with proxy.wait), queued-short one that
// may be waited for 1s.
var proxyTiers = []tiers.Tier{
	{Plan: "free", MaxConcurrentStreams: 1, SlotTTL: time.Second, HeartbeatInterval: 300 * time.Millisecond, FailureMode: tiers.FailOpen},
	{Plan: "paid", MaxConcurrentStreams: 3, SlotTTL: 30 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
	{Plan: "queued", MaxConcurrentStreams: 1, SlotTTL: 30 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 10 * time.Second},
	{Plan: "queued-short", MaxConcurrentStreams: 1, SlotTTL: 30 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: time.Second},
}

const proxyTiersYAML = `tiers:
  static:
    - plan: free
      maxConcurrentStreams: 1
      slotTTL: 1s
      heartbeatInterval: 300ms
    - plan: paid
      maxConcurrentStreams: 3
      slotTTL: 30s
      heartbeatInterval: 1s
    - plan: queued
      maxConcurrentStreams: 1
      slotTTL: 30s
      heartbeatInterval: 1s
      maxWait: 10s
    - plan: queued-short
      maxConcurrentStreams: 1
      slotTTL: 30s
      heartbeatInterval: 1s
      maxWait: 1s
`

// llm is a test upstream speaking OpenAI's chat completion SSE. The
// request's model says how it streams:
//
//	fast            three chunks at once
//	hold            one chunk, then the rest once the test calls Release
//	slow:N:MS       N chunks, MS milliseconds apart
//	prefill         nothing, not even its headers, until the request ends
type llm struct {
	URL      string
	requests atomic.Int32
	first    chan time.Time // when each "hold" stream sent its first chunk
	prefill  chan time.Time // when each "prefill" request arrived
	finished chan time.Time // when each stream sent [DONE]

	mu      sync.Mutex
	release chan struct{}
	headers []http.Header
}

func startLLM(t *testing.T) *llm {
	t.Helper()
	u := &llm{first: make(chan time.Time, 16), prefill: make(chan time.Time, 16), finished: make(chan time.Time, 16), release: make(chan struct{})}
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	return u
}

// Release lets the "hold" streams finish.
func (u *llm) Release() {
	u.mu.Lock()
	defer u.mu.Unlock()
	close(u.release)
	u.release = make(chan struct{})
}

// Headers returns the headers of the requests received so far.
func (u *llm) Headers() []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.headers...)
}

func (u *llm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	u.mu.Lock()
	u.headers = append(u.headers, r.Header.Clone())
	release := u.release
	u.mu.Unlock()
	var body struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	if !body.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":%d,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`, time.Now().Unix(), body.Model)
		return
	}
	if body.Model == "prefill" { // a long prefill: no answer yet, until the proxy gives up the request
		u.prefill <- time.Now()
		<-r.Context().Done()
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	send := func(content string, finish bool) bool {
		reason := "null"
		if finish {
			reason = `"stop"`
		}
		_, err := fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":%d,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n",
			time.Now().Unix(), body.Model, content, reason)
		w.(http.Flusher).Flush()
		return err == nil
	}
	switch {
	case body.Model == "hold":
		send("first", false)
		u.first <- time.Now()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		send("last", true)
	case strings.HasPrefix(body.Model, "slow:"):
		var n, ms int
		fmt.Sscanf(strings.ReplaceAll(body.Model, ":", " "), "slow %d %d", &n, &ms)
		for i := range n {
			if i > 0 {
				select {
				case <-time.After(time.Duration(ms) * time.Millisecond):
				case <-r.Context().Done():
					return
				}
			}
			if !send("tok"+strconv.Itoa(i), i == n-1) {
				return
			}
		}
	default:
		for i := range 3 {
			send("tok"+strconv.Itoa(i), i == 2)
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	u.finished <- time.Now()
}

// proxyEnv is a `limiter proxy` process in front of an llm, on the shared
// Redis, and a limiter on the same keys to look at its slots.
type proxyEnv struct {
	proc *servetest.Process
	llm  *llm
	lim  *limiter.Limiter
}

// startProxy runs `limiter proxy` in front of a new llm; extra is more
// YAML for its config file.
func startProxy(t *testing.T, extra string, args ...string) *proxyEnv {
	t.Helper()
	return startProxyOn(t, testenv.Redis(t), extra, args...)
}

// startProxyOn is startProxy with the proxy reaching Redis at redis (a
// testenv.Proxy in front of the shared one), its slots looked at
// directly.
func startProxyOn(t *testing.T, redis, extra string, args ...string) *proxyEnv {
	t.Helper()
	up := startLLM(t)
	prefix := "e2e-proxy-" + randomID() + ":"
	config := fmt.Sprintf("redis:\n  addrs: [%q]\n  keyPrefix: %q\n  timeout: 2s\nproxy:\n  upstream: %q\n  routes: [/v1/chat/completions]\nlog:\n  format: text\n%s%s",
		redis, prefix, up.URL, proxyTiersYAML, extra)
	proc := servetest.Start(t, servetest.Options{Command: "proxy", Config: config, Args: args, AwaitRedis: true})
	stack := limitertest.New(t, limitertest.Options{Tiers: proxyTiers, Redis: cluster.Options{Timeout: 5 * time.Second},
		Limiter: limiter.Options{Keys: keys.Schema{Prefix: prefix}}})
	return &proxyEnv{proc: proc, llm: up, lim: stack.Limiter}
}

func (e *proxyEnv) used(t *testing.T, user string) int {
	t.Helper()
	slots, err := e.lim.Slots(context.Background(), user)
	if err != nil {
		t.Fatalf("Slots(%s): %v", user, err)
	}
	return slots.Used
}

// awaitUsed waits up to within for user to hold want slots and returns
// how long it took.
func (e *proxyEnv) awaitUsed(t *testing.T, user string, want int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := e.used(t, user)
		if got == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("user %s holds %d slots %v on, want %d\n%s", user, got, within, want, e.proc.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// chat sends a streaming chat completion through the proxy as user on
// plan and returns the response (the caller closes its body).
func (e *proxyEnv) chat(t *testing.T, ctx context.Context, user, plan, model string, header http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", e.proc.API+"/v1/chat/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, model)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if user != "" {
		req.Header.Set("X-User-Id", user)
	}
	if plan != "" {
		req.Header.Set("X-Plan", plan)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("chat completion through the proxy: %v", err)
	}
	return resp
}

// holdStream opens a streaming chat completion of user on plan whose llm
// stream holds ("hold") until the test releases it, waits up to 5s for its
// first chunk (what names it in the failure), and returns its data lines.
// Its body is closed on the test's cleanup.
func (e *proxyEnv) holdStream(t *testing.T, user, plan, what string) <-chan string {
	t.Helper()
	resp := e.chat(t, context.Background(), user, plan, "hold", nil)
	t.Cleanup(func() { resp.Body.Close() })
	data, _ := sseData(resp.Body)
	within(t, data, 5*time.Second, what)
	return data
}

// sseData returns the data lines of an SSE body as they arrive
// (proxytest.SSEData).
func sseData(body io.Reader) (<-chan string, *atomic.Value) { return proxytest.SSEData(body) }

func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("not within %v: %s", d, what)
	}
	var zero T
	return zero
}
