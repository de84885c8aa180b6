package e2e

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
)

// sdkEvent is one line e2e/openai/stream.mjs prints.
type sdkEvent struct {
	T       int64  `json:"t"` // Unix milliseconds
	Event   string `json:"event"`
	Content string `json:"content"`
	Chunks  int    `json:"chunks"`
	Name    string `json:"name"`
	Status  *int   `json:"status"`
	Code    string `json:"code"`
	Type    string `json:"type"`
	Message string `json:"message"`
}

// sdk runs the official OpenAI Node SDK (e2e/openai/stream.mjs).
type sdk struct{ script *nodeScript }

func newSDK(t *testing.T) *sdk { return &sdk{script: newNodeScript(t, "stream.mjs")} }

// stream starts one streaming chat completion through the proxy at base
// and returns its events as they come.
func (s *sdk) stream(t *testing.T, base string, env ...string) <-chan sdkEvent {
	t.Helper()
	return runScript[sdkEvent](t, s.script, base, env...)
}

// event returns the next event, failing the test when none comes within d.
func event(t *testing.T, events <-chan sdkEvent, d time.Duration, what string) sdkEvent {
	t.Helper()
	return nextEvent(t, events, d, what)
}

// chunksUntilDone reads the events of one stream (what names it) until
// "done", each within 10s, and returns its chunks; any other event fails
// the test. onChunk, when not nil, runs after each chunk with the number
// read so far.
func chunksUntilDone(t *testing.T, events <-chan sdkEvent, what string, onChunk func(n int)) []sdkEvent {
	t.Helper()
	var chunks []sdkEvent
	for {
		ev := event(t, events, 10*time.Second, what)
		if ev.Event == "done" {
			return chunks
		}
		if ev.Event != "chunk" {
			t.Fatalf("%s: %+v, want chunks and done", what, ev)
		}
		chunks = append(chunks, ev)
		if onChunk != nil {
			onChunk(len(chunks))
		}
	}
}

// metricValue returns a sample of a process's /metrics, 0 when absent.
func metricValue(t *testing.T, proc *servetest.Process, series string) float64 {
	t.Helper()
	_, body := servetest.Get(proc.Ops + "/metrics")
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// The official OpenAI Node SDK streams chat completions through a real
// `limiter proxy` to an upstream speaking OpenAI's SSE: tokens arrive as
// they are sent, a free user's second stream is the SDK's RateLimitError,
// an abort frees the slot at once, and a long stream keeps its slot until
// it ends.
func TestOpenAISDKThroughTheProxy(t *testing.T) {
	js := newSDK(t)
	e := startProxy(t, "")
	limited := `limiter_streams_refused_total{mode="proxy",reason="limit"}`

	t.Run("a free user's second stream is a RateLimitError", func(t *testing.T) {
		user := "sdk-" + randomID()
		first := js.stream(t, e.proc.API, "USER_ID="+user, "PLAN=free", "MODEL=hold")
		ev := event(t, first, 10*time.Second, "the first stream's first chunk")
		if ev.Event != "chunk" || ev.Content != "first" {
			t.Fatalf("first stream: %+v, want its first chunk", ev)
		}
		// The upstream holds the rest back: the chunk came on its own, not
		// with the end of the response.
		select {
		case <-e.llm.finished:
			t.Fatal("the upstream finished before the SDK saw the first chunk")
		default:
		}
		refusedBefore := metricValue(t, e.proc, limited)
		requests := e.llm.requests.Load()
		start := time.Now()
		second := js.stream(t, e.proc.API, "USER_ID="+user, "PLAN=free", "MODEL=fast")
		ev = event(t, second, 10*time.Second, "the second stream's answer")
		if ev.Event != "error" || ev.Name != "RateLimitError" || ev.Status == nil || *ev.Status != 429 ||
			ev.Code != "stream_limit_reached" || ev.Type != "rate_limit_error" {
			t.Fatalf("second concurrent stream of a free user: %+v, want RateLimitError 429 stream_limit_reached", ev)
		}
		// x-should-retry: false: the SDK raised at the first 429, without
		// the two retries it makes by default.
		if got := metricValue(t, e.proc, limited) - refusedBefore; got != 1 {
			t.Errorf("the proxy refused %v requests for the SDK's one call, want 1 (no retries)", got)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("RateLimitError took %v to surface", took)
		}
		if got := e.llm.requests.Load(); got != requests {
			t.Errorf("the refused stream reached the upstream (%d requests, want %d)", got, requests)
		}
		e.llm.Release()
		if ev := event(t, first, 10*time.Second, "the first stream's end"); ev.Event != "chunk" || ev.Content != "last" {
			t.Errorf("first stream after the release: %+v, want its last chunk", ev)
		}
		if ev := event(t, first, 10*time.Second, "the first stream's end"); ev.Event != "done" {
			t.Errorf("first stream: %+v, want done", ev)
		}
		e.awaitUsed(t, user, 0, time.Second)
	})

	t.Run("an abort mid-stream frees the slot within 1s", func(t *testing.T) {
		user := "sdk-" + randomID()
		events := js.stream(t, e.proc.API, "USER_ID="+user, "PLAN=free", "MODEL=hold", "ABORT_AFTER=1")
		if ev := event(t, events, 10*time.Second, "the first chunk"); ev.Event != "chunk" {
			t.Fatalf("%+v, want a chunk", ev)
		}
		if ev := event(t, events, 5*time.Second, "the abort"); ev.Event != "aborted" {
			t.Fatalf("%+v, want aborted", ev)
		}
		// The node process lives on: only the abort can have freed it.
		took := e.awaitUsed(t, user, 0, time.Second)
		t.Logf("slot freed %v after the SDK reported its abort", took)
		e.llm.Release()
	})

	t.Run("a stream longer than 3x the TTL keeps its slot until it ends", func(t *testing.T) {
		user := "sdk-" + randomID()
		// 8 chunks 500ms apart: 3.5s, the free plan's TTL is 1s.
		events := js.stream(t, e.proc.API, "USER_ID="+user, "PLAN=free", "MODEL=slow:8:500")
		checked := false
		chunks := chunksUntilDone(t, events, "the long stream", func(n int) {
			if n == 7 { // past 3s: three TTLs
				if held := e.used(t, user); held != 1 {
					t.Fatalf("%d slots held 3s into the stream, want 1 (heartbeated)", held)
				}
				checked = true
			}
		})
		if len(chunks) != 8 || !checked {
			t.Fatalf("got %d chunks, want 8", len(chunks))
		}
		if spread := time.Duration(chunks[7].T-chunks[0].T) * time.Millisecond; spread < 3*time.Second {
			t.Errorf("the chunks arrived within %v of each other, want them as sent, 3.5s apart end to end", spread)
		}
		took := e.awaitUsed(t, user, 0, time.Second)
		t.Logf("slot freed %v after the SDK's stream ended", took)
	})
}
