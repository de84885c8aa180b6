package extproc_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/holdtest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/extproc"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// The pools of these tests: model caps big at 1 and every other key at
// 10 (so that a stream's membership of small shows in Redis); org caps
// acme at 1.
func bodyTestPools(t *testing.T) *pools.Table {
	t.Helper()
	ten := 10
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{
		pools.Pool{Pool: "model", MaxConcurrentStreams: &ten, Keys: map[string]int{"big": 1}}.WithDefaults(),
		pools.Pool{Pool: "org", Keys: map[string]int{"acme": 1}}.WithDefaults(),
	}); err != nil {
		t.Fatal(err)
	}
	return table
}

// bodyEnvOptions are an env whose identity reads the pool keys of sources
// (pool → "KIND:NAME") on the pools of bodyTestPools, behind an Envoy
// announcing mode as its request body mode.
func bodyEnvOptions(t *testing.T, mode filterv3.ProcessingMode_BodySendMode, sources map[string]string) envOptions {
	t.Helper()
	ps, err := identity.ParsePoolSources(sources)
	if err != nil {
		t.Fatal(err)
	}
	return envOptions{
		stack:    limitertest.Options{Limiter: limiter.Options{Pools: bodyTestPools(t)}},
		identity: identity.Options{Pools: ps},
		envoy:    envoytest.Options{RequestBodyMode: mode},
	}
}

// modelBody is the body source of pool model: the field "model".
var modelBody = map[string]string{"model": "body:model"}

// poolUsed returns how many streams hold key of pool in Redis.
func poolUsed(t *testing.T, e *env, pool, key string) int {
	t.Helper()
	got, err := e.Stack.Limiter.PoolSlots(context.Background(), pool, key)
	if err != nil {
		t.Fatalf("PoolSlots(%s, %s): %v", pool, key, err)
	}
	return got.Used
}

func awaitPoolUsed(t *testing.T, e *env, pool, key string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := poolUsed(t, e, pool, key)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool key %s=%s holds %d streams after %s, want %d", pool, key, got, within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// slotLabel returns the label of user's only slot.
func slotLabel(t *testing.T, e *env, user string) string {
	t.Helper()
	got, err := e.Stack.Limiter.Slots(context.Background(), user)
	if err != nil || len(got.Slots) != 1 {
		t.Fatalf("Slots(%s): %+v, %v; want one slot", user, got, err)
	}
	return got.Slots[0].Label
}

// heldHeaders sends the request headers of user's POST (a body follows)
// and fails the test unless the answer is a CONTINUE that takes no slot
// and sets no stream id, removing one the client sent.
func heldHeaders(t *testing.T, e *env, st *envoytest.Stream, user string, extra ...string) {
	t.Helper()
	h := envoytest.RequestHeaders("/v1/chat/completions",
		append([]string{"x-user-id", user, "x-plan", "three", extproc.DefaultStreamIDHeader, "forged"}, extra...)...)
	resp, err := st.RequestHeaders(h, false)
	if err != nil {
		t.Fatalf("request_headers: %v", err)
	}
	common := resp.GetRequestHeaders().GetResponse()
	if common == nil || common.GetStatus() != extprocv3.CommonResponse_CONTINUE {
		t.Fatalf("request_headers answered %v, want CONTINUE", resp)
	}
	if id, ok := envoytest.HeaderValue(common.GetHeaderMutation(), extproc.DefaultStreamIDHeader); ok {
		t.Fatalf("request_headers set the stream id %q before the body was read", id)
	}
	if !slices.Contains(common.GetHeaderMutation().GetRemoveHeaders(), extproc.DefaultStreamIDHeader) {
		t.Errorf("request_headers mutation %v does not remove the client's %s: in STREAMED mode Envoy forwards it as it came",
			common.GetHeaderMutation(), extproc.DefaultStreamIDHeader)
	}
	if got := e.Used(t, user); got != 0 {
		t.Fatalf("after the request headers the user holds %d slots, want 0 until the body", got)
	}
}

// grantedAtBody fails the test unless the answer to the request body is
// a CONTINUE setting the stream id for the upstream; it returns the id:
// grantedAtBody(t)(st.RequestBody(...)).
func grantedAtBody(t *testing.T) func(*extprocv3.ProcessingResponse, error) string {
	return func(resp *extprocv3.ProcessingResponse, err error) string {
		t.Helper()
		return grantedBody(t, resp, err)
	}
}

func grantedBody(t *testing.T, resp *extprocv3.ProcessingResponse, err error) string {
	t.Helper()
	if err != nil {
		t.Fatalf("request_body: %v", err)
	}
	common := resp.GetRequestBody().GetResponse()
	if common == nil || common.GetStatus() != extprocv3.CommonResponse_CONTINUE {
		t.Fatalf("request_body answered %v, want a CONTINUE body response", resp)
	}
	id, ok := envoytest.HeaderValue(common.GetHeaderMutation(), extproc.DefaultStreamIDHeader)
	if !ok || id == "" || id == "forged" {
		t.Fatalf("request_body answer sets %s to %q (%v), want the slot's stream id", extproc.DefaultStreamIDHeader, id, resp)
	}
	return id
}

// poolRefusal is the JSON body of a refusal with its pool figures.
type poolRefusal struct {
	Error struct {
		Message      string `json:"message"`
		Type         string `json:"type"`
		Code         string `json:"code"`
		Pool         string `json:"pool"`
		Key          string `json:"key"`
		Used         *int   `json:"used"`
		Limit        *int   `json:"limit"`
		RetryAfterMs *int64 `json:"retry_after_ms"`
	} `json:"error"`
}

// refusedWith fails the test unless resp is an ImmediateResponse of
// status and code; it returns its decoded body.
func refusedWith(t *testing.T, resp *extprocv3.ProcessingResponse, err error, status int, code string) (*extprocv3.ImmediateResponse, poolRefusal) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	ir, _ := immediate(t, resp)
	var body poolRefusal
	if err := json.Unmarshal(ir.GetBody(), &body); err != nil {
		t.Fatalf("ImmediateResponse body %q: %v", ir.GetBody(), err)
	}
	if got := int(ir.GetStatus().GetCode()); got != status || body.Error.Code != code || ir.GetDetails() != "limiter_"+code {
		t.Fatalf("ImmediateResponse %d %s (details %q), want %d %s", got, ir.GetBody(), ir.GetDetails(), status, code)
	}
	return ir, body
}

