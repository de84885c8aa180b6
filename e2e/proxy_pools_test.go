package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// The proxy tests of pools whose key the proxy reads from the request
// body (identity.pools: {model: body:model}): pool model caps key "big"
// at 1 stream, whoever's; other models are not capped.

// poolProxyPools is the pools' part of the proxy's config file.
const poolProxyPools = `identity:
  pools: {model: "body:model"}
pools:
  static:
    - pool: model
      keys: {big: 1}
`

// bodyLLM is a test upstream speaking OpenAI's chat completion SSE that
// records the exact bytes of each request body. A request naming a stream
// (header X-Test-Stream) sends its first chunk and holds the rest until
// the test releases that name; one naming none streams at once.
//
// POST /v1/upload (outside the proxy's routes) answers "ack" as soon as it
// has the first uploadFirst bytes of the body, then reads the rest and
// writes how many bytes it got in all.
type bodyLLM struct {
	URL string

	mu       sync.Mutex
	received []bodyReceived
	holds    map[string]chan struct{}
	arrived  chan bodyReceived
}

// bodyReceived is one request the upstream received.
type bodyReceived struct {
	Path, Stream, Model, SHA256 string
	Bytes                       int
	Label                       string // the X-Limiter-Label it got, if any
	Raw                         []byte // the body
}

// uploadFirst is the first chunk of the /v1/upload body.
const uploadFirst = `{"upload":"first chunk",`

func startBodyLLM(t *testing.T) *bodyLLM {
	t.Helper()
	u := &bodyLLM{holds: map[string]chan struct{}{}, arrived: make(chan bodyReceived, 64)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", u.chat)
	mux.HandleFunc("POST /v1/upload", u.upload)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	// Runs before srv.Close (cleanups run last first): no handler is left
	// holding, so Close does not wait on one.
	t.Cleanup(u.releaseAll)
	u.URL = srv.URL
	return u
}

func (u *bodyLLM) hold(name string) chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	ch, ok := u.holds[name]
	if !ok {
		ch = make(chan struct{})
		u.holds[name] = ch
	}
	return ch
}

// release lets the stream named name finish.
func (u *bodyLLM) release(name string) {
	ch := u.hold(name)
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func (u *bodyLLM) releaseAll() {
	u.mu.Lock()
	names := make([]string, 0, len(u.holds))
	for name := range u.holds {
		names = append(names, name)
	}
	u.mu.Unlock()
	for _, name := range names {
		u.release(name)
	}
}

func (u *bodyLLM) record(r bodyReceived) {
	u.mu.Lock()
	u.received = append(u.received, r)
	u.mu.Unlock()
	select {
	case u.arrived <- r:
	default:
	}
}

// requests returns the requests received so far.
func (u *bodyLLM) requests() []bodyReceived {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]bodyReceived(nil), u.received...)
}

