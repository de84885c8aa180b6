package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// extprocBodyPools is the pool model, its key big capped at 2, whose key
// the ext_proc server reads from the request body's "model".
const extprocBodyPools = `pools:
  static:
    - pool: model
      keys: {big: 2}
identity:
  pools:
    model: body:model
`

// bodyPoolStack is three serve processes reading the model pool's key
// from the request body, an Envoy sending request bodies BUFFERED to
// each, and a limiter on their keys to read the pool key in Redis.
type bodyPoolStack struct {
	envoys []*envoytest.Envoy
	slots  *limiter.Limiter
}

func startBodyPoolStack(t *testing.T) *bodyPoolStack {
	t.Helper()
	redis := testenv.Cluster(t)
	prefix := "e2e-extproc-pools:" + randomID() + ":"
	cfg := serveConfig(redis, prefix, incidentTiers) + extprocBodyPools
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"big": 2}}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	s := &bodyPoolStack{slots: limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster,
		Limiter: limiter.Options{Keys: keys.Schema{Prefix: prefix}, Pools: table}}).Limiter}
	procs := make([]*servetest.Process, 3)
	for i := range procs {
		procs[i] = servetest.Start(t, servetest.Options{Config: cfg, AwaitRedis: true, ExtProc: true})
	}
	for _, p := range procs {
		e, err := envoytest.Dial(p.ExtProc, envoytest.Options{MessageTimeout: extprocMessageTimeout,
			RequestBodyMode: filterv3.ProcessingMode_BUFFERED})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		s.envoys = append(s.envoys, e)
	}
	return s
}

// bigUsed returns how many streams hold model=big in Redis.
func (s *bodyPoolStack) bigUsed(t *testing.T) int {
	t.Helper()
	got, err := s.slots.PoolSlots(context.Background(), "model", "big")
	if err != nil {
		t.Fatalf("PoolSlots(model, big): %v", err)
	}
	return got.Used
}

// bufferedRequest plays Envoy's BUFFERED sequence for user on e: the
// request headers, which take no slot, then the whole body naming
// model; it returns the stream and the answer to the body.
func (s *bodyPoolStack) bufferedRequest(t *testing.T, e *envoytest.Envoy, user, model string) (*envoytest.Stream, *extprocv3.ProcessingResponse) {
	t.Helper()
	st, err := e.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "paid"), false)
	if err != nil {
		t.Fatalf("request_headers of %s: %v", user, err)
	}
	common := resp.GetRequestHeaders().GetResponse()
	if common.GetStatus() != extprocv3.CommonResponse_CONTINUE {
		t.Fatalf("request_headers of %s answered %v, want CONTINUE", user, resp)
	}
	if _, ok := envoytest.HeaderValue(common.GetHeaderMutation(), "x-limiter-stream-id"); ok {
		t.Fatalf("request_headers of %s set a stream id before the body: %v", user, resp)
	}
	if got, err := s.slots.Slots(context.Background(), user); err != nil || got.Used != 0 {
		t.Fatalf("after the request headers %s holds %+v (%v), want no slot", user, got, err)
	}
	resp, err = st.RequestBody([]byte(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"stream":true}`), true)
	if err != nil {
		t.Fatalf("request_body of %s: %v", user, err)
	}
	return st, resp
}

// grantedBody fails the test unless resp, the answer to a request body,
// is a CONTINUE carrying the stream id upstream.
func grantedBody(t *testing.T, resp *extprocv3.ProcessingResponse, what string) {
	t.Helper()
	common := resp.GetRequestBody().GetResponse()
	if id, ok := envoytest.HeaderValue(common.GetHeaderMutation(), "x-limiter-stream-id"); common.GetStatus() != extprocv3.CommonResponse_CONTINUE || !ok || id == "" {
		t.Fatalf("%s: answered %v, want a CONTINUE body response setting x-limiter-stream-id", what, resp)
	}
}

// A pool key read from the request body caps streams across processes:
// with model=big capped at 2, two users' streams through two processes
// hold it, a third user's through the third process is refused at its
// body with 429 pool_limit_reached, and once one stream ends the third is
// let in.
func TestExtProcBodyPoolAcrossProcesses(t *testing.T) {
	s := startBodyPoolStack(t)
	users := []string{"u-" + randomID(), "u-" + randomID(), "u-" + randomID()}

	first, resp := s.bufferedRequest(t, s.envoys[0], users[0], "big")
	grantedBody(t, resp, "the first user's body through process 0")
	_, resp = s.bufferedRequest(t, s.envoys[1], users[1], "big")
	grantedBody(t, resp, "the second user's body through process 1")
	if got := s.bigUsed(t); got != 2 {
		t.Fatalf("model=big holds %d streams, want 2", got)
	}

	third, resp := s.bufferedRequest(t, s.envoys[2], users[2], "big")
	ir := resp.GetImmediateResponse()
	var refusal struct {
		Error struct{ Code, Pool, Key string } `json:"error"`
	}
	if ir == nil || ir.GetStatus().GetCode() != 429 || json.Unmarshal(ir.GetBody(), &refusal) != nil ||
		refusal.Error.Code != "pool_limit_reached" || refusal.Error.Pool != "model" || refusal.Error.Key != "big" {
		t.Fatalf("the third user's body through process 2: %v, want a 429 ImmediateResponse pool_limit_reached naming model=big", resp)
	}
	third.Close()
	if got, big := s.used(t, users[2]), s.bigUsed(t); got != 0 || big != 2 {
		t.Errorf("after the refusal the third user holds %d slots and model=big %d streams, want 0 and 2", got, big)
	}

	// The first stream's response ends on process 0: model=big has room,
	// and the third user is let in through process 2.
	mustAnswer(t)(first.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "text/event-stream"), false))
	mustAnswer(t)(first.ResponseBody([]byte("data: [DONE]\n\n"), true))
	waitFor(t, 2*time.Second, func() bool { return s.bigUsed(t) == 1 }, "model=big to hold 1 stream after the first one ended")
	_, resp = s.bufferedRequest(t, s.envoys[2], users[2], "big")
	grantedBody(t, resp, "the third user's body after a stream ended")
	if got := s.bigUsed(t); got != 2 {
		t.Errorf("model=big holds %d streams, want 2", got)
	}
}

// used returns how many live slots Redis holds for user.
func (s *bodyPoolStack) used(t *testing.T, user string) int {
	t.Helper()
	got, err := s.slots.Slots(context.Background(), user)
	if err != nil {
		t.Fatalf("Slots(%s): %v", user, err)
	}
	return got.Used
}