// Envoy's sequence in BUFFERED mode: the request headers (no end of
// stream) take no slot and send no stream id; the body, in one message
// with end_of_stream, takes the slot with the body's pool key, and its
// answer carries the stream id to the upstream; the response carries it
// back; the response's end frees the slot and the pool membership.
func TestBufferedBodyDecidesTheSlot(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, modelBody))
	user := newUser()
	st := e.open(t)
	heldHeaders(t, e, st, user)
	if got := poolUsed(t, e, "model", "big"); got != 0 {
		t.Fatalf("after the request headers model=big holds %d streams, want 0", got)
	}

	id := grantedAtBody(t)(st.RequestBody([]byte(`{"messages":[{"role":"user","content":"hi"}],"model":"big","stream":true}`), true))
	if got := e.Used(t, user); got != 1 {
		t.Errorf("after the body the user holds %d slots, want 1", got)
	}
	keySlots, err := e.Stack.Limiter.PoolSlots(context.Background(), "model", "big")
	if err != nil {
		t.Fatal(err)
	}
	if keySlots.Used != 1 || keySlots.Holders[0].UserID != user || keySlots.Holders[0].StreamID != id {
		t.Errorf("model=big holds %+v, want the one stream %s of %s", keySlots.Holders, id, user)
	}
	if got := slotLabel(t, e, user); got != "big" {
		t.Errorf("the slot's label is %q, want the body's model, big", got)
	}

	resp := mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "text/event-stream"), false))
	if got, _ := envoytest.HeaderValue(resp.GetResponseHeaders().GetResponse().GetHeaderMutation(), extproc.DefaultStreamIDHeader); got != id {
		t.Errorf("stream id sent to the client %q, want the upstream's %q", got, id)
	}
	if got := poolUsed(t, e, "model", "big"); got != 1 {
		t.Errorf("while the response streams model=big holds %d streams, want 1", got)
	}
	mustContinue(t)(st.ResponseBody([]byte("data: [DONE]\n\n"), true))
	// Released at the response's end, before Envoy closes the stream.
	e.AwaitUsed(t, user, 0, time.Second)
	awaitPoolUsed(t, e, "model", "big", 0, time.Second)
}

