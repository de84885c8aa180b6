package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// chatAsync sends a streaming chat completion through the proxy as user
// on plan from a goroutine of its own, and returns where the status and
// whole body arrive.
func (e *proxyEnv) chatAsync(user, plan, model string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		req, err := http.NewRequest("POST", e.proc.API+"/v1/chat/completions",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, model)))
		if err != nil {
			out <- answer{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User-Id", user)
		req.Header.Set("X-Plan", plan)
		resp, err := waitClient.Do(req)
		if err != nil {
			out <- answer{err: err, at: time.Now()}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		out <- answer{status: resp.StatusCode, header: resp.Header, body: body, err: err, at: time.Now()}
	}()
	return out
}

// awaitQueued waits until user's queue holds n requests.
func (e *proxyEnv) awaitQueued(t *testing.T, user string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, err := e.lim.Slots(context.Background(), user)
		if err == nil && len(got.Queue) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %s: %+v, %v; want %d waiting\n%s", user, got.Queue, err, n, e.proc.Output())
		}
	}
}

// With proxy.wait, a request of a user whose one stream is open waits in
// line, through pkg/hold, and streams as soon as the first one ends; a
// plan without maxWait still refuses at once, and a wait that runs out is
// the usual 429 with Retry-After.
func TestProxyHoldsARequestInTheQueue(t *testing.T) {
	e := startProxy(t, "", "--wait", "10s")
	user := "queue-" + randomID()
	first := e.chat(t, context.Background(), user, "queued", "hold", nil)
	defer first.Body.Close()
	firstData, _ := sseData(first.Body)
	within(t, firstData, 5*time.Second, "the first stream's first chunk")

	second := e.chatAsync(user, "queued", "fast")
	e.awaitQueued(t, user, 1)
	if n := e.llm.requests.Load(); n != 1 {
		t.Fatalf("the upstream got %d requests while the second one waited, want only the first's", n)
	}
	released := time.Now()
	e.llm.Release()
	for range firstData {
	}
	a := within(t, second, 5*time.Second, "the waiting request's answer")
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(string(a.body), "data: [DONE]") {
		t.Fatalf("the waiting request: %d %q %v, want the whole stream", a.status, a.body, a.err)
	}
	t.Logf("the waiting request streamed %v after the first stream's upstream was released", a.at.Sub(released).Round(time.Millisecond))

	// A plan without maxWait refuses at once, proxy.wait or not.
	other := "nowait-" + randomID()
	held := e.chat(t, context.Background(), other, "free", "hold", nil)
	defer held.Body.Close()
	heldData, _ := sseData(held.Body)
	within(t, heldData, 5*time.Second, "the free stream's first chunk")
	start := time.Now()
	refused := within(t, e.chatAsync(other, "free", "fast"), 5*time.Second, "the free plan's refusal")
	if refused.status != http.StatusTooManyRequests || time.Since(start) > time.Second {
		t.Errorf("a second stream on free: %d after %v, want 429 at once", refused.status, time.Since(start))
	}

	// A wait that runs out: the plan's 1s, not proxy.wait's 10s.
	short := "short-" + randomID()
	heldShort := e.chat(t, context.Background(), short, "queued-short", "hold", nil)
	defer heldShort.Body.Close()
	within(t, func() <-chan string { d, _ := sseData(heldShort.Body); return d }(), 5*time.Second, "the queued-short stream's first chunk")
	start = time.Now()
	timedOut := within(t, e.chatAsync(short, "queued-short", "fast"), 5*time.Second, "the queued-short plan's 429")
	if timedOut.status != http.StatusTooManyRequests || time.Since(start) < time.Second || !strings.Contains(string(timedOut.body), "waited in line") {
		t.Errorf("a second stream on queued-short: %d %s after %v, want 429 once its 1s wait ran out", timedOut.status, timedOut.body, time.Since(start))
	}
	e.llm.Release()
}

// SIGTERM ends the waits with a 503 at once (docs/proxy.md), not at the
// grace's end, while the stream held goes on through the grace. The wait
// is counted failed, the limiter giving up on it, not cancelled: the
// client did not leave (docs/observability.md).
func TestProxySIGTERMEndsTheWaits(t *testing.T) {
	e := startProxy(t, "http:\n  shutdownGrace: 5s\n", "--wait", "10s")
	user := "term-queue-" + randomID()
	first := e.chat(t, context.Background(), user, "queued", "slow:10:300", nil)
	defer first.Body.Close()
	firstData, _ := sseData(first.Body)
	within(t, firstData, 5*time.Second, "the first stream's first chunk")
	second := e.chatAsync(user, "queued", "fast")
	e.awaitQueued(t, user, 1)

	if err := e.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	a := within(t, second, 5*time.Second, "the waiting request's answer")
	if a.status != http.StatusServiceUnavailable || a.at.Sub(sent) > 2*time.Second {
		t.Errorf("the waiting request after SIGTERM: %d %q after %v; want 503 at once, not at the 5s grace", a.status, a.body, a.at.Sub(sent).Round(time.Millisecond))
	}
	// Scraped during the grace, the stream held still running.
	for series, want := range map[string]float64{
		`limiter_acquire_wait_total{outcome="failed",plan="queued"}`:       1,
		`limiter_acquire_wait_total{outcome="cancelled",plan="queued"}`:    0,
		`limiter_streams_refused_total{mode="proxy",reason="unavailable"}`: 1,
	} {
		if got := metricValue(t, e.proc, series); got != want {
			t.Errorf("after SIGTERM ended the wait: %s = %v, want %v", series, got, want)
		}
	}
	var got []string
	for data := range firstData {
		got = append(got, data)
	}
	if len(got) == 0 || got[len(got)-1] != "[DONE]" {
		t.Errorf("the stream held through the grace got %d events; want it whole, ending [DONE]", len(got))
	}
	if _, err := e.proc.Wait(10 * time.Second); err != nil {
		t.Fatalf("the proxy did not exit: %v", err)
	}
}
