package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// errorCode is the code of a proxy's JSON error answer.
func (a answer) errorCode() string {
	var e proxyError
	_ = json.Unmarshal(a.body, &e)
	return e.Error.Code
}

// TestProxyStreamCutAtTheGraceBeforeItsResponseIsAnswered503: a stream
// whose upstream has sent nothing yet (a long prefill) when the grace
// ends is cut, and its client, to whom nothing was written, is told so:
// 503 limiter_unavailable with Retry-After, its stream id beside it, not
// an empty 200 it would take for a completion.
func TestProxyStreamCutAtTheGraceBeforeItsResponseIsAnswered503(t *testing.T) {
	e := startProxy(t, "http:\n  shutdownGrace: 1s\n")
	a := e.chatAsync("cut-prefill-"+randomID(), "paid", "prefill")
	within(t, e.llm.prefill, 5*time.Second, "the upstream receiving the request")
	if err := e.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	got := within(t, a, 10*time.Second, "the cut request's answer")
	if got.err != nil || got.status != http.StatusServiceUnavailable || got.errorCode() != "limiter_unavailable" ||
		got.header.Get("Retry-After") == "" || got.header.Get("X-Limiter-Stream-Id") == "" {
		t.Errorf("the stream cut at the grace before its response: %d %q %v (%v); want 503 limiter_unavailable with Retry-After and X-Limiter-Stream-Id",
			got.status, got.body, got.header, got.err)
	}
	if _, err := e.proc.Wait(10 * time.Second); err != nil {
		t.Fatalf("the proxy did not exit: %v", err)
	}
	if out := e.proc.Output(); !strings.Contains(out, "end=shutdown") {
		t.Errorf("the proxy's log names no stream ended by the shutdown:\n%s", out)
	}
}

// TestProxySlotLostBeforeItsResponseIsAnswered503SlotLost: a stream whose
// slot support releases while its upstream has sent nothing yet is cut,
// and answered 503 slot_lost (as the ext_proc server answers it), counted
// lost, not an upstream error, and not an empty 200.
func TestProxySlotLostBeforeItsResponseIsAnswered503SlotLost(t *testing.T) {
	e := startProxy(t, "")
	user := "lost-prefill-" + randomID()
	a := e.chatAsync(user, "paid", "prefill")
	within(t, e.llm.prefill, 5*time.Second, "the upstream receiving the request")
	slots, err := e.lim.Slots(context.Background(), user)
	if err != nil || len(slots.Slots) != 1 {
		t.Fatalf("slots of %s: %+v (%v); want one", user, slots, err)
	}
	if _, err := e.lim.Release(context.Background(), user, slots.Slots[0].StreamID); err != nil {
		t.Fatal(err)
	}
	got := within(t, a, 10*time.Second, "the cut request's answer")
	if got.err != nil || got.status != http.StatusServiceUnavailable || got.errorCode() != "slot_lost" ||
		got.header.Get("X-Limiter-Stream-Id") != slots.Slots[0].StreamID {
		t.Errorf("the stream whose slot was released before its response: %d %q %v (%v); want 503 slot_lost naming stream %s",
			got.status, got.body, got.header, got.err, slots.Slots[0].StreamID)
	}
	// The stream's end is recorded as its handler returns, beside the
	// answer's arrival.
	for deadline := time.Now().Add(2 * time.Second); metricValue(t, e.proc, `limiter_streams_held_total{end="lost",mode="proxy"}`) != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("limiter_streams_held_total{end=\"lost\"} is not 1 2s after the answer")
		}
	}
	for series, want := range map[string]float64{
		`limiter_streams_held_total{end="upstream_error",mode="proxy"}`: 0,
		`limiter_proxy_upstream_errors_total{phase="response"}`:         0,
	} {
		if v := metricValue(t, e.proc, series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
}

// TestProxySIGTERMStreamsAnInFlightRequestThatNeedNotWait: with --wait, a
// request accepted before SIGTERM, its body arriving during the drain,
// whose user has a slot free, streams: the drain ends only the requests
// that wait.
func TestProxySIGTERMStreamsAnInFlightRequestThatNeedNotWait(t *testing.T) {
	e := startProxy(t, "http:\n  shutdownGrace: 5s\n", "--wait", "10s")
	rest, out := sendInTwo(t, e.proc.API+"/v1/chat/completions", `{"model":"fast","stream":true}`,
		http.Header{"X-User-Id": {"drain-inflight-" + randomID()}, "X-Plan": {"queued"}})
	time.Sleep(200 * time.Millisecond) // the proxy has the headers and reads the body
	if err := e.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	awaitDraining(t, e.proc)
	rest()
	a := within(t, out, 5*time.Second, "the in-flight request's answer")
	if a.err != nil || a.status != http.StatusOK || !strings.HasSuffix(strings.TrimSpace(string(a.body)), "data: [DONE]") {
		t.Errorf("the in-flight request of a user with a slot free, its body completed during the drain: %d %q (%v); want 200 and its whole stream", a.status, a.body, a.err)
	}
	if _, err := e.proc.Wait(10 * time.Second); err != nil {
		t.Fatalf("the proxy did not exit: %v", err)
	}
}