// A pool key at its cap refuses another user's stream at the body, with
// pool_limit_reached naming the key (never stream_limit_reached: the user
// holds nothing); another key passes, a body naming none joins none, and
// the key frees up when its holder's stream ends.
func TestPoolKeyAtItsCapIsRefusedAtTheBody(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, modelBody))
	holder, other := newUser(), newUser()
	first := e.open(t)
	heldHeaders(t, e, first, holder)
	grantedAtBody(t)(first.RequestBody([]byte(`{"model":"big"}`), true))

	st := e.open(t)
	heldHeaders(t, e, st, other)
	resp, err := st.RequestBody([]byte(`{"model":"big","messages":[]}`), true)
	ir, body := refusedWith(t, resp, err, 429, "pool_limit_reached")
	if b := body.Error; b.Type != "rate_limit_error" || b.Pool != "model" || b.Key != "big" ||
		b.Used == nil || *b.Used != 1 || b.Limit == nil || *b.Limit != 1 || b.RetryAfterMs == nil || b.Message == "" {
		t.Errorf("refusal %s, want rate_limit_error naming model=big, used 1 of 1, retry_after_ms and a message", ir.GetBody())
	}
	retry, _ := envoytest.HeaderValue(ir.GetHeaders(), "retry-after")
	if n, err := strconv.Atoi(retry); err != nil || n < 1 || n > 10 {
		t.Errorf("retry-after %q, want 1-10 seconds (the slot's TTL is 10s)", retry)
	}
	if got, _ := envoytest.HeaderValue(ir.GetHeaders(), "x-should-retry"); got != "false" {
		t.Errorf("x-should-retry %q, want false", got)
	}
	st.Close()
	if got := e.Used(t, other); got != 0 {
		t.Errorf("the refused user holds %d slots, want 0", got)
	}
	if got := poolUsed(t, e, "model", "big"); got != 1 {
		t.Errorf("model=big holds %d streams, want the holder's 1", got)
	}

	// The field in another case is the field (an upstream in Go reads
	// "MODEL" as its model): refused too.
	for _, b := range []string{`{"MODEL":"big"}`, `{"\u004dodel":"big"}`} {
		st := e.open(t)
		heldHeaders(t, e, st, other)
		resp, err := st.RequestBody([]byte(b), true)
		if _, body := refusedWith(t, resp, err, 429, "pool_limit_reached"); body.Error.Key != "big" {
			t.Errorf("%s: refused by key %q, want big", b, body.Error.Key)
		}
		st.Close()
	}
	if got := poolUsed(t, e, "model", "big"); got != 1 {
		t.Errorf("model=big holds %d streams, want the holder's 1", got)
	}

	// Another key of the pool has room.
	small := e.open(t)
	heldHeaders(t, e, small, other)
	grantedAtBody(t)(small.RequestBody([]byte(`{"model":"small"}`), true))
	if got := poolUsed(t, e, "model", "small"); got != 1 {
		t.Errorf("model=small holds %d streams, want 1", got)
	}
	small.Close()
	awaitPoolUsed(t, e, "model", "small", 0, time.Second)

	// A body naming no model joins no key: granted although big is full.
	none := newUser()
	bare := e.open(t)
	heldHeaders(t, e, bare, none)
	grantedAtBody(t)(bare.RequestBody([]byte(`{"messages":[{"role":"user","content":"{\"model\":\"big\"}"}],"meta":{"model":"big"}}`), true))
	if got := slotLabel(t, e, none); got != "" {
		t.Errorf("the slot of a body without a model is labelled %q, want none", got)
	}
	if big, small := poolUsed(t, e, "model", "big"), poolUsed(t, e, "model", "small"); big != 1 || small != 0 {
		t.Errorf("model=big holds %d, model=small %d; want 1 (the holder's) and 0", big, small)
	}

	// The holder's stream ends: the key has room again.
	first.Close()
	awaitPoolUsed(t, e, "model", "big", 0, time.Second)
	again := e.open(t)
	heldHeaders(t, e, again, other)
	grantedAtBody(t)(again.RequestBody([]byte(`{"model":"big"}`), true))
}

