package e2e

import (
	"context"
	"encoding/json"
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
