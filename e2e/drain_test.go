package e2e

import (
	"net/http"
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