// A body no key can be read from is answered 400 at the body, and takes
// no slot and no pool membership.
func TestBadBodiesAreRefusedAtTheBody(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, modelBody))
	for _, tc := range []struct{ name, body, code string }{
		{"not JSON", `model=big`, "invalid_body"},
		{"cut JSON", `{"model":"big","messages":[`, "invalid_body"},
		{"not an object", `["big"]`, "invalid_body"},
		{"model a number", `{"model":7}`, "invalid_pool_key"},
		{"model an object", `{"model":{"name":"big"}}`, "invalid_pool_key"},
		{"model outside the key charset", `{"model":"a b"}`, "invalid_pool_key"},
		{"model twice", `{"model":"small","model":"big"}`, "invalid_body"},
		{"model twice, spelt apart", `{"model":"big","mod\u0065l":"small"}`, "invalid_body"},
		{"model twice, in two cases", `{"model":"small","Model":"big"}`, "invalid_body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := newUser()
			st := e.open(t)
			heldHeaders(t, e, st, user)
			resp, err := st.RequestBody([]byte(tc.body), true)
			_, body := refusedWith(t, resp, err, 400, tc.code)
			if body.Error.Type != "invalid_request_error" || body.Error.Message == "" {
				t.Errorf("refusal %+v, want invalid_request_error with a message", body.Error)
			}
			st.Close()
			if got := e.Used(t, user); got != 0 {
				t.Errorf("the user holds %d slots, want 0", got)
			}
			for _, key := range []string{"big", "small"} {
				if got := poolUsed(t, e, "model", key); got != 0 {
					t.Errorf("model=%s holds %d streams, want 0", key, got)
				}
			}
		})
	}
}

// A body the sources cannot read because it is compressed, or not sent
// as JSON, is refused invalid_body naming its Content-Encoding, else its
// Content-Type, as the proxy refuses it; the identity encoding is read as
// it is.
func TestABodyRefusalNamesItsEncodingOrType(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, modelBody))
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = io.WriteString(w, `{"model":"small"}`)
	_ = w.Close()
	for _, tc := range []struct {
		name, contentType, contentEncoding string
		body                               []byte
		says                               string // "": granted
	}{
		{"gzip", "application/json", "gzip", gz.Bytes(), "(it was sent with Content-Encoding: gzip; a pool's body source reads uncompressed JSON request bodies)"},
		{"br", "application/json", "br", []byte{0x1b, 0x0e, 0x00, 0xf8, 0x25, 0x14}, "(it was sent with Content-Encoding: br;"},
		{"a form", "application/x-www-form-urlencoded", "", []byte("model=small"),
			"(it was sent as application/x-www-form-urlencoded; a pool's body source reads JSON request bodies)"},
		{"the identity encoding", "application/json", "identity", []byte(`{"model":"small"}`), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := newUser()
			st := e.open(t)
			h := envoytest.Headers(":method", "POST", ":path", "/v1/chat/completions", ":authority", "llm.example", ":scheme", "https",
				"x-user-id", user, "x-plan", "three", "content-type", tc.contentType)
			if tc.contentEncoding != "" {
				h.Headers = append(h.Headers, envoytest.Headers("content-encoding", tc.contentEncoding).Headers...)
			}
			mustContinue(t)(st.RequestHeaders(h, false))
			resp, err := st.RequestBody(tc.body, true)
			if tc.says == "" {
				grantedBody(t, resp, err)
				if got := poolUsed(t, e, "model", "small"); got != 1 {
					t.Errorf("model=small holds %d streams, want 1", got)
				}
				st.Close()
				e.AwaitUsed(t, user, 0, time.Second)
				return
			}
			_, body := refusedWith(t, resp, err, 400, "invalid_body")
			if !strings.Contains(body.Error.Message, tc.says) {
				t.Errorf("invalid_body message %q, want it to say %q", body.Error.Message, tc.says)
			}
			st.Close()
			if got := e.Used(t, user); got != 0 {
				t.Errorf("the user holds %d slots, want 0", got)
			}
		})
	}
}

