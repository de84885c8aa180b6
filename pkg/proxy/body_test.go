package proxy_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/proxy"
)

// bodyEnv is a proxy whose pool model takes its key from the body's
// model field: big is capped at 1, every other model at 10.
func bodyEnv(t *testing.T, up http.Handler, maxBody int64, routes ...string) *env {
	t.Helper()
	table := pools.NewTable()
	ten := 10
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", MaxConcurrentStreams: &ten, Keys: map[string]int{"big": 1}}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	sources, err := identity.ParsePoolSources(map[string]string{"model": "body:model"})
	if err != nil {
		t.Fatal(err)
	}
	return newEnv(t, up, envOptions{
		proxy:    proxy.Options{MaxBodyBytes: maxBody, Routes: routes},
		stack:    limitertest.Options{Limiter: limiter.Options{Pools: table}},
		identity: identity.Options{Pools: sources},
	})
}

// recorder is an upstream that records the hash of each body it reads
// and answers at once.
type recorder struct{ hashes chan [32]byte }

func (r recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.hashes <- sha256.Sum256(body)
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

func (e *env) chat(t *testing.T, ctx context.Context, user, body string) *http.Response {
	t.Helper()
	req := e.request(t, ctx, http.MethodPost, "/v1/chat/completions", user, "three", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return e.do(t, req)
}

// A body source caps a model across users: the second stream of big is
// refused with the OpenAI-shaped pool_limit_reached, small passes, and
// the upstream reads each body as the client sent it, byte for byte.
func TestBodyPoolCapsAModel(t *testing.T) {
	up := newSSE()
	bodies := make(chan []byte, 4)
	e := bodyEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- b
		up.ServeHTTP(w, r)
	}), 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ana, bo := newUser(), newUser()
	// messages before model, escapes and spacing the proxy must not touch.
	body := "{ \"messages\": [{\"role\":\"user\",\"content\":\"say \\\"model\\\": \\u00e9\"}],\n  \"model\" : \"big\", \"stream\": true }"

	first := e.chat(t, ctx, ana, body)
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("the first stream of big: %d %+v", first.StatusCode, decodeError(t, first))
	}
	got := <-up.started
	if sent := <-bodies; !bytes.Equal(sent, []byte(body)) || got.ContentLength != int64(len(body)) {
		t.Errorf("the upstream read %d bytes (Content-Length %d); want the client's %d byte for byte", len(sent), got.ContentLength, len(body))
	}
	slots, err := e.Stack.Limiter.Slots(ctx, ana)
	if err != nil || len(slots.Slots) != 1 || slots.Slots[0].Label != "big" {
		t.Errorf("ana's slots %+v, %v; want one labelled big, the body's model", slots, err)
	}

	second := e.chat(t, ctx, bo, `{"model":"big","messages":[]}`)
	if second.StatusCode != http.StatusTooManyRequests || second.Header.Get("Retry-After") == "" || second.Header.Get("X-Should-Retry") != "false" {
		t.Errorf("the second stream of big: %d Retry-After %q x-should-retry %q; want 429 with both", second.StatusCode,
			second.Header.Get("Retry-After"), second.Header.Get("X-Should-Retry"))
	}
	refusal := decodePoolError(t, second)
	if refusal.Code != "pool_limit_reached" || refusal.Type != "rate_limit_error" || refusal.Pool != "model" || refusal.Key != "big" ||
		refusal.Used == nil || *refusal.Used != 1 || refusal.Limit == nil || *refusal.Limit != 1 {
		t.Errorf("the refusal %+v; want pool_limit_reached of model=big, 1 of 1", refusal)
	}
	if n := e.Used(t, bo); n != 0 {
		t.Errorf("bo holds %d slots after the pool refused him; want 0", n)
	}
	up.checkNoneStarted(t)

	third := e.chat(t, ctx, bo, `{"model":"small","messages":[]}`)
	defer third.Body.Close()
	if third.StatusCode != http.StatusOK {
		t.Errorf("small beside a full big: %d; want 200", third.StatusCode)
	}
	<-up.started
	<-bodies
	key, err := e.Stack.Limiter.PoolSlots(ctx, "model", "big")
	if err != nil || key.Used != 1 {
		t.Errorf("model=big holds %d (%v); want 1", key.Used, err)
	}
}

