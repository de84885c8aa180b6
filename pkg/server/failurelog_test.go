package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
)

// outageServer is a Server whose Redis never answers (50ms per call), with
// its log in a sink, and the API served in-process.
func outageServer(t *testing.T) (*server.Server, *logSink) {
	t.Helper()
	var sink logSink
	logger := slog.New(slog.NewJSONHandler(&sink, nil))
	lim := limitertest.New(t, limitertest.Options{
		Redis:   cluster.Options{Addrs: []string{testenv.BlackHole(t)}, Timeout: 50 * time.Millisecond},
		Limiter: limiter.Options{Logger: logger},
		NoWait:  true,
	}).Limiter
	return server.New(lim, server.Options{Logger: logger}), &sink
}

// failClosed sends n acquires of the Closed plan at once; each must be 503.
func failClosed(t *testing.T, a *api, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			r := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: newUser(t), Plan: "closed"})
			if r.status != http.StatusServiceUnavailable {
				t.Errorf("acquire of a Closed plan during the outage: %d %s, want 503", r.status, r.body)
			}
		})
	}
	wg.Wait()
}

// linesOf returns the JSON log records whose msg is msg.
func linesOf(t *testing.T, sink *logSink, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(sink.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestFailedRequestsLogBounded: during an outage every request of a Closed
// plan fails the same way; the log says so once, not once per request.
func TestFailedRequestsLogBounded(t *testing.T) {
	t.Parallel()
	srv, sink := outageServer(t)
	a := newAPIOf(t, srv)
	const n = 200
	failClosed(t, a, n)
	if got := linesOf(t, sink, "request failed"); len(got) > 1 {
		t.Errorf("%d failed requests logged %d \"request failed\" lines, want at most 1", n, len(got))
	}
}

// TestFailedRequestsLogTheSuppressedCount: the first line after the quiet
// interval says how many failures were left out since the last one.
func TestFailedRequestsLogTheSuppressedCount(t *testing.T) {
	t.Parallel()
	const n = 50
	// The n requests must fit in one interval; on a machine too loaded for
	// that, the interval is lengthened once.
	var a *api
	var sink *logSink
	for _, every := range []time.Duration{2 * time.Second, 6 * time.Second} {
		var srv *server.Server
		srv, sink = outageServer(t)
		server.SetFailureLogEvery(srv, every)
		a = newAPIOf(t, srv)
		start := time.Now()
		failClosed(t, a, n)
		if took := time.Since(start); took >= every {
			if every < 6*time.Second {
				t.Logf("the %d requests took %v, longer than the interval %v; trying a longer one", n, took, every)
				continue
			}
			t.Fatalf("the %d requests took %v, longer than the interval %v: the count would span two lines", n, took, every)
		}
		// The interval runs from the first line, logged at some point
		// between start and now: one whole interval from now is past it.
		time.Sleep(every + 100*time.Millisecond)
		break
	}
	failClosed(t, a, 1)

	got := linesOf(t, sink, "request failed")
	if len(got) != 2 {
		t.Fatalf("%d failures over two intervals logged %d lines, want 2:\n%s", n+1, len(got), sink.String())
	}
	if _, ok := got[0]["similar_since_last_line"]; ok {
		t.Errorf("first line %v carries a suppressed count, want none", got[0])
	}
	if c := got[1]["similar_since_last_line"]; c != float64(n-1) {
		t.Errorf("second line: similar_since_last_line = %v, want %d", c, n-1)
	}
	if got[1]["level"] != "WARN" || got[1]["status"] != float64(http.StatusServiceUnavailable) {
		t.Errorf("second line %v, want a WARN with status 503", got[1])
	}
}

// TestAClientThatLeavesIsNoFailure: an acquire waiting for a slot whose
// client goes away ends as the client's doing, not the limiter's: no
// "request failed" warning (of an outage) in the log, and no 503.
func TestAClientThatLeavesIsNoFailure(t *testing.T) {
	t.Parallel()
	var sink logSink
	logger := slog.New(slog.NewJSONHandler(&sink, nil))
	lim := limitertest.New(t, limitertest.Options{Tiers: waitTiers(), Limiter: limiter.Options{Logger: logger}}).Limiter
	srv := httptest.NewServer(server.New(lim, server.Options{Logger: logger}).Handler())
	t.Cleanup(srv.Close)
	a := &api{url: srv.URL, client: &http.Client{Timeout: 10 * time.Second}}
	user := newUser(t)
	if r := a.post(t, httpapi.PathAcquire, map[string]any{"user_id": user, "plan": "wait"}); r.status != http.StatusOK {
		t.Fatalf("the user's one slot: %d %s", r.status, r.body)
	}
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"user_id":%q,"plan":"wait","wait_ms":5000}`, user)
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", httpapi.PathAcquire, len(body), body)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if got, err := lim.Slots(context.Background(), user); err == nil && len(got.Queue) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the acquire never waited")
		}
	}
	conn.Close()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if got, err := lim.Slots(context.Background(), user); err == nil && len(got.Queue) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the acquire still waits 2s after its client left")
		}
	}
	time.Sleep(100 * time.Millisecond) // for the handler to answer
	if log := sink.String(); strings.Contains(log, "request failed") {
		t.Errorf("a client that left is logged as a failure of the limiter: %s", log)
	}
}
