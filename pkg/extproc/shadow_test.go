package extproc_test

import (
	"github.com/joishi/limiter/internal/holdtest"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/extproc"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// Shadow mode (DESIGN §18): a scope with enforce: false never refuses; a
// stream it would refuse passes, takes its slot, and the response headers
// to the client carry x-limiter-would-refuse.

const headerWouldRefuse = "x-limiter-would-refuse"

// responseWouldRefuse sends the response headers and returns the
// x-limiter-would-refuse the answer sets for the client ("" when none),
// checking that it carries the stream id and overwrites the upstream's,
// or, setting none, removes it: the header is the limiter's word alone.
func responseWouldRefuse(t *testing.T, st *envoytest.Stream, id, what string) string {
	t.Helper()
	resp := mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "text/event-stream",
		headerWouldRefuse, "upstream-says"), false))
	m := resp.GetResponseHeaders().GetResponse().GetHeaderMutation()
	if got, _ := envoytest.HeaderValue(m, extproc.DefaultStreamIDHeader); got != id {
		t.Errorf("%s: stream id sent to the client %q, want %q", what, got, id)
	}
	n := 0
	for _, h := range m.GetSetHeaders() {
		if h.GetHeader().GetKey() == headerWouldRefuse {
			n++
			if a := h.GetAppendAction(); a.String() != "OVERWRITE_IF_EXISTS_OR_ADD" {
				t.Errorf("%s: %s set with %s, want OVERWRITE_IF_EXISTS_OR_ADD (the upstream's is replaced)", what, headerWouldRefuse, a)
			}
		}
	}
	if n > 1 {
		t.Errorf("%s: %s set %d times, want once", what, headerWouldRefuse, n)
	}
	got, _ := envoytest.HeaderValue(m, headerWouldRefuse)
	if removed := slices.Contains(m.GetRemoveHeaders(), headerWouldRefuse); got == "" && !removed || got != "" && removed {
		t.Errorf("%s: %s set to %q, removed %v: want the limiter's value set, or else the upstream's removed", what, headerWouldRefuse, got, removed)
	}
	return got
}

// A plan of one in shadow mode: the user's second and third concurrent
// streams are granted, their response headers say would-be
// stream_limit_reached, and they hold their slots (3 of 1); the first
// says nothing; the "stream granted" log lines say the same. An enforced
// plan of one still refuses, and its refusal says nothing of shadows.
func TestShadowPlanIsGrantedAndSaysWhatItWouldRefuse(t *testing.T) {
	enforce := false
	shadowOne := tiers.Tier{Plan: "shadow-one", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second,
		FailureMode: tiers.FailOpen, Enforce: &enforce}
	logs := &holdtest.LogBuffer{}
	e := newEnv(t, envOptions{
		stack:   limitertest.Options{Tiers: append(limitertest.Tiers(), shadowOne)},
		extproc: extproc.Options{Logger: slog.New(slog.NewJSONHandler(logs, nil))},
	})
	user := newUser()
	var streams []*envoytest.Stream
	var ids []string
	for range 3 {
		st := e.open(t)
		ids = append(ids, grant(t, st, user, "shadow-one"))
		streams = append(streams, st)
	}
	if n := e.Used(t, user); n != 3 {
		t.Errorf("the user holds %d slots with 3 streams granted on a shadow plan of 1, want 3 (counts stay true)", n)
	}
	want := []string{"", "stream_limit_reached", "stream_limit_reached"}
	for i, st := range streams {
		if got := responseWouldRefuse(t, st, ids[i], "stream "+strconv.Itoa(i+1)); got != want[i] {
			t.Errorf("stream %d: %s %q, want %q", i+1, headerWouldRefuse, got, want[i])
		}
	}
	logged := logs.Granted(t)
	for i := range ids {
		if got, ok := logged[ids[i]]; !ok || got != want[i] {
			t.Errorf("stream %d's \"stream granted\" line: would_refuse %q (logged: %v), want %q", i+1, got, ok, want[i])
		}
	}
	for _, st := range streams {
		mustContinue(t)(st.ResponseBody([]byte("data: [DONE]\n\n"), true))
	}
	e.AwaitUsed(t, user, 0, 2*time.Second)

	other := newUser()
	holder := e.open(t)
	id := grant(t, holder, other, "one")
	refused := e.open(t)
	resp, err := refused.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", other, "x-plan", "one"), false)
	if err != nil {
		t.Fatal(err)
	}
	ir, body := immediate(t, resp)
	if ir.GetStatus().GetCode() != 429 || body.Error.Code != "stream_limit_reached" {
		t.Errorf("the enforced plan's second stream: %d %+v, want 429 stream_limit_reached", ir.GetStatus().GetCode(), body.Error)
	}
	if got, ok := envoytest.HeaderValue(ir.GetHeaders(), headerWouldRefuse); ok {
		t.Errorf("a refusal carries %s %q", headerWouldRefuse, got)
	}
	if got := responseWouldRefuse(t, holder, id, "the enforced plan's first stream"); got != "" {
		t.Errorf("the enforced plan's first stream: %s %q, want none", headerWouldRefuse, got)
	}
}