type poolError struct {
	Code, Type, Message, Pool, Key string
	Used, Limit                    *int
}

func decodePoolError(t *testing.T, resp *http.Response) poolError {
	t.Helper()
	defer resp.Body.Close()
	var body struct{ Error poolError }
	if err := jsonDecode(resp.Body, &body); err != nil {
		t.Fatalf("decoding the refusal: %v", err)
	}
	return body.Error
}

// Bodies the proxy cannot take a key from are refused with a JSON 400,
// before any slot and before the upstream.
func TestBadBodiesTakeNoSlot(t *testing.T) {
	up := newSSE()
	e := bodyEnv(t, up, 0)
	ctx := context.Background()
	user := newUser()
	cases := []struct{ name, body, code string }{
		{"not JSON", `model=big`, "invalid_body"},
		{"not an object", `["big"]`, "invalid_body"},
		{"model a number", `{"model":7}`, "invalid_pool_key"},
		{"model outside the key charset", `{"model":"big model"}`, "invalid_pool_key"},
		{"model twice", `{"model":"small","model":"big"}`, "invalid_body"},
		{"model twice, spelt apart", `{"model":"small","mod\u0065l":"big"}`, "invalid_body"},
	}
	for _, tc := range cases {
		resp := e.chat(t, ctx, user, tc.body)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d; want 400", tc.name, resp.StatusCode)
		}
		if body := decodeError(t, resp); body.Error.Code != tc.code {
			t.Errorf("%s: code %q (%s); want %s", tc.name, body.Error.Code, body.Error.Message, tc.code)
		}
	}
	e.checkRefused(t, up, user, 0, "invalid", len(cases))
	if key, err := e.Stack.Limiter.PoolSlots(ctx, "model", "big"); err != nil || key.Used != 0 {
		t.Errorf("model=big holds %d (%v) after bad bodies; want 0", key.Used, err)
	}
}

// A compressed JSON body is refused with a message that names its
// encoding, not one that calls JSON not JSON; an identity encoding is
// read as it is.
func TestACompressedBodyIsRefusedNamingItsEncoding(t *testing.T) {
	e := bodyEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "{}")
	}), 0)
	ctx := context.Background()
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = io.WriteString(w, `{"model":"big"}`)
	_ = w.Close()
	for _, tc := range []struct {
		encoding, body string
		status         int
		says           string
	}{
		{"gzip", gz.String(), http.StatusBadRequest, "it was sent with Content-Encoding: gzip; a pool's body source reads uncompressed JSON"},
		{"identity", `{"model":"small"}`, http.StatusOK, ""},
	} {
		req := e.request(t, ctx, http.MethodPost, "/v1/chat/completions", newUser(), "three", strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", tc.encoding)
		resp := e.do(t, req)
		if resp.StatusCode != tc.status {
			t.Errorf("Content-Encoding %s: %d, want %d", tc.encoding, resp.StatusCode, tc.status)
		}
		if tc.says == "" {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			continue
		}
		if body := decodeError(t, resp); body.Error.Code != "invalid_body" || !strings.Contains(body.Error.Message, tc.says) {
			t.Errorf("Content-Encoding %s: %s %q, want invalid_body saying %q", tc.encoding, body.Error.Code, body.Error.Message, tc.says)
		}
	}
}

