package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/joishi/limiter/internal/holdtest"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/proxy"
	"github.com/joishi/limiter/pkg/tiers"
)

// Shadow mode (DESIGN §18): a scope with enforce: false never refuses; a
// stream it would refuse passes, takes its slot, and its answer carries
// X-Limiter-Would-Refuse.

func withLog(o envOptions) (envOptions, *holdtest.LogBuffer) {
	logs := &holdtest.LogBuffer{}
	o.proxy.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	return o, logs
}

// wouldRefuse returns the X-Limiter-Would-Refuse values of resp, failing
// the test unless it is a 200 (a stream passed).
func wouldRefuse(t *testing.T, resp *http.Response, what string) []string {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d %+v, want 200 (shadow mode never refuses)", what, resp.StatusCode, decodeError(t, resp))
	}
	return resp.Header.Values(hold.HeaderWouldRefuse)
}

// A plan of one in shadow mode: the user's second and third concurrent
// streams pass, each said to be a would-be stream_limit_reached, hold
// their slots (3 of 1) and reach the upstream; the first says nothing;
// the "stream granted" log lines say the same. An enforced plan of one
// still refuses.
func TestShadowPlanPassesAndSaysWhatItWouldRefuse(t *testing.T) {
	enforce := false
	shadowOne := tiers.Tier{Plan: "shadow-one", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second,
		FailureMode: tiers.FailOpen, Enforce: &enforce}
	up := newSSE()
	o, logs := withLog(envOptions{stack: limitertest.Options{Tiers: append(limitertest.Tiers(), shadowOne)}})
	e := newEnv(t, up, o)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	user := newUser()

	var ids []string
	for i, want := range []string{"", "stream_limit_reached", "stream_limit_reached"} {
		resp := e.do(t, e.request(t, ctx, "POST", "/v1/chat/completions", user, "shadow-one", strings.NewReader(`{"stream":true}`)))
		defer resp.Body.Close()
		<-up.started
		got := wouldRefuse(t, resp, "stream "+strconv.Itoa(i+1))
		if want == "" && len(got) != 0 {
			t.Errorf("stream %d, within the limit: %s %q, want none", i+1, hold.HeaderWouldRefuse, got)
		}
		if want != "" && !slices.Equal(got, []string{want}) {
			t.Errorf("stream %d, over the limit: %s %q, want %q", i+1, hold.HeaderWouldRefuse, got, want)
		}
		ids = append(ids, resp.Header.Get(proxy.HeaderStreamID))
	}
	if n := e.Used(t, user); n != 3 {
		t.Errorf("the user holds %d slots with 3 streams open on a shadow plan of 1, want 3 (counts stay true)", n)
	}
	logged := logs.Granted(t)
	for i, want := range []string{"", "stream_limit_reached", "stream_limit_reached"} {
		if got, ok := logged[ids[i]]; !ok || got != want {
			t.Errorf("stream %d's \"stream granted\" line: would_refuse %q (logged: %v), want %q", i+1, got, ok, want)
		}
	}

	// The enforced plan of one refuses the second stream, and says
	// nothing of shadows.
	other := newUser()
	first := e.do(t, e.request(t, ctx, "POST", "/v1/chat/completions", other, "one", nil))
	defer first.Body.Close()
	<-up.started
	if got := wouldRefuse(t, first, "the enforced plan's first stream"); len(got) != 0 {
		t.Errorf("the enforced plan's first stream: %s %q, want none", hold.HeaderWouldRefuse, got)
	}
	second := e.do(t, e.request(t, ctx, "POST", "/v1/chat/completions", other, "one", nil))
	if second.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the enforced plan's second stream: status %d, want 429", second.StatusCode)
	}
	if got := second.Header.Values(hold.HeaderWouldRefuse); len(got) != 0 {
		t.Errorf("a refusal carries %s %q", hold.HeaderWouldRefuse, got)
	}
	if body := decodeError(t, second); body.Error.Code != "stream_limit_reached" {
		t.Errorf("the enforced plan's refusal: %+v, want stream_limit_reached", body.Error)
	}

	close(up.tokens)
	e.AwaitUsed(t, user, 0, 2*time.Second)
	e.AwaitUsed(t, other, 0, 2*time.Second)
}