// request returns the request of the stream named name, waiting up to 5s
// for it.
func (u *bodyLLM) request(t *testing.T, name string) bodyReceived {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, r := range u.requests() {
			if r.Stream == name {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the upstream did not receive stream %q within 5s (got %+v)", name, u.requests())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (u *bodyLLM) chat(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sum := sha256.Sum256(body)
	var fields struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &fields)
	name := r.Header.Get("X-Test-Stream")
	u.record(bodyReceived{Path: r.URL.Path, Stream: name, Model: fields.Model, SHA256: hex.EncodeToString(sum[:]), Bytes: len(body),
		Label: r.Header.Get("X-Limiter-Label"), Raw: body})

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	send := func(content string, finish bool) {
		reason := "null"
		if finish {
			reason = `"stop"`
		}
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":%d,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n",
			time.Now().Unix(), fields.Model, content, reason)
		w.(http.Flusher).Flush()
	}
	send("first", false)
	if name != "" {
		select {
		case <-u.hold(name):
		case <-r.Context().Done():
			return
		}
	}
	send("last", true)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (u *bodyLLM) upload(w http.ResponseWriter, r *http.Request) {
	_ = http.NewResponseController(w).EnableFullDuplex()
	first := make([]byte, len(uploadFirst))
	if _, err := io.ReadFull(r.Body, first); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	u.record(bodyReceived{Path: r.URL.Path})
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprint(w, "ack\n")
	w.(http.Flusher).Flush()
	rest, err := io.Copy(io.Discard, r.Body)
	if err != nil {
		return
	}
	fmt.Fprintf(w, "%d\n", int64(len(first))+rest)
}

// poolProxy is a `limiter proxy` in front of a bodyLLM, whose pool model
// reads the body's model, and a limiter on the same keys to look at the
// slots.
type poolProxy struct {
	proc   *servetest.Process
	up     *bodyLLM
	lim    *limiter.Limiter
	config string
}

// poolProxyTiers are proxyTiers and "crash": 3 streams whose slots expire
// 4s after their last heartbeat, 1s apart.
var poolProxyTiers = append(append([]tiers.Tier(nil), proxyTiers...),
	tiers.Tier{Plan: "crash", MaxConcurrentStreams: 3, SlotTTL: 4 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen})

const poolProxyTiersYAML = proxyTiersYAML + `    - plan: crash
      maxConcurrentStreams: 3
      slotTTL: 4s
      heartbeatInterval: 1s
`

// startPoolProxy runs `limiter proxy`, with the pools of poolProxyPools,
// on the Redis at addrs (a server, or a cluster's seeds).
func startPoolProxy(t *testing.T, addrs []string) *poolProxy {
	t.Helper()
	up := startBodyLLM(t)
	prefix := "e2e-proxy-pools-" + randomID() + ":"
	quoted := make([]string, len(addrs))
	for i, a := range addrs {
		quoted[i] = strconv.Quote(a)
	}
	config := fmt.Sprintf("redis:\n  addrs: [%s]\n  keyPrefix: %q\n  timeout: 2s\nproxy:\n  upstream: %q\n  routes: [/v1/chat/completions]\nlog:\n  format: text\n%s%s",
		strings.Join(quoted, ", "), prefix, up.URL, poolProxyTiersYAML, poolProxyPools)
	proc := servetest.Start(t, servetest.Options{Command: "proxy", Config: config, AwaitRedis: true})
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"big": 1}}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	stack := limitertest.New(t, limitertest.Options{Tiers: poolProxyTiers, Redis: cluster.Options{Addrs: addrs, Timeout: 5 * time.Second},
		Limiter: limiter.Options{Keys: keys.Schema{Prefix: prefix}, Pools: table}})
	return &poolProxy{proc: proc, up: up, lim: stack.Limiter, config: config}
}

// poolKey returns the memberships of key of pool model.
func (e *poolProxy) poolKey(t *testing.T, key string) limiter.PoolKeySlots {
	t.Helper()
	slots, err := e.lim.PoolSlots(context.Background(), "model", key)
	if err != nil {
		t.Fatalf("PoolSlots(model, %s): %v", key, err)
	}
	return slots
}

func (e *poolProxy) used(t *testing.T, user string) int {
	t.Helper()
	slots, err := e.lim.Slots(context.Background(), user)
	if err != nil {
		t.Fatalf("Slots(%s): %v", user, err)
	}
	return slots.Used
}

// awaitPoolUsed waits up to within for model=key to hold want streams.
func (e *poolProxy) awaitPoolUsed(t *testing.T, key string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := e.poolKey(t, key).Used
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("model=%s holds %d streams %v on, want %d", key, got, within, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// post sends body to path through the proxy at base as user on plan;
// stream, when set, names the stream to the upstream (X-Test-Stream). The
// caller closes the response's body.
func postBody(t *testing.T, ctx context.Context, base, path, user, plan, stream string, body io.Reader) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-Id", user)
	req.Header.Set("X-Plan", plan)
	if stream != "" {
		req.Header.Set("X-Test-Stream", stream)
	}
	return http.DefaultClient.Do(req)
}

// poolRefusal is the proxy's OpenAI-shaped error body with a pool's
// fields.
type poolRefusal struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
		Pool    string `json:"pool"`
		Key     string `json:"key"`
	} `json:"error"`
}

func decodePoolRefusal(t *testing.T, resp *http.Response) poolRefusal {
	t.Helper()
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("status %d: reading the body: %v", resp.StatusCode, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("status %d: Content-Type %q, want application/json (%s)", resp.StatusCode, ct, data)
	}
	var e poolRefusal
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatalf("status %d: the body is not the JSON error: %v: %s", resp.StatusCode, err, data)
	}
	return e
}

