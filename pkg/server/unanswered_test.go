package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
)

// TestAPIAcquireWhoseAnswerIsLateNamesItsStreamID: a Closed-plan acquire
// that reaches Redis but whose answer comes after the deadline may have
// taken the slot. The 503 names the stream id the server chose, so the
// caller can retry under it (granted, not counted twice) or release it,
// instead of being refused for a whole TTL.
func TestAPIAcquireWhoseAnswerIsLateNamesItsStreamID(t *testing.T) {
	t.Parallel()
	// A Redis of its own: a test flushing the shared one's scripts would
	// make the late EVALSHA fail instead of run.
	redis := testenv.StartRedis(t).Addr()
	slow := testenv.StartProxy(t, redis)
	stack := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{slow.Addr()}}})
	a := newAPI(t, stack.Limiter)
	// Load the script and open the connection while the link is fast.
	decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: newUser(t), Plan: "closed"}), http.StatusOK)

	direct := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{redis}}, Limiter: limiter.Options{Keys: stack.Keys}}).Limiter
	// A late acquire may also never reach Redis (a loaded machine can hold
	// the write past the deadline): both are what a 503 allows, but only
	// one that ran shows the retry counting once, so the test tries again,
	// with a new user, up to three times.
	var user string
	var e httpapi.Error
	for attempt := 1; ; attempt++ {
		user = newUser(t)
		for range 2 {
			decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "closed"}), http.StatusOK)
		}
		slow.SetLatency(400 * time.Millisecond) // > the 250ms deadline
		r := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "closed"})
		e = wantError(t, r, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
		if r.header.Get("Retry-After") == "" {
			t.Errorf("Retry-After of the 503: got none, want one")
		}
		if len(e.StreamID) != 32 {
			t.Fatalf("error.stream_id of the 503: got %q, want the 32-character id the server chose", e.StreamID)
		}
		slow.SetLatency(0)
		landed := false
		var got limiter.UserSlots
		var err error
		for deadline := time.Now().Add(3 * time.Second); !landed && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			got, err = direct.Slots(context.Background(), user)
			landed = err == nil && got.Used == 3
		}
		if landed {
			break
		}
		if attempt == 3 {
			t.Fatalf("slots of the user 3s after the late acquire, 3 times: last got %+v, %v; want 3 (it reached Redis and ran)", got, err)
		}
		t.Logf("attempt %d: the late acquire never reached Redis (%+v, %v); trying again", attempt, got, err)
	}

	// The late acquire took the user's last slot: only its id gets it.
	r := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "closed", StreamID: newUser(t)})
	wantError(t, r, http.StatusTooManyRequests, httpapi.CodeStreamLimitReached)
	got := decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "closed", StreamID: e.StreamID}), http.StatusOK)
	if !got.Granted || got.Used != 3 || got.StreamID != e.StreamID {
		t.Errorf("retry under error.stream_id: got %+v, want granted %s with used 3 (the slot the late acquire took)", got, e.StreamID)
	}
}
