package e2e

import (
	"context"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// extprocShadowTiers and extprocShadowPools configure the ext_proc shadow test:
// free (1) enforced, trial (1) in shadow mode, paid (3); pool model, its
// key read from the body, caps big at 1 in shadow mode.
const extprocShadowTiers = `    - plan: free
      maxConcurrentStreams: 1
      slotTTL: 10s
      heartbeatInterval: 1s
    - plan: trial
      maxConcurrentStreams: 1
      slotTTL: 10s
      heartbeatInterval: 1s
      enforce: false
    - plan: paid
      maxConcurrentStreams: 3
      slotTTL: 10s
      heartbeatInterval: 1s
`

const extprocShadowPools = `pools:
  static:
    - pool: model
      keys: {big: 1}
      enforce: false
identity:
  pools:
    model: body:model
`

// extprocShadowStream plays Envoy's BUFFERED sequence for user on plan,
// the body naming model, and then the upstream's response headers; it
// returns the stream, the answer to the body, and the
// x-limiter-would-refuse the answer to the response headers sets for the
// client ("" when none, or when the body was refused).
func extprocShadowStream(t *testing.T, e *envoytest.Envoy, user, plan, model string) (*envoytest.Stream, *extprocv3.ProcessingResponse, string) {
	t.Helper()
	st, err := e.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", plan), false)
	if err != nil || resp.GetRequestHeaders().GetResponse().GetStatus() != extprocv3.CommonResponse_CONTINUE {
		t.Fatalf("request_headers of %s: %v, %v; want CONTINUE", user, resp, err)
	}
	resp, err = st.RequestBody([]byte(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"stream":true}`), true)
	if err != nil {
		t.Fatalf("request_body of %s: %v", user, err)
	}
	if resp.GetImmediateResponse() != nil {
		return st, resp, ""
	}
	id, ok := envoytest.HeaderValue(resp.GetRequestBody().GetResponse().GetHeaderMutation(), "x-limiter-stream-id")
	if !ok || id == "" {
		t.Fatalf("request_body of %s: %v, want a CONTINUE setting x-limiter-stream-id", user, resp)
	}
	headers, err := st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "text/event-stream"), false)
	if err != nil {
		t.Fatalf("response_headers of %s: %v", user, err)
	}
	m := headers.GetResponseHeaders().GetResponse().GetHeaderMutation()
	if got, _ := envoytest.HeaderValue(m, "x-limiter-stream-id"); got != id {
		t.Errorf("response_headers of %s: stream id %q to the client, want %q", user, got, id)
	}
	would, _ := envoytest.HeaderValue(m, "x-limiter-would-refuse")
	return st, resp, would
}

// `limiter serve`'s ext_proc server, its tiers and pools from the config
// file: a plan in shadow mode grants a user's second stream and tells the
// client x-limiter-would-refuse: stream_limit_reached; a pool key in
// shadow mode grants a second user's stream of it, telling
// pool_limit_reached model=big; the counts are true (2 of 1), the
// counters move by the would-be refusals; an enforced plan still refuses.
func TestExtProcShadowMode(t *testing.T) {
	redis := testenv.Redis(t)
	prefix := "e2e-extproc-shadow:" + randomID() + ":"
	proc := servetest.Start(t, servetest.Options{Config: serveConfig([]string{redis}, prefix, extprocShadowTiers) + extprocShadowPools,
		AwaitRedis: true, ExtProc: true})
	envoy, err := envoytest.Dial(proc.ExtProc, envoytest.Options{MessageTimeout: extprocMessageTimeout, RequestBodyMode: filterv3.ProcessingMode_BUFFERED})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = envoy.Close() })
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"big": 1}}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{redis}, Timeout: 5 * time.Second},
		Limiter: limiter.Options{Keys: keys.Schema{Prefix: prefix}, Pools: table}}).Limiter
	used := func(user string) int {
		got, err := lim.Slots(t.Context(), user)
		if err != nil {
			t.Fatalf("Slots(%s): %v", user, err)
		}
		return got.Used
	}
	bigUsed := func() int {
		got, err := lim.PoolSlots(t.Context(), "model", "big")
		if err != nil {
			t.Fatalf("PoolSlots(model, big): %v", err)
		}
		return got.Used
	}
	shadowPlan := `limiter_acquire_total{outcome="shadow_refused",plan="trial"}`
	shadowPool := `limiter_pool_acquire_total{outcome="shadow_refused",pool="model"}`
	planBefore, poolBefore := metricValue(t, proc, shadowPlan), metricValue(t, proc, shadowPool)

	// The trial plan (1, shadow): both of a user's streams pass, the
	// second said to be over the limit.
	trial := "trial-" + randomID()
	var held []*envoytest.Stream
	for i, want := range []string{"", "stream_limit_reached"} {
		st, resp, would := extprocShadowStream(t, envoy, trial, "trial", "small")
		if resp.GetImmediateResponse() != nil {
			t.Fatalf("trial stream %d: refused %v, want granted (shadow mode)", i+1, resp.GetImmediateResponse())
		}
		if would != want {
			t.Errorf("trial stream %d: x-limiter-would-refuse %q, want %q", i+1, would, want)
		}
		held = append(held, st)
	}
	if n := used(trial); n != 2 {
		t.Errorf("the trial user holds %d slots with 2 streams open on a plan of 1, want 2 (counts stay true)", n)
	}

	// Pool model=big (1, shadow): two paid users' streams pass, the
	// second said to be over the key's cap.
	for i, want := range []string{"", "pool_limit_reached model=big"} {
		st, resp, would := extprocShadowStream(t, envoy, "paid-"+randomID(), "paid", "big")
		if resp.GetImmediateResponse() != nil {
			t.Fatalf("big stream %d: refused %v, want granted (shadow mode)", i+1, resp.GetImmediateResponse())
		}
		if would != want {
			t.Errorf("big stream %d: x-limiter-would-refuse %q, want %q", i+1, would, want)
		}
		held = append(held, st)
	}
	if n := bigUsed(); n != 2 {
		t.Errorf("model=big holds %d streams with 2 open, want 2 (above its cap of 1)", n)
	}
	if got := metricValue(t, proc, shadowPlan) - planBefore; got != 1 {
		t.Errorf("%s rose by %v, want 1", shadowPlan, got)
	}
	if got := metricValue(t, proc, shadowPool) - poolBefore; got != 1 {
		t.Errorf("%s rose by %v, want 1", shadowPool, got)
	}

	// The free plan (1, enforced) refuses a second stream.
	free := "free-" + randomID()
	st, _, would := extprocShadowStream(t, envoy, free, "free", "small")
	if would != "" {
		t.Errorf("free stream 1: x-limiter-would-refuse %q, want none", would)
	}
	held = append(held, st)
	_, resp, _ := extprocShadowStream(t, envoy, free, "free", "small")
	if ir := resp.GetImmediateResponse(); ir.GetStatus().GetCode() != 429 || ir.GetDetails() != "limiter_stream_limit_reached" {
		t.Errorf("free stream 2: %v, want a 429 stream_limit_reached", resp)
	} else if got, ok := envoytest.HeaderValue(ir.GetHeaders(), "x-limiter-would-refuse"); ok {
		t.Errorf("a refusal carries x-limiter-would-refuse %q", got)
	}

	// Every stream ends: the slots and the key free up.
	for _, st := range held {
		if _, err := st.ResponseBody([]byte("data: [DONE]\n\n"), true); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 2*time.Second, "the slots and model=big freed once the streams ended", func() bool {
		return used(trial) == 0 && used(free) == 0 && bigUsed() == 0
	})
}
