package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// Shadow mode behind `limiter proxy` (DESIGN §18): pool model, whose key
// the proxy reads from the body's model, caps big at 1 with enforce:
// false, so it never refuses and says what it would have refused.

// shadowProxyPools is the pools' part of the proxy's config file.
const shadowProxyPools = `identity:
  pools: {model: "body:model"}
pools:
  static:
    - pool: model
      keys: {big: 1}
      enforce: false
`

// shadowEvent is one line e2e/openai/shadow.mjs prints.
type shadowEvent struct {
	Event       string  `json:"event"`
	Status      *int    `json:"status"`
	WouldRefuse *string `json:"wouldRefuse"`
	StreamID    *string `json:"streamId"`
	Content     string  `json:"content"`
	Chunks      int     `json:"chunks"`
	Name        string  `json:"name"`
	Code        string  `json:"code"`
	Message     string  `json:"message"`
}

func (ev shadowEvent) String() string {
	data, _ := json.Marshal(ev)
	return string(data)
}

// runShadowSDK runs e2e/openai/shadow.mjs, one streaming chat completion
// with the official OpenAI Node SDK through the proxy at base, and
// returns its events as they come; the process is killed at cleanup.
func runShadowSDK(t *testing.T, script *nodeScript, base string, env ...string) <-chan shadowEvent {
	t.Helper()
	return runScript[shadowEvent](t, script, base, env...)
}

func nextShadowEvent(t *testing.T, events <-chan shadowEvent, what string) shadowEvent {
	t.Helper()
	return nextEvent(t, events, 10*time.Second, what)
}