// poolEvent is one line e2e/openai/pool.mjs prints.
type poolEvent struct {
	T           int64   `json:"t"`
	Event       string  `json:"event"`
	SHA256      string  `json:"sha256"`
	Bytes       int     `json:"bytes"`
	Content     string  `json:"content"`
	Chunks      int     `json:"chunks"`
	Name        string  `json:"name"`
	RateLimit   bool    `json:"rateLimit"`
	Status      *int    `json:"status"`
	Code        string  `json:"code"`
	Type        string  `json:"type"`
	Pool        string  `json:"pool"`
	Key         string  `json:"key"`
	RetryAfter  *string `json:"retryAfter"`
	ShouldRetry *string `json:"shouldRetry"`
	Message     string  `json:"message"`
}

// eventJSON renders ev for a message (its pointers as their values).
func eventJSON(ev poolEvent) string {
	data, _ := json.Marshal(ev)
	return string(data)
}

// poolSDK runs e2e/openai/pool.mjs with the official OpenAI Node SDK.
type poolSDK struct{ script *nodeScript }

func newPoolSDK(t *testing.T) *poolSDK { return &poolSDK{script: newNodeScript(t, "pool.mjs")} }

// run starts one streaming chat completion through the proxy at base and
// returns its events as they come; the process is killed at cleanup.
func (s *poolSDK) run(t *testing.T, base string, env ...string) <-chan poolEvent {
	t.Helper()
	return runScript[poolEvent](t, s.script, base, env...)
}

// nextPoolEvent returns the next event, failing the test when none comes
// within 10s.
func nextPoolEvent(t *testing.T, events <-chan poolEvent, what string) poolEvent {
	t.Helper()
	return nextEvent(t, events, 10*time.Second, what)
}

// sdkStreamStarted reads a stream's "sent" event and its first chunk, and
// checks that the upstream received, byte for byte, the body the SDK sent.
func sdkStreamStarted(t *testing.T, e *poolProxy, events <-chan poolEvent, stream, model string) {
	t.Helper()
	sent := nextPoolEvent(t, events, "stream "+stream+" sending its request")
	if sent.Event != "sent" || sent.SHA256 == "" {
		t.Fatalf("stream %s: %+v, want the SDK's request body's hash", stream, sent)
	}
	if ev := nextPoolEvent(t, events, "stream "+stream+"'s first chunk"); ev.Event != "chunk" || ev.Content != "first" {
		t.Fatalf("stream %s (model %s): %+v, want its first chunk", stream, model, ev)
	}
	got := e.up.request(t, stream)
	if got.SHA256 != sent.SHA256 || got.Bytes != sent.Bytes {
		t.Fatalf("stream %s: the upstream received %d bytes, SHA-256 %s; the SDK sent %d bytes, SHA-256 %s: the proxy did not forward the body byte for byte",
			stream, got.Bytes, got.SHA256, sent.Bytes, sent.SHA256)
	}
	if got.Model != model {
		t.Errorf("stream %s: the upstream received model %q, want %q", stream, got.Model, model)
	}
	// The hash would catch a re-encoding: decoding the body and encoding
	// it again, as Go does, changes its bytes (the order of its fields,
	// the escaping of its strings).
	var decoded map[string]any
	if err := json.Unmarshal(got.Raw, &decoded); err != nil {
		t.Fatalf("stream %s: the upstream received a body that is not JSON: %v", stream, err)
	}
	if again, _ := json.Marshal(decoded); bytes.Equal(again, got.Raw) {
		t.Errorf("stream %s: the SDK's body is the same once re-encoded; the hash check would not notice a re-encoding", stream)
	}
}

// sdkStreamDone reads a released stream's last chunk and its end.
func sdkStreamDone(t *testing.T, events <-chan poolEvent, stream string) {
	t.Helper()
	if ev := nextPoolEvent(t, events, "stream "+stream+"'s last chunk"); ev.Event != "chunk" || ev.Content != "last" {
		t.Fatalf("stream %s after its release: %+v, want its last chunk", stream, ev)
	}
	if ev := nextPoolEvent(t, events, "stream "+stream+"'s end"); ev.Event != "done" {
		t.Fatalf("stream %s: %+v, want done", stream, ev)
	}
}