// In STREAMED mode the chunks are gathered up to MaxBodyBytes and the
// slot is decided at the last; a body over the bound is 413 at the chunk
// that crosses it.
func TestStreamedBody(t *testing.T) {
	o := bodyEnvOptions(t, filterv3.ProcessingMode_STREAMED, modelBody)
	o.extproc.MaxBodyBytes = 1024
	e := newEnv(t, o)

	t.Run("decided at the last chunk", func(t *testing.T) {
		user := newUser()
		st := e.open(t)
		heldHeaders(t, e, st, user)
		for _, chunk := range []string{`{"messages":[],`, `"model":`} {
			resp := mustContinue(t)(st.RequestBody([]byte(chunk), false))
			if c := resp.GetRequestBody().GetResponse(); c == nil || c.GetHeaderMutation() != nil {
				t.Fatalf("chunk %q answered %v, want a bare CONTINUE", chunk, resp)
			}
			if got := e.Used(t, user); got != 0 {
				t.Fatalf("before the last chunk the user holds %d slots, want 0", got)
			}
		}
		grantedAtBody(t)(st.RequestBody([]byte(`"big"}`), true))
		if got := poolUsed(t, e, "model", "big"); got != 1 {
			t.Errorf("model=big holds %d streams, want 1", got)
		}
		st.Close()
		e.AwaitUsed(t, user, 0, time.Second)
		awaitPoolUsed(t, e, "model", "big", 0, time.Second)
	})

	t.Run("over MaxBodyBytes", func(t *testing.T) {
		user := newUser()
		st := e.open(t)
		heldHeaders(t, e, st, user)
		chunk := []byte(`{"messages":["` + strings.Repeat("x", 400))
		mustContinue(t)(st.RequestBody(chunk, false))
		mustContinue(t)(st.RequestBody([]byte(strings.Repeat("x", 600)), false)) // 1014 bytes in all
		resp, err := st.RequestBody([]byte(strings.Repeat("x", 11)), false)      // 1025
		refusedWith(t, resp, err, 413, "request_too_large")
		st.Close()
		if got := e.Used(t, user); got != 0 {
			t.Errorf("the user holds %d slots, want 0", got)
		}
	})
}

// A request without a body (request headers with end_of_stream, a GET)
// is decided at its headers, joining no key of a body source.
func TestBodylessRequestIsDecidedAtItsHeaders(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, modelBody))
	user := newUser()
	st := e.open(t)
	resp, err := st.RequestHeaders(envoytest.Headers(":method", "GET", ":path", "/v1/chat/completions/abc", ":authority", "llm.example",
		":scheme", "https", "x-user-id", user, "x-plan", "three"), true)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := envoytest.HeaderValue(resp.GetRequestHeaders().GetResponse().GetHeaderMutation(), extproc.DefaultStreamIDHeader); !ok || id == "" {
		t.Fatalf("request_headers with end_of_stream answered %v, want a CONTINUE with the stream id", resp)
	}
	if got := e.Used(t, user); got != 1 {
		t.Errorf("the user holds %d slots, want 1", got)
	}
	if got := slotLabel(t, e, user); got != "" {
		t.Errorf("the slot is labelled %q, want none", got)
	}
	mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), true))
	e.AwaitUsed(t, user, 0, time.Second)
}

// With no body source, a header source decides at the request headers,
// whatever body Envoy sends after them.
func TestHeaderPoolSourceDecidesAtTheHeaders(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, map[string]string{"org": "header:x-org"}))
	user := newUser()
	st := e.open(t)
	resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "three", "x-org", "acme"), false)
	if err != nil {
		t.Fatal(err)
	}
	id, ok := envoytest.HeaderValue(resp.GetRequestHeaders().GetResponse().GetHeaderMutation(), extproc.DefaultStreamIDHeader)
	if !ok || id == "" {
		t.Fatalf("request_headers answered %v, want a CONTINUE with the stream id", resp)
	}
	if got := poolUsed(t, e, "org", "acme"); got != 1 {
		t.Errorf("org=acme holds %d streams, want 1", got)
	}
	// The body goes through untouched: the slot is already taken.
	body := mustContinue(t)(st.RequestBody([]byte(`{"model":"big"}`), true))
	if c := body.GetRequestBody().GetResponse(); c == nil || c.GetHeaderMutation() != nil {
		t.Errorf("request_body answered %v, want a bare CONTINUE", body)
	}
	if got := e.Used(t, user); got != 1 {
		t.Errorf("the user holds %d slots, want 1", got)
	}

	// The key is full: another user is refused at the headers.
	other := e.open(t)
	resp, err = other.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", newUser(), "x-plan", "three", "x-org", "acme"), false)
	ir, refusal := refusedWith(t, resp, err, 429, "pool_limit_reached")
	if refusal.Error.Pool != "org" || refusal.Error.Key != "acme" {
		t.Errorf("refusal %s, want one naming org=acme", ir.GetBody())
	}
	st.Close()
	awaitPoolUsed(t, e, "org", "acme", 0, time.Second)
}