// Four users stream model=big at once through the proxy, with the
// official OpenAI Node SDK, while the pool's cap of big is 1 in shadow
// mode: every stream passes and ends complete; the first carries no
// X-Limiter-Would-Refuse, the three over the cap carry
// "pool_limit_reached model=big"; model=big counts the 4 live streams
// (above its cap), the proxy logs the would-be refusals on their
// "stream granted" lines and counts them as shadow_refused; and the key
// is free once they end.
func TestOpenAISDKShadowPoolThroughTheProxy(t *testing.T) {
	script := newNodeScript(t, "shadow.mjs")

	redis := testenv.Redis(t)
	up := startBodyLLM(t)
	prefix := "e2e-proxy-shadow-" + randomID() + ":"
	config := fmt.Sprintf("redis:\n  addrs: [%q]\n  keyPrefix: %q\n  timeout: 2s\nproxy:\n  upstream: %q\n  routes: [/v1/chat/completions]\nlog:\n  format: text\n%s%s",
		redis, prefix, up.URL, proxyTiersYAML, shadowProxyPools)
	proc := servetest.Start(t, servetest.Options{Command: "proxy", Config: config, AwaitRedis: true})
	table := pools.NewTable()
	enforce := false
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"big": 1}, Enforce: &enforce}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{Tiers: proxyTiers, Redis: cluster.Options{Addrs: []string{redis}, Timeout: 5 * time.Second},
		Limiter: limiter.Options{Keys: keys.Schema{Prefix: prefix}, Pools: table}}).Limiter
	poolKey := func() limiter.PoolKeySlots {
		t.Helper()
		slots, err := lim.PoolSlots(t.Context(), "model", "big")
		if err != nil {
			t.Fatalf("PoolSlots(model, big): %v", err)
		}
		return slots
	}
	shadowRefused := `limiter_pool_acquire_total{outcome="shadow_refused",pool="model"}`
	shadowBefore := metricValue(t, proc, shadowRefused)

	const streams = 4
	type started struct {
		name, user string
		events     <-chan shadowEvent
		header     *string
	}
	var all []started
	// One after the other, each streaming before the next starts: the
	// first is within the cap, the others over it.
	for i := range streams {
		s := started{name: "s" + strconv.Itoa(i+1), user: "shadow-" + strconv.Itoa(i+1) + "-" + randomID()}
		s.events = runShadowSDK(t, script, proc.API, "USER_ID="+s.user, "PLAN=paid", "MODEL=big", "STREAM="+s.name)
		sent := 0
		var headers shadowEvent
		for headers.Event == "" {
			switch ev := nextShadowEvent(t, s.events, "stream "+s.name+"'s response"); ev.Event {
			case "sent":
				sent++
			case "headers":
				headers = ev
			default:
				t.Fatalf("stream %s: %s, want the response's headers (shadow mode never refuses)", s.name, ev)
			}
		}
		if sent != 1 {
			t.Errorf("stream %s: the SDK sent %d requests, want 1", s.name, sent)
		}
		if headers.Status == nil || *headers.Status != http.StatusOK || headers.StreamID == nil || *headers.StreamID == "" {
			t.Fatalf("stream %s: %s, want 200 with a stream id", s.name, headers)
		}
		if ev := nextShadowEvent(t, s.events, "stream "+s.name+"'s first chunk"); ev.Event != "chunk" || ev.Content != "first" {
			t.Fatalf("stream %s: %s, want its first chunk", s.name, ev)
		}
		up.request(t, s.name) // the upstream has it
		s.header = headers.WouldRefuse
		all = append(all, s)
	}

	for i, s := range all {
		switch {
		case i == 0 && s.header != nil:
			t.Errorf("stream %s, within the cap: X-Limiter-Would-Refuse %q, want none", s.name, *s.header)
		case i > 0 && (s.header == nil || *s.header != "pool_limit_reached model=big"):
			got := "none"
			if s.header != nil {
				got = strconv.Quote(*s.header)
			}
			t.Errorf("stream %s, over the cap: X-Limiter-Would-Refuse %s, want \"pool_limit_reached model=big\"", s.name, got)
		}
	}
	big := poolKey()
	if big.Used != streams || len(big.Holders) != streams {
		t.Errorf("model=big with %d streams live: used %d, %d holders; want %d (the real count, above the cap of 1)", streams, big.Used, len(big.Holders), streams)
	}
	holders := map[string]bool{}
	for _, h := range big.Holders {
		holders[h.UserID] = true
	}
	for _, s := range all {
		if !holders[s.user] {
			t.Errorf("model=big's holders %+v miss %s's stream", big.Holders, s.user)
		}
	}
	if got := metricValue(t, proc, shadowRefused) - shadowBefore; got != streams-1 {
		t.Errorf("%s rose by %v, want %d (one per would-be refusal)", shadowRefused, got, streams-1)
	}
	logged := func() int { return strings.Count(proc.Output(), `msg="stream granted"`) }
	shadowLogged := func() int { return strings.Count(proc.Output(), `would_refuse="pool_limit_reached model=big"`) }
	for deadline := time.Now().Add(2 * time.Second); logged() < streams && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond) // the log reaches the test through a pipe
	}
	if got := shadowLogged(); logged() != streams || got != streams-1 {
		t.Errorf("the proxy logged %d streams granted, %d with would_refuse=\"pool_limit_reached model=big\"; want %d, %d", logged(), got, streams, streams-1)
	}

	// Every stream ends complete, and the key frees up.
	for _, s := range all {
		up.release(s.name)
	}
	for _, s := range all {
		if ev := nextShadowEvent(t, s.events, "stream "+s.name+"'s last chunk"); ev.Event != "chunk" || ev.Content != "last" {
			t.Fatalf("stream %s after its release: %s, want its last chunk", s.name, ev)
		}
		if ev := nextShadowEvent(t, s.events, "stream "+s.name+"'s end"); ev.Event != "done" || ev.Chunks != 2 {
			t.Fatalf("stream %s: %s, want done after 2 chunks", s.name, ev)
		}
	}
	eventually(t, 2*time.Second, "model=big free once its streams ended", func() bool { return poolKey().Used == 0 })
}
