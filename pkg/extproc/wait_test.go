package extproc_test

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/extproc"
	"github.com/joishi/limiter/pkg/tiers"
)

// waitTiers: one slot per user, waited for up to 10s (queued) or 300ms
// (queued-short).
func waitTiers() []tiers.Tier {
	return []tiers.Tier{
		{Plan: "queued", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 10 * time.Second},
		{Plan: "queued-short", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 300 * time.Millisecond},
	}
}

// newWaitEnv is an env whose requests may wait 5s (extproc.wait), before
// an Envoy with message_timeout messageTimeout and max_message_timeout
// maxTimeout (0: unset).
func newWaitEnv(t *testing.T, messageTimeout, maxTimeout, grace time.Duration) *env {
	t.Helper()
	return newEnv(t, envOptions{
		stack: limitertest.Options{Tiers: waitTiers()}, wait: 5 * time.Second, grace: grace,
		envoy: envoytest.Options{MessageTimeout: messageTimeout, MaxMessageTimeout: maxTimeout},
	})
}

type answered struct {
	resp *extprocv3.ProcessingResponse
	err  error
}

// requestAsync sends request headers of user and plan on st in a goroutine
// of its own, and returns where the answer arrives.
func requestAsync(st *envoytest.Stream, user, plan string) <-chan answered {
	out := make(chan answered, 1)
	go func() {
		resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", plan), false)
		out <- answered{resp, err}
	}()
	return out
}

func answerWithin(t *testing.T, ch <-chan answered, within time.Duration, what string) answered {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(within):
		t.Fatalf("%s: no answer within %s", what, within)
		return answered{}
	}
}

// A request of a user at the limit waits in the queue past Envoy's
// message_timeout, which the server extended by the wait plus 1s before
// it waited, and is granted the slot the user's other stream releases.
func TestAWaitingRequestIsGrantedTheSlotReleased(t *testing.T) {
	const messageTimeout = 2 * time.Second
	e := newWaitEnv(t, messageTimeout, time.Minute, 0)
	user := newUser()
	first := e.open(t)
	grant(t, first, user, "queued")

	second := e.open(t)
	start := time.Now()
	answer := requestAsync(second, user, "queued")
	e.AwaitQueue(t, user, 1, 5*time.Second)
	// Still waiting once Envoy's own timer would have run out.
	select {
	case a := <-answer:
		t.Fatalf("the waiting request was answered before a slot freed: %v, %v", a.resp, a.err)
	case <-time.After(time.Until(start.Add(messageTimeout + 200*time.Millisecond))):
	}
	mustContinue(t)(first.ResponseHeaders(envoytest.Headers(":status", "200"), true)) // no body: released
	a := answerWithin(t, answer, 3*time.Second, "the waiting request after the slot was released")
	if a.err != nil {
		t.Fatalf("the waiting request: %v", a.err)
	}
	common := a.resp.GetRequestHeaders().GetResponse()
	if common.GetStatus() != extprocv3.CommonResponse_CONTINUE {
		t.Fatalf("the waiting request was answered %v, want CONTINUE", a.resp)
	}
	if id, ok := envoytest.HeaderValue(common.GetHeaderMutation(), extproc.DefaultStreamIDHeader); !ok || id == "" {
		t.Errorf("the granted request sets no %s header: %v", extproc.DefaultStreamIDHeader, a.resp)
	}
	if want := []time.Duration{5*time.Second + extproc.TimerMargin}; !slices.Equal(second.Overrides, want) {
		t.Errorf("override_message_timeout sent %v, want %v (the wait plus the margin), once", second.Overrides, want)
	}
	if first.Overrides != nil {
		t.Errorf("the request granted at once sent override_message_timeout %v, want none", first.Overrides)
	}
	if got := e.Used(t, user); got != 1 {
		t.Errorf("user holds %d slots, want the waiter's 1", got)
	}
	second.Close()
	e.AwaitUsed(t, user, 0, 2*time.Second)
}