// A pool header sent empty, or blank, is no key: answered 400
// invalid_pool_key at the request headers, as the proxy answers it and
// as an empty body field is answered at the body, naming the pool, its
// source and the key's bound; it takes no slot, where taken as the
// header absent it would run past the pool's full key.
func TestAnEmptyPoolKeyIsRefused(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, map[string]string{"org": "header:x-org", "model": "body:model"}))
	for _, v := range []string{"", " ", "\t "} {
		user := newUser()
		st := e.open(t)
		resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "three", "x-org", v), false)
		_, body := refusedWith(t, resp, err, 400, "invalid_pool_key")
		if !strings.Contains(body.Error.Message, "pool org (from header:x-org): the header is empty") || !strings.Contains(body.Error.Message, "1-128 bytes") {
			t.Errorf("x-org %q: refusal %q; want one naming pool org, its source and the 1-128 bytes bound", v, body.Error.Message)
		}
		st.Close()
		if got := e.Used(t, user); got != 0 {
			t.Errorf("x-org %q: the user holds %d slots, want 0", v, got)
		}
	}
	user := newUser()
	st := e.open(t)
	heldHeaders(t, e, st, user, "x-org", "acme")
	resp, err := st.RequestBody([]byte(`{"model":""}`), true)
	if _, body := refusedWith(t, resp, err, 400, "invalid_pool_key"); !strings.Contains(body.Error.Message, "pool model (from body:model)") ||
		!strings.Contains(body.Error.Message, "1-128 bytes") {
		t.Errorf(`{"model":""}: refusal %q; want one naming pool model, its source and the 1-128 bytes bound`, body.Error.Message)
	}
	if got := poolUsed(t, e, "org", "acme"); got != 0 {
		t.Errorf("org=acme holds %d streams, want 0", got)
	}
}

// In BUFFERED mode Envoy sends the body in one message, whose
// end_of_stream is false when trailers follow (and they come only with
// request_trailer_mode SEND): the slot is decided at that message all
// the same, not left for a message that may never come.
func TestBufferedBodyBeforeTrailersDecidesTheSlot(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, modelBody))
	user := newUser()
	st := e.open(t)
	heldHeaders(t, e, st, user)
	grantedAtBody(t)(st.RequestBody([]byte(`{"model":"big"}`), false))
	if got := poolUsed(t, e, "model", "big"); got != 1 {
		t.Errorf("model=big holds %d streams, want 1", got)
	}
	if resp, err := st.RequestTrailers(envoytest.Headers("x-checksum", "0")); err != nil || resp.GetRequestTrailers() == nil {
		t.Errorf("request_trailers answered %v, %v; want a trailers response", resp, err)
	}
	st.Close()
	e.AwaitUsed(t, user, 0, time.Second)
}

