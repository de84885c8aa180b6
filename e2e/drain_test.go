package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

// TestSIGTERMDrainsInFlightRequests: on SIGTERM readiness turns false, the
// listener stops accepting, requests in flight complete, and the process
// exits 0.
func TestSIGTERMDrainsInFlightRequests(t *testing.T) {
	redis := testenv.StartRedis(t)
	slow := testenv.StartProxy(t, redis.Addr())
	config := `redis:
  addrs: ["` + slow.Addr() + `"]
  keyPrefix: "e2e-drain:"
  timeout: 9s
http:
  shutdownGrace: 20s
tiers:
  static:
    - plan: paid
      maxConcurrentStreams: 100
      failureMode: Closed
`
	proc := servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	user := "drain-" + randomID()
	if status, res := acquire(t, proc.API, user, "paid"); status != http.StatusOK || res.Degraded {
		t.Fatalf("warm-up acquire: %d %+v", status, res)
	}

	// Every Redis round trip now takes over a second: requests are in flight
	// when SIGTERM arrives.
	slow.SetLatency(400 * time.Millisecond)
	const inFlight = 5
	var wg sync.WaitGroup
	var finished atomic.Int32
	statuses := make([]int, inFlight)
	degraded := make([]bool, inFlight)
	for i := range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res httpapi.AcquireResponse
			statuses[i], res = acquire(t, proc.API, user, "paid")
			degraded[i] = res.Degraded
			finished.Add(1)
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}

	sawNotReady := false
	for range 200 {
		status, body := servetest.Get(proc.Ops + "/readyz")
		if status == http.StatusServiceUnavailable {
			sawNotReady = true
			t.Logf("readyz during drain: %d %s", status, body)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !sawNotReady {
		t.Error("readyz never answered 503 between SIGTERM and exit")
	}
	// Readiness turns false just before the listener closes, so a new
	// connection may still land in that instant; it must be refused soon
	// after, while the requests in flight are still being served.
	refused := refusedWithin(500*time.Millisecond, func() (*http.Response, error) {
		return http.Post(proc.API+httpapi.PathTiers, "application/json", nil)
	})
	if !refused {
		t.Error("the API listener still accepted new connections 500ms into the drain")
	}
	if n := finished.Load(); n == inFlight {
		t.Errorf("all %d requests in flight had ended before the listener refused a connection; the drain was not observed", n)
	}

	wg.Wait()
	for i, status := range statuses {
		if status != http.StatusOK || degraded[i] {
			t.Errorf("in-flight request %d ended with %d (degraded %v), want 200 from Redis", i, status, degraded[i])
		}
	}
	code, err := proc.Wait(25 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("exit after SIGTERM = %d, %v; want 0", code, err)
	}
}

// refusedWithin reports whether connect fails (the listener has closed)
// within d, trying every 5ms.
func refusedWithin(d time.Duration, connect func() (*http.Response, error)) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		resp, err := connect()
		if err != nil {
			return true
		}
		resp.Body.Close()
	}
	return false
}

// TestSIGTERMEndsTheWaitsAtOnce: an acquire waiting for a slot (wait_ms)
// when serve gets SIGTERM is answered 503 limiter_unavailable at once,
// saying the replica is shutting down (its client retries on another),
// not cut with no answer at the grace's end.
func TestSIGTERMEndsTheWaitsAtOnce(t *testing.T) {
	t.Parallel()
	config := serveConfig([]string{testenv.Redis(t)}, "e2e-drain-wait-"+randomID()+":", waitTiers) + "http:\n  shutdownGrace: 8s\n"
	proc := servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	user := "drain-wait-" + randomID()
	if a := post(context.Background(), proc.API+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "solo"}); a.status != http.StatusOK {
		t.Fatalf("the first acquire: %d %s", a.status, a.body)
	}
	waiting := waitingAcquire(context.Background(), proc.API, user, "solo", "", 20_000)
	time.Sleep(500 * time.Millisecond) // in the queue
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	select {
	case a := <-waiting:
		var e httpapi.ErrorResponse
		_ = json.Unmarshal(a.body, &e)
		if a.status != http.StatusServiceUnavailable || e.Error.Code != httpapi.CodeUnavailable || !strings.Contains(e.Error.Message, "shutting down") {
			t.Errorf("the waiting acquire after SIGTERM: %d %s; want 503 limiter_unavailable saying the replica is shutting down", a.status, a.body)
		}
		if took := a.at.Sub(sent); took > 2*time.Second {
			t.Errorf("the waiting acquire was answered %v after SIGTERM; want at once, not at the 8s grace", took)
		}
	case <-time.After(6 * time.Second):
		t.Fatal("the waiting acquire was not answered within 6s of SIGTERM (grace 8s)")
	}
	if _, err := proc.Wait(10 * time.Second); err != nil {
		t.Fatalf("serve did not exit: %v", err)
	}
}

// awaitDraining waits until proc's /readyz says it is draining, after
// SIGTERM.
func awaitDraining(t *testing.T, proc *servetest.Process) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if status, _ := servetest.Get(proc.Ops + "/readyz"); status == http.StatusServiceUnavailable {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz did not turn 503 within 3s of SIGTERM\n%s", proc.Output())
		}
	}
}

// sendInTwo starts a POST of body to url whose first half is sent now
// and the rest once the returned func is called; the answer arrives on
// the channel.
func sendInTwo(t *testing.T, url, body string, header http.Header) (rest func(), out <-chan answer) {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, url, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	req.Header = header
	req.Header.Set("Content-Type", "application/json")
	ch := make(chan answer, 1)
	go func() {
		resp, err := waitClient.Do(req)
		if err != nil {
			ch <- answer{err: err, at: time.Now()}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- answer{status: resp.StatusCode, header: resp.Header, body: b, err: err, at: time.Now()}
	}()
	half := len(body) / 2
	if _, err := pw.Write([]byte(body[:half])); err != nil {
		t.Fatal(err)
	}
	return func() {
		_, _ = pw.Write([]byte(body[half:]))
		pw.Close()
	}, ch
}

// TestSIGTERMGrantsAnInFlightAcquireThatNeedNotWait: an acquire with
// wait_ms accepted before SIGTERM, its body arriving during the drain,
// whose user has a slot free, is granted: the drain ends only the
// acquires that wait.
func TestSIGTERMGrantsAnInFlightAcquireThatNeedNotWait(t *testing.T) {
	t.Parallel()
	config := serveConfig([]string{testenv.Redis(t)}, "e2e-drain-inflight-"+randomID()+":", waitTiers) + "http:\n  shutdownGrace: 8s\n"
	proc := servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	user := "drain-inflight-" + randomID()
	rest, out := sendInTwo(t, proc.API+httpapi.PathAcquire, `{"user_id":"`+user+`","plan":"solo","wait_ms":5000}`, http.Header{})
	time.Sleep(200 * time.Millisecond) // the server has the headers and reads the body
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	awaitDraining(t, proc)
	rest()
	a := within(t, out, 5*time.Second, "the in-flight acquire's answer")
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(string(a.body), `"granted":true`) {
		t.Errorf("the in-flight acquire (wait_ms 5000) of a user with a slot free, its body completed during the drain: %d %s (%v); want 200 granted", a.status, a.body, a.err)
	}
	if _, err := proc.Wait(10 * time.Second); err != nil {
		t.Fatalf("serve did not exit: %v", err)
	}
}
