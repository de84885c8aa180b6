package server_test

import (
	"bytes"
	"context"
	"io"
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
// under the caller's stream_id that reaches Redis but whose answer comes
// after the deadline may have taken the slot. The 503 names the stream
// id, so the caller can retry under it (granted, not counted twice) or
// release it, instead of being refused for a whole TTL.
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
		id := "late-" + user
		r := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "closed", StreamID: id})
		e = wantError(t, r, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
		if r.header.Get("Retry-After") == "" {
			t.Errorf("Retry-After of the 503: got none, want one")
		}
		if e.StreamID != id {
			t.Fatalf("error.stream_id of the 503: got %q, want %q, the caller's", e.StreamID, id)
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

// TestAPIAcquireWithoutStreamIDFreesTheSlotItsLostAnswerTook: an acquire
// sent without stream_id whose answer reaches no one (its client left
// before it, or Redis answered after the deadline: a 503) may have taken
// the slot under the id made for it. No one else knows that id, so it is
// released, as the limiter releases an id of its own making, rather than
// leave the user a slot short for its TTL. The 503 names no stream_id to
// retry under: the slot is not the caller's to keep.
func TestAPIAcquireWithoutStreamIDFreesTheSlotItsLostAnswerTook(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		plan string
		// leave: the client leaves as soon as the acquire has reached
		// Redis, long before its answer is back.
		leave bool
		// timeout is the per-call deadline, latency the proxy's delay of
		// each call and answer: the acquire reaches Redis within the
		// deadline (rueidis sends no call whose deadline has passed), and
		// a release sent after it reaches Redis after it.
		timeout, latency time.Duration
	}{
		{name: "its client leaves before the answer", plan: "one", leave: true, timeout: 5 * time.Second, latency: 500 * time.Millisecond},
		{name: "its answer comes after the deadline (503)", plan: "closed", timeout: 500 * time.Millisecond, latency: 750 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A Redis of its own behind a proxy, which holds the calls back
			// and says when the acquire's has reached Redis.
			redis := testenv.StartRedis(t).Addr()
			slow := testenv.StartProxy(t, redis)
			stack := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{slow.Addr()}, Timeout: tc.timeout}})
			a := newAPI(t, stack.Limiter)
			// Load the scripts and open the connection while the link is fast.
			warm := newUser(t)
			g := decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: warm, Plan: tc.plan}), http.StatusOK)
			decode[httpapi.ReleaseResponse](t, a.post(t, httpapi.PathRelease, httpapi.ReleaseRequest{UserID: warm, StreamID: g.StreamID}), http.StatusOK)
			direct := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{redis}}, Limiter: limiter.Options{Keys: stack.Keys}}).Limiter

			user := newUser(t)
			sent := slow.ScriptCalls()
			slow.SetLatency(tc.latency)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			body := mustJSON(t, httpapi.AcquireRequest{UserID: user, Plan: tc.plan})
			answered := make(chan reply, 1)
			go func() {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url+httpapi.PathAcquire, bytes.NewReader(body))
				if err != nil {
					answered <- reply{}
					return
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := a.client.Do(req)
				if err != nil {
					answered <- reply{} // the client left
					return
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				answered <- reply{status: resp.StatusCode, header: resp.Header, body: b}
			}()
			for deadline := time.Now().Add(5 * time.Second); slow.ScriptCalls() == sent; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					// The client gave up the connection with the call still
					// held back: it never ran, and took no slot.
					t.Log("the acquire's script did not reach Redis within 5s: it took no slot")
					break
				}
			}
			// The acquire has run in Redis, or will before anything sent
			// after it: it took the slot.
			if tc.leave {
				cancel()
				if r := <-answered; r.status != 0 {
					t.Fatalf("the client left before the answer, got %d %s", r.status, r.body)
				}
			} else {
				e := wantError(t, <-answered, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
				if e.StreamID != "" {
					t.Errorf("error.stream_id of the 503: got %q, want none (the slot of the id made for it is released)", e.StreamID)
				}
			}
			slow.SetLatency(0)
			var got limiter.UserSlots
			var err error
			for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if got, err = direct.Slots(context.Background(), user); err == nil && got.Used == 0 {
					return
				}
			}
			t.Errorf("slots of the user 3s after the unanswered acquire: got %d (%+v, %v), want 0: "+
				"a slot under an id no one was told holds the user's place for its TTL (10s)", got.Used, got.Slots, err)
		})
	}
}