// proxy.maxBodyBytes, ±1: at the bound the request passes, one byte over
// it is 413 whether the client says its length or sends it chunked.
func TestBodyOverTheBoundIs413(t *testing.T) {
	const bound = 1024
	rec := recorder{hashes: make(chan [32]byte, 4)}
	e := bodyEnv(t, rec, bound)
	ctx := context.Background()
	body := func(n int) string {
		head := `{"model":"small","pad":"`
		return head + strings.Repeat("x", n-len(head)-2) + `"}`
	}
	at := body(bound)
	resp := e.chat(t, ctx, newUser(), at)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a body of %d bytes, the bound: %d; want 200", len(at), resp.StatusCode)
	}
	if got := <-rec.hashes; got != sha256.Sum256([]byte(at)) { // the 200 came after the upstream's read
		t.Error("the upstream read another body than the client's")
	}
	// The same body chunked, its length unknown until its end: read whole.
	req := e.request(t, ctx, http.MethodPost, "/v1/chat/completions", newUser(), "three", io.MultiReader(strings.NewReader(at)))
	req.ContentLength = -1
	resp = e.do(t, req)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a chunked body of %d bytes, the bound: %d; want 200", len(at), resp.StatusCode)
	}
	if got := <-rec.hashes; got != sha256.Sum256([]byte(at)) {
		t.Error("the upstream read another body than the client's chunked one")
	}

	over := body(bound + 1)
	resp = e.chat(t, ctx, newUser(), over)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a body of %d bytes with its length: %d; want 413", len(over), resp.StatusCode)
	}
	if b := decodeError(t, resp); b.Error.Code != "request_too_large" || !strings.Contains(b.Error.Message, "1024 bytes proxy.maxBodyBytes") {
		t.Errorf("its refusal %+v; want request_too_large naming proxy.maxBodyBytes and the bound", b.Error)
	}
	// Chunked: no length to go by, so the proxy reads one byte past the
	// bound.
	user := newUser()
	req = e.request(t, ctx, http.MethodPost, "/v1/chat/completions", user, "three", io.MultiReader(strings.NewReader(over)))
	req.ContentLength = -1
	resp = e.do(t, req)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a chunked body of %d bytes: %d; want 413", len(over), resp.StatusCode)
	}
	resp.Body.Close()
	if n := e.Used(t, user); n != 0 {
		t.Errorf("%d slots after a 413; want 0", n)
	}
	select {
	case <-rec.hashes:
		t.Error("a body over the bound reached the upstream")
	default:
	}
}

// An empty body (a GET on a limited route) joins no key of the pool and
// is granted.
func TestEmptyBodyJoinsNoKey(t *testing.T) {
	rec := recorder{hashes: make(chan [32]byte, 1)}
	e := bodyEnv(t, rec, 0)
	resp := e.do(t, e.request(t, context.Background(), http.MethodGet, "/v1/chat/completions", newUser(), "three", nil))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET without a body: %d; want 200", resp.StatusCode)
	}
	if got := <-rec.hashes; got != sha256.Sum256(nil) {
		t.Error("the upstream read a body; want none")
	}
}

// Only a body source buffers, and only on a limited route: elsewhere the
// upstream reads the body as it comes, and may answer before its end.
func TestBodiesStreamWhereNoSourceReadsThem(t *testing.T) {
	streams := func(t *testing.T, route string, newEnv func(http.Handler) *env) {
		answered := make(chan struct{})
		e := newEnv(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = http.NewResponseController(w).EnableFullDuplex()
			buf := make([]byte, 5)
			if _, err := io.ReadFull(r.Body, buf); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			_, _ = w.Write(buf)
			w.(http.Flusher).Flush()
			close(answered)
			_, _ = io.Copy(io.Discard, r.Body)
		}))
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write([]byte(`{"mod`))
			// The rest only once the upstream answered the first bytes.
			select {
			case <-answered:
				_, _ = pw.Write([]byte(`el":"big"}`))
				pw.Close()
			case <-time.After(5 * time.Second):
				pw.CloseWithError(errors.New("the upstream did not answer before the body's end: the proxy held the body back"))
			}
		}()
		resp := e.do(t, e.request(t, context.Background(), http.MethodPost, route, newUser(), "three", pr))
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(got) != `{"mod` {
			t.Errorf("POST %s: %d %q; want the upstream's answer to its first bytes", route, resp.StatusCode, got)
		}
	}
	t.Run("a route the proxy does not limit", func(t *testing.T) {
		streams(t, "/v1/models", func(h http.Handler) *env { return bodyEnv(t, h, 0, "/v1/chat/completions") })
	})
	t.Run("no body source", func(t *testing.T) {
		streams(t, "/v1/chat/completions", func(h http.Handler) *env { return newEnv(t, h, envOptions{}) })
	})
}