// The official OpenAI Node SDK streams through `limiter proxy` on the
// Redis Cluster, with pool model read from the body's model (big capped
// at 1): a second user's big stream is the SDK's RateLimitError
// pool_limit_reached naming the pool and key, at once and without
// retries; a small stream passes beside it; the upstream receives each
// body as the SDK sent it, byte for byte; a body over
// proxy.maxBodyBytes is 413 request_too_large; and once the first big
// stream ends, big is granted again.
func TestOpenAISDKPoolThroughTheProxy(t *testing.T) {
	js := newPoolSDK(t)
	e := startPoolProxy(t, testenv.Cluster(t))
	alice, bob := "pool-alice-"+randomID(), "pool-bob-"+randomID()

	// Alice holds model=big.
	a := js.run(t, e.proc.API, "USER_ID="+alice, "PLAN=paid", "MODEL=big", "STREAM=a")
	sdkStreamStarted(t, e, a, "a", "big")
	big := e.poolKey(t, "big")
	if big.Used != 1 || len(big.Holders) != 1 || big.Holders[0].UserID != alice {
		t.Fatalf("model=big mid-stream: %+v, want held by %s", big, alice)
	}
	// No X-Limiter-Label: the body's model labels the slot.
	if label := big.Holders[0].Label; label != "big" {
		t.Errorf("the slot's label is %q, want the body's model, big", label)
	}

	// Bob, whose plan has room, is refused big: the pool's cap.
	b := js.run(t, e.proc.API, "USER_ID="+bob, "PLAN=paid", "MODEL=big", "STREAM=b")
	sent := 0
	var refused poolEvent
	for refused.Event == "" {
		switch ev := nextPoolEvent(t, b, "bob's big stream's answer"); ev.Event {
		case "sent":
			sent++
		case "error":
			refused = ev
		default:
			t.Fatalf("bob's big stream while alice holds big: %+v, want the SDK's RateLimitError", ev)
		}
	}
	t.Logf("bob's big stream: %s", eventJSON(refused))
	if refused.Name != "RateLimitError" || !refused.RateLimit || refused.Status == nil || *refused.Status != http.StatusTooManyRequests ||
		refused.Code != "pool_limit_reached" || refused.Type != "rate_limit_error" || refused.Pool != "model" || refused.Key != "big" {
		t.Errorf("bob's big stream: %s, want RateLimitError 429 rate_limit_error pool_limit_reached, pool model, key big", eventJSON(refused))
	}
	if refused.RetryAfter == nil || *refused.RetryAfter == "" {
		t.Errorf("the refusal has no Retry-After")
	} else if n, err := strconv.Atoi(*refused.RetryAfter); err != nil || n < 1 {
		t.Errorf("Retry-After %q, want whole seconds >= 1", *refused.RetryAfter)
	}
	if refused.ShouldRetry == nil || *refused.ShouldRetry != "false" {
		t.Errorf("x-should-retry %v, want false", refused.ShouldRetry)
	}
	if sent != 1 {
		t.Errorf("the SDK sent bob's refused request %d times, want once (x-should-retry: false)", sent)
	}
	for _, r := range e.up.requests() {
		if r.Stream == "b" {
			t.Errorf("bob's refused big stream reached the upstream")
		}
	}

	// Bob's small stream passes beside alice's big one.
	c := js.run(t, e.proc.API, "USER_ID="+bob, "PLAN=paid", "MODEL=small", "STREAM=c")
	sdkStreamStarted(t, e, c, "c", "small")
	if n := e.used(t, bob); n != 1 {
		t.Errorf("bob holds %d slots with his small stream open, want 1 (the refused one took none)", n)
	}

	// A body over proxy.maxBodyBytes (8 MiB): 413, no slot, not upstream.
	t.Run("a 9 MiB body is 413 request_too_large", func(t *testing.T) {
		huge := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("x", 9<<20) + `"}],"stream":true,"model":"big"}`)
		before := len(e.up.requests())
		for _, tc := range []struct {
			name string
			body func() io.Reader
		}{
			{"with Content-Length", func() io.Reader { return bytes.NewReader(huge) }},
			{"chunked", func() io.Reader { return struct{ io.Reader }{bytes.NewReader(huge)} }},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := postBody(t, ctx, e.proc.API, "/v1/chat/completions", bob, "paid", "huge", tc.body())
			if err != nil {
				cancel()
				t.Fatalf("%s: %v, want a 413", tc.name, err)
			}
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				cancel()
				t.Fatalf("%s: status %d (%.200s), want 413", tc.name, resp.StatusCode, data)
			}
			if got := decodePoolRefusal(t, resp); got.Error.Code != "request_too_large" || got.Error.Type != "invalid_request_error" || got.Error.Message == "" {
				t.Errorf("%s: %+v, want invalid_request_error request_too_large with a message", tc.name, got.Error)
			}
			cancel()
		}
		// The SDK, sending the same: its APIError 413, at the first try.
		hugeSDK := js.run(t, e.proc.API, "USER_ID="+bob, "PLAN=paid", "MODEL=big", "STREAM=huge-sdk", "PAD_BYTES="+strconv.Itoa(9<<20))
		sent := 0
		var refused poolEvent
		for refused.Event == "" {
			switch ev := nextPoolEvent(t, hugeSDK, "the SDK's 9 MiB request's answer"); ev.Event {
			case "sent":
				sent++
				if ev.Bytes <= 9<<20 {
					t.Errorf("the SDK sent %d bytes, want over 9 MiB", ev.Bytes)
				}
			case "error":
				refused = ev
			default:
				t.Fatalf("the SDK's 9 MiB request: %+v, want its APIError 413", ev)
			}
		}
		if refused.Status == nil || *refused.Status != http.StatusRequestEntityTooLarge || refused.Code != "request_too_large" || refused.Type != "invalid_request_error" {
			t.Errorf("the SDK's 9 MiB request: %s, want APIError 413 invalid_request_error request_too_large", eventJSON(refused))
		}
		if sent != 1 {
			t.Errorf("the SDK sent its 9 MiB request %d times, want once", sent)
		}
		if got := len(e.up.requests()); got != before {
			t.Errorf("the upstream received %d requests of a 9 MiB body, want none", got-before)
		}
		if n := e.used(t, bob); n != 1 {
			t.Errorf("bob holds %d slots after two 413s, want 1 (his small stream)", n)
		}
	})

	// Alice's stream ends: model=big frees up, and bob gets it.
	e.up.release("a")
	sdkStreamDone(t, a, "a")
	e.awaitPoolUsed(t, "big", 0, time.Second)
	d := js.run(t, e.proc.API, "USER_ID="+bob, "PLAN=paid", "MODEL=big", "STREAM=d")
	sdkStreamStarted(t, e, d, "d", "big")
	if big := e.poolKey(t, "big"); big.Used != 1 || big.Holders[0].UserID != bob {
		t.Errorf("model=big after alice's stream ended: %+v, want held by %s", big, bob)
	}
	e.up.release("d")
	e.up.release("c")
	sdkStreamDone(t, d, "d")
	sdkStreamDone(t, c, "c")
	e.awaitPoolUsed(t, "big", 0, time.Second)
	// Released, not expired: the paid plan's TTL is 30s.
	eventually(t, time.Second, "bob's slots released after his streams ended", func() bool { return e.used(t, bob) == 0 })
}