// In STREAMED mode a body whose end comes with trailers is decided at the
// trailers; without them (request_trailer_mode SKIP) at the response
// headers, late but counted, with the pools of the body that came.
func TestStreamedBodyWithoutItsEnd(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_STREAMED, modelBody))

	t.Run("trailers", func(t *testing.T) {
		user := newUser()
		st := e.open(t)
		heldHeaders(t, e, st, user)
		mustContinue(t)(st.RequestBody([]byte(`{"model":"big"}`), false))
		if got := e.Used(t, user); got != 0 {
			t.Fatalf("before the trailers the user holds %d slots, want 0", got)
		}
		resp, err := st.RequestTrailers(envoytest.Headers("x-checksum", "0"))
		if err != nil || resp.GetRequestTrailers() == nil {
			t.Fatalf("request_trailers answered %v, %v; want a trailers response", resp, err)
		}
		if got, big := e.Used(t, user), poolUsed(t, e, "model", "big"); got != 1 || big != 1 {
			t.Errorf("after the trailers the user holds %d slots and model=big %d streams, want 1 and 1", got, big)
		}
		st.Close()
		e.AwaitUsed(t, user, 0, time.Second)
		awaitPoolUsed(t, e, "model", "big", 0, time.Second)
	})

	t.Run("no end at all", func(t *testing.T) {
		user := newUser()
		st := e.open(t)
		heldHeaders(t, e, st, user)
		mustContinue(t)(st.RequestBody([]byte(`{"model":"big"}`), false))
		resp := mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
		if id, ok := envoytest.HeaderValue(resp.GetResponseHeaders().GetResponse().GetHeaderMutation(), extproc.DefaultStreamIDHeader); !ok || id == "" {
			t.Errorf("response_headers answered %v, want the stream id", resp)
		}
		if got, big := e.Used(t, user), poolUsed(t, e, "model", "big"); got != 1 || big != 1 {
			t.Errorf("after the response headers the user holds %d slots and model=big %d streams, want 1 and 1", got, big)
		}
		mustContinue(t)(st.ResponseBody([]byte("data: [DONE]\n\n"), true))
		e.AwaitUsed(t, user, 0, time.Second)
		awaitPoolUsed(t, e, "model", "big", 0, time.Second)
	})
}

// An Envoy that says it sends no request body (request_body_mode NONE in
// protocol_config) is not waited for: the slot is taken at the headers,
// without the body's pools, rather than after the upstream answered.
func TestNoRequestBodyModeDecidesAtTheHeaders(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_NONE, modelBody))
	user := newUser()
	grant(t, e.open(t), user, "three")
	if got := poolUsed(t, e, "model", "big"); got != 0 {
		t.Errorf("model=big holds %d streams, want 0", got)
	}
}

// A BUFFERED body comes in one gRPC message, as large as Envoy's buffer
// allows. gRPC's own bound on a message (4 MiB unless set) must not stop
// it before the limiter reads it: a body under MaxBodyBytes is decided
// whatever its size, and one over it refused with 413, however far over,
// rather than the stream failing, which Envoy with failure_mode_allow
// would take for leave to pass the request upstream without a slot.
func TestLargeBufferedBodies(t *testing.T) {
	body := func(size int) []byte {
		b := []byte(`{"model":"big","messages":[{"role":"user","content":"`)
		b = append(b, strings.Repeat("A", size-len(b)-4)...)
		return append(b, `"}]}`...)
	}
	t.Run("under MaxBodyBytes, over gRPC's default", func(t *testing.T) {
		e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, modelBody))
		user := newUser()
		st := e.open(t)
		heldHeaders(t, e, st, user)
		resp, err := st.RequestBody(body(extproc.DefaultMaxBodyBytes), true)
		grantedBody(t, resp, err)
		if got := poolUsed(t, e, "model", "big"); got != 1 {
			t.Errorf("model=big holds %d streams, want 1", got)
		}
		st.Close()
	})
	o := bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, modelBody)
	o.extproc.MaxBodyBytes = 1024
	e := newEnv(t, o)
	for _, size := range []int{1025, 5 << 20} { // over the bound by 1; over gRPC's default too
		t.Run(fmt.Sprintf("%d bytes over a bound of 1024", size), func(t *testing.T) {
			user := newUser()
			st := e.open(t)
			heldHeaders(t, e, st, user)
			resp, err := st.RequestBody(body(size), true)
			refusedWith(t, resp, err, 413, "request_too_large")
			st.Close()
			if got := e.Used(t, user); got != 0 {
				t.Errorf("the user holds %d slots, want 0", got)
			}
			if got := poolUsed(t, e, "model", "big"); got != 0 {
				t.Errorf("model=big holds %d streams, want 0", got)
			}
		})
	}
}