func jsonDecode(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }

// An upstream written in Go reads the body with encoding/json, which
// matches a member to a field in any case ("MODEL" is its model) and,
// of "model" and "Model", takes the last. The limiter reads the field as
// such an upstream may, so no spelling of it runs a model past the
// model's cap: another case is the same field, and two spellings of it
// are refused as two copies are.
func TestTheFieldInAnotherCaseIsTheField(t *testing.T) {
	up := newSSE()
	served := make(chan string, 16) // the model each stream ran, as a Go upstream reads it
	e := bodyEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model string `json:"model"`
		}
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("the upstream could not read %s: %v", body, err)
		}
		served <- req.Model
		up.ServeHTTP(w, r)
	}), 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// send sends body as a new user's: on status it returns the answer;
	// on any other, it says what the upstream ran, and returns nil.
	send := func(body string, status int) *http.Response {
		t.Helper()
		resp := e.chat(t, ctx, newUser(), body)
		if resp.StatusCode == status {
			return resp
		}
		if resp.StatusCode == http.StatusOK {
			<-up.started
			t.Errorf("%s: 200, and the upstream ran %q; want %d", body, <-served, status)
		} else {
			t.Errorf("%s: %d %+v; want %d", body, resp.StatusCode, decodeError(t, resp), status)
		}
		resp.Body.Close()
		return nil
	}
	// run sends body, to be granted, and returns the model the upstream ran.
	run := func(body string) string {
		t.Helper()
		if resp := send(body, http.StatusOK); resp != nil {
			t.Cleanup(func() { resp.Body.Close() })
			<-up.started
			return <-served
		}
		return ""
	}

	if got := run(`{"model":"big","messages":[]}`); got != "big" {
		t.Fatalf("the upstream ran %q, want big", got)
	}
	for _, body := range []string{`{"MODEL":"big","messages":[]}`, `{"Model":"big"}`, `{"\u004dODEL":"big"}`, `{"mOdEl":"big"}`} {
		if resp := send(body, http.StatusTooManyRequests); resp != nil {
			if refusal := decodePoolError(t, resp); refusal.Code != "pool_limit_reached" || refusal.Pool != "model" || refusal.Key != "big" {
				t.Errorf("%s: refusal %+v; want pool_limit_reached of model=big", body, refusal)
			}
		}
	}
	for _, body := range []string{`{"model":"small","Model":"big"}`, `{"MODEL":"big","model":"small"}`, `{"Model":"small","MODEL":"big"}`} {
		if resp := send(body, http.StatusBadRequest); resp != nil {
			if got := decodeError(t, resp); got.Error.Code != "invalid_body" || !strings.Contains(got.Error.Message, "appears 2 times") {
				t.Errorf("%s: %+v; want invalid_body saying the field appears twice", body, got.Error)
			}
		}
	}
	up.checkNoneStarted(t)

	// Another key, in another case, joins that key.
	if got := run(`{"MODEL":"small"}`); got != "small" {
		t.Errorf("the upstream ran %q, want small", got)
	}
	for key, want := range map[string]int{"big": 1, "small": 1} {
		if got, err := e.Stack.Limiter.PoolSlots(ctx, "model", key); err != nil || got.Used != want {
			t.Errorf("model=%s holds %d (%v); want %d", key, got.Used, err, want)
		}
	}
}