// A limited request whose body the pool cannot read is 400 with a JSON
// error, takes no slot and never reaches the upstream; a body without
// the field joins no key; a request outside proxy.routes is forwarded as
// it comes, not buffered.
func TestProxyBadBodies(t *testing.T) {
	e := startPoolProxy(t, []string{testenv.Redis(t)})
	user := "badbody-" + randomID()
	cases := []struct {
		name, body, want string
	}{
		{"not JSON", `model=big`, "invalid_body"},
		{"JSON, not an object", `["model","big"]`, "invalid_body"},
		{"model is a number", `{"messages":[],"model":42,"stream":true}`, "invalid_pool_key"},
		{"model outside the key charset", `{"model":"a b","stream":true}`, "invalid_pool_key"},
		{"model twice", `{"model":"big","model":"small","stream":true}`, "invalid_body"},
		{"model twice, once escaped", `{"model":"big","mod\u0065l":"small","stream":true}`, "invalid_body"},
	}
	invalid := `limiter_streams_refused_total{mode="proxy",reason="invalid"}`
	invalidBefore := metricValue(t, e.proc, invalid)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := postBody(t, context.Background(), e.proc.API, "/v1/chat/completions", user, "paid", "", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest {
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("status %d (%s), want 400", resp.StatusCode, data)
			}
			got := decodePoolRefusal(t, resp)
			if got.Error.Code != tc.want || got.Error.Type != "invalid_request_error" || got.Error.Message == "" {
				t.Errorf("%s: %+v, want invalid_request_error %s with a message", tc.body, got.Error, tc.want)
			}
		})
	}
	if got := e.up.requests(); len(got) != 0 {
		t.Errorf("refused bodies reached the upstream: %+v", got)
	}
	if got := metricValue(t, e.proc, invalid) - invalidBefore; got != float64(len(cases)) {
		t.Errorf("%s rose by %v, want %d (one per refused body)", invalid, got, len(cases))
	}
	if n := e.used(t, user); n != 0 {
		t.Errorf("%d slots held after refused bodies, want 0", n)
	}
	if n := e.poolKey(t, "big").Used; n != 0 {
		t.Errorf("model=big holds %d streams after refused bodies, want 0", n)
	}

	t.Run("a body without model joins no key", func(t *testing.T) {
		held, err := postBody(t, context.Background(), e.proc.API, "/v1/chat/completions", "holder-"+randomID(), "paid", "held",
			strings.NewReader(`{"model":"big","stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		defer held.Body.Close()
		if held.StatusCode != http.StatusOK {
			t.Fatalf("the first big stream: status %d, want 200", held.StatusCode)
		}
		e.up.request(t, "held")
		resp, err := postBody(t, context.Background(), e.proc.API, "/v1/chat/completions", user, "paid", "",
			strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), "[DONE]") {
			t.Errorf("a body without model while model=big is full: status %d (%.300s), want the stream", resp.StatusCode, data)
		}
		if got := e.up.requests(); got[len(got)-1].Label != "" {
			t.Errorf("the upstream got X-Limiter-Label %q", got[len(got)-1].Label)
		}
		e.up.release("held")
	})

	// A limited route's body is buffered: the upstream sees nothing of a
	// request until its body has ended. (The control of the next subtest:
	// the same piped body that is not buffered there.)
	t.Run("a limited route's body is buffered", func(t *testing.T) {
		before := len(e.up.requests())
		pr, pw := io.Pipe()
		defer pw.Close()
		answered := make(chan *http.Response, 1)
		go func() {
			resp, err := postBody(t, context.Background(), e.proc.API, "/v1/chat/completions", user, "paid", "", pr)
			if err != nil {
				pr.CloseWithError(err)
				close(answered)
				return
			}
			answered <- resp
		}()
		if _, err := pw.Write([]byte(`{"model":"big",`)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		if n := len(e.up.requests()) - before; n != 0 {
			t.Fatalf("the upstream got the request before its body ended")
		}
		if _, err := pw.Write([]byte(`"stream":true}`)); err != nil {
			t.Fatal(err)
		}
		pw.Close()
		resp := within(t, answered, 5*time.Second, "the answer once the body ended")
		if resp == nil {
			t.Fatal("the request failed")
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), "[DONE]") {
			t.Errorf("status %d (%.300s), want the stream", resp.StatusCode, data)
		}
	})

	// Outside proxy.routes: the upstream answers after the body's first
	// chunk while the client still holds the rest; the answer reaches the
	// client only if the proxy forwarded the body as it came.
	t.Run("a route outside proxy.routes is not buffered", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		written := make(chan error, 1)
		go func() {
			_, err := pw.Write([]byte(uploadFirst))
			written <- err
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		type answer struct {
			resp *http.Response
			err  error
		}
		answered := make(chan answer, 1)
		go func() {
			resp, err := postBody(t, ctx, e.proc.API, "/v1/upload", user, "paid", "", pr)
			answered <- answer{resp, err}
		}()
		var got answer
		select {
		case got = <-answered:
		case <-time.After(5 * time.Second):
			t.Fatal("no answer within 5s while the body was still open: the proxy buffered a request outside proxy.routes")
		}
		if got.err != nil {
			t.Fatalf("upload: %v", got.err)
		}
		defer got.resp.Body.Close()
		if got.resp.StatusCode != http.StatusOK {
			t.Fatalf("upload: status %d, want 200", got.resp.StatusCode)
		}
		lines := bufio.NewReader(got.resp.Body)
		if ack, err := lines.ReadString('\n'); ack != "ack\n" {
			t.Fatalf("upload: %q, %v; want the upstream's ack", ack, err)
		}
		if err := <-written; err != nil {
			t.Fatal(err)
		}
		rest := `"rest":"` + strings.Repeat("r", 1000) + `"}`
		if _, err := pw.Write([]byte(rest)); err != nil {
			t.Fatalf("writing the rest of the body after the answer: %v", err)
		}
		pw.Close()
		total, err := lines.ReadString('\n')
		if want := strconv.Itoa(len(uploadFirst)+len(rest)) + "\n"; total != want {
			t.Errorf("the upstream got %q bytes (%v), want %q", total, err, want)
		}
	})
}

// A `limiter proxy` SIGKILLed mid-stream releases nothing: the stream's
// membership of model=big stays until its slot TTL (4s, heartbeats 1s
// apart) runs out, so a second proxy refuses big at first with 429
// pool_limit_reached, and grants it within the TTL (+1s) of the kill.
func TestProxyPoolSlotFreedAfterSIGKILL(t *testing.T) {
	const ttl, heartbeat = 4 * time.Second, time.Second
	e := startPoolProxy(t, []string{testenv.Redis(t)})
	holder := "sigkill-" + randomID()
	resp, err := postBody(t, context.Background(), e.proc.API, "/v1/chat/completions", holder, "crash", "held",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"model":"big","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the big stream: status %d, want 200", resp.StatusCode)
	}
	data, _ := sseData(resp.Body)
	within(t, data, 5*time.Second, "the big stream's first chunk")
	if big := e.poolKey(t, "big"); big.Used != 1 {
		t.Fatalf("model=big mid-stream: %+v, want 1 held", big)
	}

	e.proc.Kill()
	killed := time.Now()
	second := servetest.Start(t, servetest.Options{Command: "proxy", Config: e.config, AwaitRedis: true})
	t.Logf("second proxy ready %v after the kill", time.Since(killed).Round(time.Millisecond))

	// try sends a big stream (that the upstream does not hold) through the
	// second proxy and returns its status and error code.
	try := func() (int, poolRefusal) {
		resp, err := postBody(t, context.Background(), second.API, "/v1/chat/completions", "next-"+randomID(), "crash", "",
			strings.NewReader(`{"model":"big","stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode, poolRefusal{}
		}
		return resp.StatusCode, decodePoolRefusal(t, resp)
	}
	status, refusal := try()
	if asked := time.Since(killed); asked >= ttl-heartbeat {
		t.Fatalf("the second proxy answered %v after the kill, too late to see the slot still held (TTL %v, heartbeats %v apart)", asked, ttl, heartbeat)
	}
	if status != http.StatusTooManyRequests || refusal.Error.Code != "pool_limit_reached" || refusal.Error.Pool != "model" || refusal.Error.Key != "big" {
		t.Fatalf("big through the second proxy right after the kill: %d %+v; want 429 pool_limit_reached model big (the killed proxy's stream holds it until its TTL)",
			status, refusal.Error)
	}

	deadline := killed.Add(ttl + time.Second)
	for {
		status, refusal = try()
		if status == http.StatusOK {
			break
		}
		if status != http.StatusTooManyRequests || refusal.Error.Code != "pool_limit_reached" {
			t.Fatalf("big through the second proxy: %d %+v; want 429 pool_limit_reached until the TTL, then 200", status, refusal.Error)
		}
		if time.Now().After(deadline) {
			t.Fatalf("model=big still refused %v after the kill, past the %v TTL (+1s)", time.Since(killed).Round(time.Millisecond), ttl)
		}
		time.Sleep(100 * time.Millisecond)
	}
	freed := time.Since(killed)
	t.Logf("model=big granted again %v after the SIGKILL (TTL %v)", freed.Round(time.Millisecond), ttl)
	if freed < ttl-heartbeat-200*time.Millisecond {
		t.Errorf("model=big freed %v after the kill, before the TTL could expire it (>= %v)", freed, ttl-heartbeat)
	}
	e.awaitPoolUsed(t, "big", 0, time.Second) // the granted stream ended
}
