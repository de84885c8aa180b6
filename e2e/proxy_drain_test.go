package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
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

// TestProxyShutdownReleaseIsBoundedWhenRedisHangs: with Redis hung when
// the grace ends, every stream still open is cut at once, the releases
// give up at the 5s bound (hold.CloseBound), so the proxy exits within
// grace + 5s, and its last words count as released only the slots Redis
// freed, the rest left to expire by their TTL.
func TestProxyShutdownReleaseIsBoundedWhenRedisHangs(t *testing.T) {
	t.Parallel()
	const (
		n     = 80 // five waves of ReleaseConcurrency (16)
		grace = time.Second
	)
	hole := testenv.StartProxy(t, testenv.Redis(t))
	e := startProxyOn(t, hole.Addr(), "http:\n  shutdownGrace: 1s\n") // redis.timeout 2s: the waves would take 10s
	go func() {
		for range e.llm.first { // room for every stream's first chunk
		}
	}()
	users := make([]string, n)
	opened := make(chan error, n)
	cut := make(chan time.Time, n)
	for i := range users {
		users[i] = fmt.Sprintf("hang-%d-%s", i, randomID())
		go func() {
			req, _ := http.NewRequest(http.MethodPost, e.proc.API+"/v1/chat/completions", strings.NewReader(`{"model":"hold","stream":true}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-User-Id", users[i])
			req.Header.Set("X-Plan", "paid")
			resp, err := http.DefaultClient.Do(req)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			opened <- err
			if err != nil {
				return
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			cut <- time.Now()
		}()
	}
	for range n {
		if err := within(t, opened, 10*time.Second, "a stream's response"); err != nil {
			t.Fatalf("a stream through the proxy: %v", err)
		}
	}
	hole.BlackHole() // every call now runs to redis.timeout

	if err := e.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	code, err := e.proc.Wait(20 * time.Second)
	if err != nil {
		t.Fatalf("the proxy did not exit within 20s of SIGTERM: %v", err)
	}
	// The drain, from the proxy's own lines: its exit comes after the
	// Redis client's close, which gives up on each hung connection
	// separately (the chart's terminationGraceExtraSeconds covers it).
	if took := logGap(t, e.proc.Output(), "msg=draining", "msg=stopped"); took > grace+5*time.Second+500*time.Millisecond {
		t.Errorf("the proxy stopped (exit %d) %v after it began draining, with Redis hung; want within grace %v + the 5s release bound (+0.5s)",
			code, took.Round(time.Millisecond), grace)
	}
	for i := range n {
		at := within(t, cut, 5*time.Second, "a stream's cut")
		if d := at.Sub(sent); d > grace+time.Second {
			t.Errorf("stream %d of %d was cut %v after SIGTERM; want all at the grace's end (%v)", i+1, n, d.Round(time.Millisecond), grace)
			break
		}
	}

	still := 0
	for _, u := range users {
		still += e.used(t, u)
	}
	m := regexp.MustCompile(`msg="cut the streams still running at shutdown[^"]*" mode=proxy streams=(\d+) released=(\d+)(?: left_to_expire=(\d+))?`).
		FindStringSubmatch(e.proc.Output())
	if m == nil {
		t.Fatalf("the proxy's log says nothing of the streams it cut:\n%s", e.proc.Output())
	}
	streams, _ := strconv.Atoi(m[1])
	released, _ := strconv.Atoi(m[2])
	left, _ := strconv.Atoi(m[3])
	if streams != n || released != n-still || left != still {
		t.Errorf("the proxy logged %d streams cut, %d released, %d left to expire; Redis still holds %d of the %d slots", streams, released, left, still, n)
	}
}

// logGap is the time between the first log line of out holding from and
// the first one after it holding to, by their time= stamps.
func logGap(t *testing.T, out, from, to string) time.Duration {
	t.Helper()
	stamp := regexp.MustCompile(`time=(\S+)`)
	var start time.Time
	for _, line := range strings.Split(out, "\n") {
		m := stamp.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		switch {
		case start.IsZero() && strings.Contains(line, from):
			start = at
		case !start.IsZero() && strings.Contains(line, to):
			return at.Sub(start)
		}
	}
	t.Fatalf("no line %q followed by one %q in:\n%s", from, to, out)
	return 0
}