// A pool keyed by the request's Host (header:Host): net/http moves Host
// out of the headers (into Request.Host), and the proxy reads it there,
// in any case of the name. Two streams to one host share its key; another
// host is another key.
func TestHostHeaderSourceCapsAHost(t *testing.T) {
	for _, name := range []string{"Host", "host"} {
		t.Run(name, func(t *testing.T) {
			up := newSSE()
			table := pools.NewTable()
			one := 1
			if err := table.Replace([]pools.Pool{pools.Pool{Pool: "site", MaxConcurrentStreams: &one}.WithDefaults()}); err != nil {
				t.Fatal(err)
			}
			sources, err := identity.ParsePoolSources(map[string]string{"site": "header:" + name})
			if err != nil {
				t.Fatal(err)
			}
			e := newEnv(t, up, envOptions{
				stack:    limitertest.Options{Limiter: limiter.Options{Pools: table}},
				identity: identity.Options{Pools: sources},
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			to := func(host string) *http.Response {
				req := e.request(t, ctx, http.MethodPost, "/v1/chat/completions", newUser(), "three", nil)
				req.Host = host
				return e.do(t, req)
			}
			first := to("a.example")
			defer first.Body.Close()
			if first.StatusCode != http.StatusOK {
				t.Fatalf("the first stream to a.example: %d", first.StatusCode)
			}
			<-up.started
			if key, err := e.Stack.Limiter.PoolSlots(ctx, "site", "a.example"); err != nil || key.Used != 1 {
				t.Errorf("site=a.example holds %d (%v); want 1", key.Used, err)
			}
			second := to("a.example")
			if second.StatusCode != http.StatusTooManyRequests {
				second.Body.Close()
				t.Fatalf("a second stream to a.example: %d; want 429", second.StatusCode)
			}
			if refusal := decodePoolError(t, second); refusal.Pool != "site" || refusal.Key != "a.example" {
				t.Errorf("a second stream to a.example refused with %+v; want site=a.example", refusal)
			}
			// Another spelling of the host is the host: its key, its cap.
			for _, host := range []string{"A.Example", "a.example.", "a.example:80"} {
				again := to(host)
				if again.StatusCode != http.StatusTooManyRequests {
					again.Body.Close()
					t.Fatalf("a second stream to %s: %d; want 429", host, again.StatusCode)
				}
				if refusal := decodePoolError(t, again); refusal.Pool != "site" || refusal.Key != "a.example" {
					t.Errorf("a second stream to %s refused with %+v; want site=a.example", host, refusal)
				}
			}
			other := to("b.example")
			defer other.Body.Close()
			if other.StatusCode != http.StatusOK {
				t.Errorf("a stream to b.example beside a full a.example: %d; want 200", other.StatusCode)
			}
			<-up.started
		})
	}
}

// A pool header sent empty, or blank, is no key: refused 400
// invalid_pool_key naming the pool, its source and the key's bound, as
// the body's empty field is, before any slot and the upstream. Taken as
// the header absent, it would run past the pool's full key. Absent, the
// request joins no key of the pool.
func TestAnEmptyPoolKeyIsRefused(t *testing.T) {
	up := newSSE()
	table := pools.NewTable()
	one := 1
	if err := table.Replace([]pools.Pool{
		pools.Pool{Pool: "org", MaxConcurrentStreams: &one}.WithDefaults(),
		pools.Pool{Pool: "model", MaxConcurrentStreams: &one}.WithDefaults(),
	}); err != nil {
		t.Fatal(err)
	}
	sources, err := identity.ParsePoolSources(map[string]string{"org": "header:X-Org", "model": "body:model"})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, up, envOptions{
		stack:    limitertest.Options{Limiter: limiter.Options{Pools: table}},
		identity: identity.Options{Pools: sources},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	send := func(user string, org []string, body string) *http.Response {
		req := e.request(t, ctx, http.MethodPost, "/v1/chat/completions", user, "three", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if org != nil {
			req.Header["X-Org"] = org
		}
		return e.do(t, req)
	}
	first := send(newUser(), []string{"acme"}, `{"model":"m1"}`)
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("the first stream of org acme: %d", first.StatusCode)
	}
	<-up.started

	user := newUser()
	for _, tc := range []struct {
		name string
		org  []string
		body string
		want string
	}{
		{"X-Org empty", []string{""}, `{"model":"m2"}`, "pool org (from header:X-Org): the header is empty"},
		{"X-Org blank", []string{" \t"}, `{"model":"m3"}`, "pool org (from header:X-Org): the header is empty"},
		{"model empty", []string{"beta"}, `{"model":""}`, "pool model (from body:model)"},
	} {
		resp := send(user, tc.org, tc.body)
		if resp.StatusCode != http.StatusBadRequest {
			resp.Body.Close()
			t.Errorf("%s: %d; want 400 invalid_pool_key, not a request the pool does not cap", tc.name, resp.StatusCode)
			continue
		}
		if body := decodeError(t, resp); body.Error.Code != "invalid_pool_key" || !strings.Contains(body.Error.Message, tc.want) ||
			!strings.Contains(body.Error.Message, "1-128 bytes") {
			t.Errorf("%s: %s %q; want invalid_pool_key saying %q and the 1-128 bytes bound", tc.name, body.Error.Code, body.Error.Message, tc.want)
		}
	}
	e.checkRefused(t, up, user, 0, "invalid", 1) // the empty model
	if got := e.Metric(t, `limiter_streams_refused_total{mode="proxy",reason="identity"}`); got != "2" {
		t.Errorf("identity refusals: %q; want 2, the empty headers", got)
	}

	// Without X-Org the request joins no key of org, and runs.
	absent := send(user, nil, `{"model":"m4"}`)
	defer absent.Body.Close()
	if absent.StatusCode != http.StatusOK {
		t.Fatalf("without X-Org: %d; want 200", absent.StatusCode)
	}
	<-up.started
	close(up.tokens)
}

// An HTTP/1.1 request must send a Host: one sent empty is the header
// empty, not absent, and a pool keyed by header:Host refuses it 400
// invalid_pool_key rather than let it in uncapped. HTTP/1.0 needs no
// Host: without one, the request joins no key.
func TestAnEmptyHostIsRefused(t *testing.T) {
	sources, err := identity.ParsePoolSources(map[string]string{"site": "header:Host"})
	if err != nil {
		t.Fatal(err)
	}
	table := pools.NewTable()
	one := 1
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "site", MaxConcurrentStreams: &one}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	rec := recorder{hashes: make(chan [32]byte, 1)}
	e := newEnv(t, rec, envOptions{
		stack:    limitertest.Options{Limiter: limiter.Options{Pools: table}},
		identity: identity.Options{Pools: sources},
	})
	send := func(request string) *http.Response {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.proxy.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, request); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	user := newUser()
	resp := send("GET /v1/chat/completions HTTP/1.1\r\nHost: \r\nX-User-Id: " + user + "\r\nX-Plan: three\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != http.StatusBadRequest {
		resp.Body.Close()
		t.Fatalf("HTTP/1.1 with an empty Host: %d; want 400 invalid_pool_key", resp.StatusCode)
	}
	if body := decodeError(t, resp); body.Error.Code != "invalid_pool_key" || !strings.Contains(body.Error.Message, "pool site (from header:Host): the header is empty") {
		t.Errorf("HTTP/1.1 with an empty Host: %s %q; want invalid_pool_key naming pool site", body.Error.Code, body.Error.Message)
	}
	resp = send("GET /v1/chat/completions HTTP/1.0\r\nX-User-Id: " + user + "\r\nX-Plan: three\r\n\r\n")
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP/1.0 without a Host: %d; want 200", resp.StatusCode)
	}
	<-rec.hashes
}

// A buffered body goes upstream with its Content-Length, also when the
// client sent it chunked: the proxy knows its length once it has read it.
func TestAChunkedBodyGoesUpstreamWithItsLength(t *testing.T) {
	type seen struct {
		length   int64
		encoding []string
		body     string
	}
	got := make(chan seen, 1)
	e := bodyEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.ContentLength, r.TransferEncoding, string(b)}
	}), 0)
	body := `{"model":"small","messages":[]}`
	req := e.request(t, context.Background(), http.MethodPost, "/v1/chat/completions", newUser(), "three", io.MultiReader(strings.NewReader(body)))
	req.ContentLength = -1 // sent chunked
	resp := e.do(t, req)
	resp.Body.Close()
	s := <-got
	if s.body != body || s.length != int64(len(body)) || len(s.encoding) != 0 {
		t.Errorf("the upstream read %q with Content-Length %d, Transfer-Encoding %v; want the body with Content-Length %d, not chunked",
			s.body, s.length, s.encoding, len(body))
	}
}