// A wait that runs out (capped by the plan's maxWait: 300ms of the 5s) is
// the 429 of the limit, saying how long the request waited in line.
func TestAWaitThatRunsOutIsA429(t *testing.T) {
	e := newWaitEnv(t, 5*time.Second, time.Minute, 0)
	user := newUser()
	grant(t, e.open(t), user, "queued-short")
	st := e.open(t)
	resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "queued-short"), false)
	if err != nil {
		t.Fatal(err)
	}
	ir, body := immediate(t, resp)
	if ir.GetStatus().GetCode() != 429 || body.Error.Code != "stream_limit_reached" || !strings.Contains(body.Error.Message, "waited in line") {
		t.Errorf("got %d %s (%q), want 429 stream_limit_reached saying the request waited in line", ir.GetStatus().GetCode(), body.Error.Code, body.Error.Message)
	}
	if want := []time.Duration{300*time.Millisecond + extproc.TimerMargin}; !slices.Equal(st.Overrides, want) {
		t.Errorf("override_message_timeout sent %v, want %v (the plan's maxWait plus the margin)", st.Overrides, want)
	}
	e.AwaitQueue(t, user, 0, time.Second)
}

// Envoy ending the stream while its request waits, by a reset (the
// client went away) or by closing it (as it does when it gives up on a
// message timeout), takes the request out of the queue at once. Without
// max_message_timeout Envoy ignores the extension and gives up after
// message_timeout: the interplay docs/envoy.md warns about.
func TestEnvoyEndingTheStreamEndsTheWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(st *envoytest.Stream)
	}{
		{"reset", (*envoytest.Stream).Reset},
		{"half-close", func(st *envoytest.Stream) { _ = st.CloseSend() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newWaitEnv(t, 5*time.Second, time.Minute, 0)
			user := newUser()
			grant(t, e.open(t), user, "queued")
			st := e.open(t)
			answer := requestAsync(st, user, "queued")
			e.AwaitQueue(t, user, 1, 5*time.Second)
			tc.end(st)
			e.AwaitQueue(t, user, 0, time.Second)
			if a := answerWithin(t, answer, 2*time.Second, "the request whose stream ended"); a.err == nil {
				t.Errorf("the request whose stream ended was answered %v, want no answer", a.resp)
			} else if tc.name == "half-close" && !errors.Is(a.err, io.EOF) {
				t.Errorf("after the half-close: %v, want the stream closed with OK", a.err)
			}
		})
	}

	t.Run("no max_message_timeout", func(t *testing.T) {
		e := newWaitEnv(t, time.Second, 0, 0)
		user := newUser()
		grant(t, e.open(t), user, "queued")
		st := e.open(t)
		_, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "queued"), false)
		if !errors.Is(err, envoytest.ErrTimeout) {
			t.Fatalf("a wait past message_timeout without max_message_timeout: %v, want Envoy's message timeout", err)
		}
		st.Close() // Envoy closes the stream on a message timeout
		e.AwaitQueue(t, user, 0, time.Second)
		if got := e.Used(t, user); got != 1 {
			t.Errorf("user holds %d slots, want the first stream's 1", got)
		}
	})
}

// The drain's grace running out ends the waits with 503 limiter_unavailable
// (retry elsewhere), as the streams still open are released. The wait is
// counted failed, the limiter giving up on it, not cancelled: Envoy did
// not leave.
func TestTheDrainEndsWaits(t *testing.T) {
	e := newWaitEnv(t, 5*time.Second, time.Minute, 300*time.Millisecond)
	user := newUser()
	holder := e.open(t)
	grant(t, holder, user, "queued")
	st := e.open(t)
	answer := requestAsync(st, user, "queued")
	e.AwaitQueue(t, user, 1, 5*time.Second)
	e.stop()
	a := answerWithin(t, answer, 5*time.Second, "the waiting request at the end of the grace")
	if a.err != nil {
		t.Fatal(a.err)
	}
	ir, body := immediate(t, a.resp)
	if ir.GetStatus().GetCode() != 503 || body.Error.Code != "limiter_unavailable" || !strings.Contains(body.Error.Message, "shutting down") {
		t.Errorf("got %d %s (%q), want 503 limiter_unavailable saying the limiter is shutting down", ir.GetStatus().GetCode(), body.Error.Code, body.Error.Message)
	}
	for outcome, want := range map[string]string{"failed": "1", "cancelled": "0"} {
		series := `limiter_acquire_wait_total{outcome="` + outcome + `",plan="queued"}`
		if got := e.Metric(t, series); got != want && (want != "0" || got != "") {
			t.Errorf("%s: got %q, want %s", series, got, want)
		}
	}
	e.AwaitQueue(t, user, 0, time.Second)
	e.AwaitUsed(t, user, 0, 2*time.Second)
	select {
	case err := <-e.done:
		e.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the grace")
	}
}