// shadowPoolEnv is a proxy whose pool model (key from the body's model)
// is in shadow mode, capping big at 1 and other models at 10, beside pool
// org (key from X-Org), enforced, capping acme at 1.
func shadowPoolEnv(t *testing.T, up http.Handler) (*env, *holdtest.LogBuffer) {
	t.Helper()
	enforce := false
	ten := 10
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{
		pools.Pool{Pool: "model", MaxConcurrentStreams: &ten, Keys: map[string]int{"big": 1}, Enforce: &enforce}.WithDefaults(),
		pools.Pool{Pool: "org", Keys: map[string]int{"acme": 1}}.WithDefaults(),
	}); err != nil {
		t.Fatal(err)
	}
	sources, err := identity.ParsePoolSources(map[string]string{"model": "body:model", "org": "header:X-Org"})
	if err != nil {
		t.Fatal(err)
	}
	o, logs := withLog(envOptions{
		stack:    limitertest.Options{Limiter: limiter.Options{Pools: table}},
		identity: identity.Options{Pools: sources},
	})
	return newEnv(t, up, o), logs
}

func (e *env) chatAs(t *testing.T, ctx context.Context, user, org, model string) *http.Response {
	t.Helper()
	req := e.request(t, ctx, http.MethodPost, "/v1/chat/completions", user, "three", strings.NewReader(`{"model":"`+model+`","stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	if org != "" {
		req.Header.Set("X-Org", org)
	}
	return e.do(t, req)
}

func poolKeyUsed(t *testing.T, e *env, pool, key string) int {
	t.Helper()
	got, err := e.Stack.Limiter.PoolSlots(context.Background(), pool, key)
	if err != nil {
		t.Fatalf("PoolSlots(%s, %s): %v", pool, key, err)
	}
	return got.Used
}

// A pool key in shadow mode at its cap lets other users' streams join:
// each says pool_limit_reached model=big and counts (3 of 1); another
// key says nothing. An enforced pool beside it still refuses, even a
// stream the shadow key would take, which then holds nothing of it.
func TestShadowPoolPassesAndSaysWhichKey(t *testing.T) {
	up := newSSE()
	e, logs := shadowPoolEnv(t, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var ids []string
	for i, want := range []string{"", "pool_limit_reached model=big", "pool_limit_reached model=big"} {
		resp := e.chatAs(t, ctx, newUser(), "", "big")
		defer resp.Body.Close()
		<-up.started
		got := wouldRefuse(t, resp, "big stream "+strconv.Itoa(i+1))
		if want == "" && len(got) != 0 {
			t.Errorf("big stream %d, within the cap: %s %q, want none", i+1, hold.HeaderWouldRefuse, got)
		}
		if want != "" && !slices.Equal(got, []string{want}) {
			t.Errorf("big stream %d, over the cap: %s %q, want %q", i+1, hold.HeaderWouldRefuse, got, want)
		}
		ids = append(ids, resp.Header.Get(proxy.HeaderStreamID))
	}
	if n := poolKeyUsed(t, e, "model", "big"); n != 3 {
		t.Errorf("model=big holds %d streams with 3 open, want 3 (counts stay true above the cap)", n)
	}
	logged := logs.Granted(t)
	for i, want := range []string{"", "pool_limit_reached model=big", "pool_limit_reached model=big"} {
		if got, ok := logged[ids[i]]; !ok || got != want {
			t.Errorf("big stream %d's \"stream granted\" line: would_refuse %q (logged: %v), want %q", i+1, got, ok, want)
		}
	}

	small := e.chatAs(t, ctx, newUser(), "", "small")
	defer small.Body.Close()
	<-up.started
	if got := wouldRefuse(t, small, "a small stream"); len(got) != 0 {
		t.Errorf("a small stream: %s %q, want none", hold.HeaderWouldRefuse, got)
	}

	// org=acme, enforced, is held; a stream of big for acme is refused by
	// org, and leaves model=big as it was.
	acme := e.chatAs(t, ctx, newUser(), "acme", "small")
	defer acme.Body.Close()
	<-up.started
	if got := wouldRefuse(t, acme, "acme's first stream"); len(got) != 0 {
		t.Errorf("acme's first stream: %s %q, want none", hold.HeaderWouldRefuse, got)
	}
	refused := e.chatAs(t, ctx, newUser(), "acme", "big")
	if refused.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("big for acme with org=acme full: status %d, want 429 (org is enforced)", refused.StatusCode)
	}
	if got := refused.Header.Values(hold.HeaderWouldRefuse); len(got) != 0 {
		t.Errorf("a refusal carries %s %q", hold.HeaderWouldRefuse, got)
	}
	var body poolBody
	if err := json.NewDecoder(refused.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	refused.Body.Close()
	if body.Error.Code != "pool_limit_reached" || body.Error.Pool != "org" || body.Error.Key != "acme" {
		t.Errorf("big for acme: %+v, want pool_limit_reached org=acme", body.Error)
	}
	if n := poolKeyUsed(t, e, "model", "big"); n != 3 {
		t.Errorf("model=big holds %d streams after a stream refused by org, want still 3", n)
	}

	close(up.tokens)
	deadline := time.Now().Add(2 * time.Second)
	for poolKeyUsed(t, e, "model", "big") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("model=big holds %d streams 2s after they all ended, want 0", poolKeyUsed(t, e, "model", "big"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type poolBody struct {
	Error struct {
		Code string `json:"code"`
		Pool string `json:"pool"`
		Key  string `json:"key"`
	} `json:"error"`
}

// The limiter's headers are on the final answer, after an upstream's
// 103 Early Hints (which clears the headers the reverse proxy wrote), and
// replace the upstream's of the same name: X-Limiter-Stream-Id always,
// X-Limiter-Would-Refuse on a shadow grant; on another grant the
// upstream's X-Limiter-Would-Refuse (a limiter behind this one) is
// dropped, the header being this limiter's word alone.
func TestLimiterHeadersAreTheFinalAnswers(t *testing.T) {
	enforce := false
	shadowOne := tiers.Tier{Plan: "shadow-one", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second,
		FailureMode: tiers.FailOpen, Enforce: &enforce}
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set(hold.HeaderWouldRefuse, "upstream-says")
		w.Header().Set(proxy.HeaderStreamID, "upstream-"+r.Header.Get(proxy.HeaderStreamID))
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}), envOptions{stack: limitertest.Options{Tiers: append(limitertest.Tiers(), shadowOne)}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	user := newUser()
	first := e.do(t, e.request(t, ctx, "POST", "/v1/chat/completions", user, "shadow-one", nil))
	defer first.Body.Close()
	second := e.do(t, e.request(t, ctx, "POST", "/v1/chat/completions", user, "shadow-one", nil))
	defer second.Body.Close()
	for _, c := range []struct {
		name  string
		resp  *http.Response
		would []string
	}{
		{"the first stream", first, nil},
		{"the second stream", second, []string{"stream_limit_reached"}},
	} {
		if got := wouldRefuse(t, c.resp, c.name); !slices.Equal(got, c.would) {
			t.Errorf("%s: %s %q, want %q", c.name, hold.HeaderWouldRefuse, got, c.would)
		}
		if ids := c.resp.Header.Values(proxy.HeaderStreamID); len(ids) != 1 || ids[0] == "" || strings.HasPrefix(ids[0], "upstream-") {
			t.Errorf("%s: %s %q, want the slot's id alone", c.name, proxy.HeaderStreamID, ids)
		}
	}
	if n := e.Used(t, user); n != 2 {
		t.Errorf("the user holds %d slots, want 2", n)
	}
	cancel()
	_, _ = io.Copy(io.Discard, first.Body)
	_, _ = io.Copy(io.Discard, second.Body)
	e.AwaitUsed(t, user, 0, 2*time.Second)
}

// The limiter's headers are its word alone on every route: an upstream's
// X-Limiter-Would-Refuse and X-Limiter-Stream-Id (a limiter behind this
// one, or an upstream that sends them) reach the client neither on a
// route the proxy does not limit nor on a CORS preflight it passes
// without a slot: there the limiter says nothing, and a client must not
// read a shadow refusal it never made. The upstream's other headers pass.
func TestNoUpstreamsLimiterHeaderPassesOnARouteNotLimited(t *testing.T) {
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(hold.HeaderWouldRefuse, "stream_limit_reached")
		w.Header().Set(proxy.HeaderStreamID, "upstream-stream")
		w.Header().Set("X-Upstream", "kept")
		w.WriteHeader(http.StatusOK)
	}), envOptions{proxy: proxy.Options{Routes: []string{"/v1/chat/completions"}}})
	cors := http.Header{"Origin": {"https://chat.example"}, "Access-Control-Request-Method": {"POST"}}
	for _, tc := range []struct {
		name, method, path string
		header             http.Header
	}{
		{"a GET of a route not limited", "GET", "/v1/models", nil},
		{"a POST to a route not limited", "POST", "/v1/embeddings", nil},
		{"a preflight of the limited route", "OPTIONS", "/v1/chat/completions", cors},
	} {
		req := e.request(t, context.Background(), tc.method, tc.path, "", "", nil)
		for k, v := range tc.header {
			req.Header[k] = v
		}
		resp := e.do(t, req)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Upstream") != "kept" {
			t.Errorf("%s: %d, X-Upstream %q; want the upstream's 200 and its other headers", tc.name, resp.StatusCode, resp.Header.Get("X-Upstream"))
		}
		for _, h := range []string{hold.HeaderWouldRefuse, proxy.HeaderStreamID} {
			if got := resp.Header.Values(h); len(got) != 0 {
				t.Errorf("%s: %s %q, want none: the limiter set none", tc.name, h, got)
			}
		}
	}
}

// Nor do they reach it in an upstream's interim (1xx) answer, which the
// reverse proxy relays as it comes, or among its trailers, announced or
// not, on a limited route or any other; the upstream's other interim
// headers and trailers pass.
func TestNoUpstreamsLimiterHeaderPassesInAnInterimAnswerOrATrailer(t *testing.T) {
	limiterHeaders := []string{hold.HeaderWouldRefuse, proxy.HeaderStreamID}
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload; as=style")
		w.Header().Set(hold.HeaderWouldRefuse, "stream_limit_reached")
		w.Header().Set(proxy.HeaderStreamID, "upstream-stream")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del(hold.HeaderWouldRefuse)
		w.Header().Del(proxy.HeaderStreamID)
		w.Header().Set("Trailer", "X-Upstream-Trailer, "+hold.HeaderWouldRefuse)
		fmt.Fprint(w, `{"choices":[]}`)
		w.Header().Set("X-Upstream-Trailer", "kept")
		w.Header().Set(hold.HeaderWouldRefuse, "stream_limit_reached")
		w.Header().Set(http.TrailerPrefix+proxy.HeaderStreamID, "upstream-stream") // not announced
	}), envOptions{proxy: proxy.Options{Routes: []string{"/v1/chat/completions"}}})
	for _, tc := range []struct{ name, path string }{
		{"a limited route", "/v1/chat/completions"},
		{"a route not limited", "/v1/models"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var interim []textproto.MIMEHeader
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
				Got1xxResponse: func(code int, h textproto.MIMEHeader) error { interim = append(interim, h); return nil },
			})
			resp := e.do(t, e.request(t, ctx, "POST", tc.path, newUser(), "one", strings.NewReader("{}")))
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || len(interim) != 1 || interim[0].Get("Link") == "" || resp.Trailer.Get("X-Upstream-Trailer") != "kept" {
				t.Fatalf("status %d, interim answers %q, trailers %q; want 200 after one 103 with its Link, and the upstream's other trailer",
					resp.StatusCode, interim, resp.Trailer)
			}
			for _, h := range limiterHeaders {
				if got := interim[0].Values(h); len(got) != 0 {
					t.Errorf("the 103 carried the upstream's %s %q, want none", h, got)
				}
				if got, ok := resp.Trailer[h]; ok {
					t.Errorf("the trailers carried the upstream's %s %q, want none, not even announced", h, got)
				}
			}
		})
	}
}