// A pool key in shadow mode at its cap, its key read from the buffered
// body: other users' streams are granted at the body, their response
// headers say pool_limit_reached model=big, and the key counts them (3
// of 1); another key says nothing.
func TestShadowPoolIsGrantedAndSaysWhichKey(t *testing.T) {
	enforce := false
	ten := 10
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{
		pools.Pool{Pool: "model", MaxConcurrentStreams: &ten, Keys: map[string]int{"big": 1}, Enforce: &enforce}.WithDefaults(),
	}); err != nil {
		t.Fatal(err)
	}
	sources, err := identity.ParsePoolSources(modelBody)
	if err != nil {
		t.Fatal(err)
	}
	logs := &holdtest.LogBuffer{}
	e := newEnv(t, envOptions{
		stack:    limitertest.Options{Limiter: limiter.Options{Pools: table}},
		identity: identity.Options{Pools: sources},
		envoy:    envoytest.Options{RequestBodyMode: filterv3.ProcessingMode_BUFFERED},
		extproc:  extproc.Options{Logger: slog.New(slog.NewJSONHandler(logs, nil))},
	})
	type stream struct {
		st    *envoytest.Stream
		id    string
		model string
		want  string
	}
	var streams []stream
	for _, s := range []struct{ model, want string }{
		{"big", ""}, {"big", "pool_limit_reached model=big"}, {"big", "pool_limit_reached model=big"}, {"small", ""},
	} {
		st := e.open(t)
		heldHeaders(t, e, st, newUser())
		id := grantedAtBody(t)(st.RequestBody([]byte(`{"model":"`+s.model+`","stream":true}`), true))
		streams = append(streams, stream{st, id, s.model, s.want})
	}
	if n := poolUsed(t, e, "model", "big"); n != 3 {
		t.Errorf("model=big holds %d streams with 3 granted, want 3 (counts stay true above the cap)", n)
	}
	logged := logs.Granted(t)
	for i, s := range streams {
		what := "stream " + strconv.Itoa(i+1) + " (" + s.model + ")"
		if got := responseWouldRefuse(t, s.st, s.id, what); got != s.want {
			t.Errorf("%s: %s %q, want %q", what, headerWouldRefuse, got, s.want)
		}
		if got, ok := logged[s.id]; !ok || got != s.want {
			t.Errorf("%s's \"stream granted\" line: would_refuse %q (logged: %v), want %q", what, got, ok, s.want)
		}
	}
	for _, s := range streams {
		resp := mustContinue(t)(s.st.ResponseBody([]byte("data: [DONE]\n\n"), true))
		if resp.GetResponseBody() == nil {
			t.Errorf("response body answered %v", resp)
		}
	}
	awaitPoolUsed(t, e, "model", "big", 0, 2*time.Second)
}

// The limiter's response headers are its word alone on a stream that
// holds no slot too (Envoy sent no request headers, so nothing was
// decided): the upstream's x-limiter-stream-id and x-limiter-would-refuse
// are removed, none set, and a client reads no shadow refusal the limiter
// never made.
func TestNoUpstreamsLimiterHeaderPassesOnAStreamWithoutASlot(t *testing.T) {
	e := newEnv(t, envOptions{})
	st := e.open(t)
	resp := mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "text/event-stream",
		extproc.DefaultStreamIDHeader, "upstream-stream", headerWouldRefuse, "stream_limit_reached"), false))
	m := resp.GetResponseHeaders().GetResponse().GetHeaderMutation()
	for _, h := range []string{extproc.DefaultStreamIDHeader, headerWouldRefuse} {
		if got, ok := envoytest.HeaderValue(m, h); ok {
			t.Errorf("the answer sets %s %q, want none: the stream holds no slot", h, got)
		}
		if !slices.Contains(m.GetRemoveHeaders(), h) {
			t.Errorf("the answer's mutation %v keeps the upstream's %s, want it removed", m, h)
		}
	}
}