// A pool keyed by header:Host reads the request's :authority, which is
// how Envoy hands the Host to its filters: one host, however spelt (case,
// a trailing dot, the default port of its :scheme), is one key; an empty
// one is 400 invalid_pool_key.
func TestHostHeaderSourceReadsTheAuthority(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_NONE, map[string]string{"org": "header:Host"}))
	to := func(authority string) (*extprocv3.ProcessingResponse, error) {
		return e.open(t).RequestHeaders(envoytest.Headers(":method", "POST", ":path", "/v1/chat/completions", ":authority", authority,
			":scheme", "https", "x-user-id", newUser(), "x-plan", "three"), false)
	}
	mustContinue(t)(to("acme"))
	if got := poolUsed(t, e, "org", "acme"); got != 1 {
		t.Errorf("org=acme holds %d streams, want 1", got)
	}
	for _, authority := range []string{"acme", "ACME", "acme.", "acme:443"} {
		resp, err := to(authority)
		if ir, refusal := refusedWith(t, resp, err, 429, "pool_limit_reached"); refusal.Error.Pool != "org" || refusal.Error.Key != "acme" {
			t.Errorf(":authority %s: refusal %s, want one naming org=acme", authority, ir.GetBody())
		}
	}
	// An empty :authority is no host's key: refused, not let in uncapped.
	resp, err := to("")
	refusedWith(t, resp, err, 400, "invalid_pool_key")
}

// With a body source, every request_body_mode but BUFFERED falls short,
// and the limiter says so at ERROR, naming the setting: STREAMED (the
// slot is decided after the upstream has the request), BUFFERED_PARTIAL
// (a body over Envoy's buffer comes cut) and NONE (no body comes).
func TestABodyModeThatFallsShortIsLogged(t *testing.T) {
	for _, c := range []struct {
		mode   filterv3.ProcessingMode_BodySendMode
		logged string
	}{
		{filterv3.ProcessingMode_STREAMED, "request_body_mode STREAMED"},
		{filterv3.ProcessingMode_BUFFERED_PARTIAL, "request_body_mode BUFFERED_PARTIAL"},
		{filterv3.ProcessingMode_NONE, "request_body_mode NONE"},
		{filterv3.ProcessingMode_BUFFERED, ""},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			logs := &holdtest.LogBuffer{}
			o := bodyEnvOptions(t, c.mode, modelBody)
			o.extproc.Logger = slog.New(slog.NewJSONHandler(logs, nil))
			e := newEnv(t, o)
			st := e.open(t)
			if c.mode == filterv3.ProcessingMode_NONE {
				grant(t, st, newUser(), "three")
			} else {
				heldHeaders(t, e, st, newUser())
				grantedAtBody(t)(st.RequestBody([]byte(`{"model":"small"}`), true))
			}
			st.Close()
			logged := strings.Count(logs.String(), `"level":"ERROR"`)
			switch {
			case c.logged == "" && logged > 0:
				t.Errorf("request_body_mode BUFFERED logged an ERROR: %s", logs.String())
			case c.logged != "" && (logged == 0 || !strings.Contains(logs.String(), c.logged)):
				t.Errorf("request_body_mode %s with a body source: want an ERROR naming %q; log:\n%s", c.mode, c.logged, logs.String())
			}
		})
	}
}

// In BUFFERED_PARTIAL mode Envoy sends a body over its buffer limit cut
// there, end_of_stream false: a pool's key is not read from part of a
// JSON body, and the request is refused 413, saying so, not 400
// invalid_body as though the client's body were not JSON. A body within
// the limit is decided as in BUFFERED mode.
func TestABufferedPartialBodyCutAtTheBufferIsTooLarge(t *testing.T) {
	e := newEnv(t, bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED_PARTIAL, modelBody))
	user := newUser()
	st := e.open(t)
	heldHeaders(t, e, st, user)
	full := `{"model":"small","messages":[{"role":"user","content":"` + strings.Repeat("A", 4096) + `"}]}`
	resp, err := st.RequestBody([]byte(full[:1024]), false) // what Envoy's buffer held
	ir, _ := refusedWith(t, resp, err, http.StatusRequestEntityTooLarge, "request_too_large")
	if !strings.Contains(string(ir.GetBody()), "BUFFERED_PARTIAL") {
		t.Errorf("the refusal of a cut body: %s; want it to name request_body_mode BUFFERED_PARTIAL", ir.GetBody())
	}
	st.Close()
	if got := e.Used(t, user); got != 0 {
		t.Errorf("the user holds %d slots, want 0", got)
	}
	within := e.open(t)
	heldHeaders(t, e, within, user)
	grantedAtBody(t)(within.RequestBody([]byte(`{"model":"big"}`), true))
	within.Close()
	e.AwaitUsed(t, user, 0, time.Second)
}
