package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/telemetry"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel/metric/noop"
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
				// The link stays slow: the acquire's answer, already on
				// its way back, reaches the server long after it has seen
				// the client go. (Made fast now, the answer could come
				// back before the server has noticed, and be written to
				// the gone client as a grant: a race no server can see.)
				cancel()
				if r := <-answered; r.status != 0 {
					t.Fatalf("the client left before the answer, got %d %s", r.status, r.body)
				}
			} else {
				e := wantError(t, <-answered, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
				if e.StreamID != "" {
					t.Errorf("error.stream_id of the 503: got %q, want none (the slot of the id made for it is released)", e.StreamID)
				}
				slow.SetLatency(0)
			}
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

// leaveAtGrant is an Observer that, at the next grant after arm, makes
// the acquire's client leave (arm's leave) and holds the grant back from
// the handler until the server has seen the connection go (the request's
// context ends): the client is gone by the time its answer is written.
// (An Observer must not block; this one does, once, to order the two.)
type leaveAtGrant struct {
	limiter.Observer
	leave chan func()
	// saw says whether the server saw the client go within 5s.
	saw chan bool
}

func newLeaveAtGrant(base limiter.Observer) *leaveAtGrant {
	return &leaveAtGrant{Observer: base, leave: make(chan func(), 1), saw: make(chan bool, 1)}
}

// arm makes the next grant call leave first.
func (o *leaveAtGrant) arm(leave func()) { o.leave <- leave }

func (o *leaveAtGrant) Acquired(ctx context.Context, tier tiers.Tier, res limiter.AcquireResult, err error) {
	o.Observer.Acquired(ctx, tier, res, err)
	if !res.Granted {
		return
	}
	select {
	case leave := <-o.leave:
		leave()
		select {
		case <-ctx.Done():
			o.saw <- true
		case <-time.After(5 * time.Second):
			o.saw <- false
		}
	default:
	}
}

// TestAPIAcquireWithoutStreamIDFreesTheSlotOfAClientGoneAtItsGrant: an
// acquire sent without stream_id that is granted, at once or after a
// wait, just as its client hangs up holds a slot under an id no one was
// told: the server releases it rather than write an answer no one reads,
// and the user's slot is free at once, not after its TTL (10s). A slot
// under the caller's own stream_id stays: the caller knows the id, to
// acquire under it again or release it.
func TestAPIAcquireWithoutStreamIDFreesTheSlotOfAClientGoneAtItsGrant(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		streamID string
		// waits: the acquire finds the user's one slot held, and is
		// granted the slot the holder's release frees.
		waits bool
		// pooled: the acquire joins pool key model=gpt-4o too, whose
		// place goes with the slot.
		pooled bool
		want   int // the user's slots (and the key's places) once the client is gone
	}{
		{name: "granted at once, its id made by the limiter", want: 0},
		{name: "granted at once with a pool's place, its id made by the limiter", pooled: true, want: 0},
		{name: "granted after waiting, its id made by the limiter", waits: true, want: 0},
		{name: "granted at once, under the caller's stream_id", streamID: "callers", want: 1},
		{name: "granted after waiting, under the caller's stream_id", streamID: "callers", waits: true, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			poolTable := pools.NewTable()
			if err := poolTable.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 2}}.WithDefaults()}); err != nil {
				t.Fatal(err)
			}
			var observer *leaveAtGrant
			stack := limitertest.New(t, limitertest.Options{Tiers: waitTiers(), Limiter: limiter.Options{Pools: poolTable},
				NewObserver: func(table *tiers.Table) (limiter.Observer, error) {
					base, err := telemetry.NewObserver(noop.NewMeterProvider(), table, telemetry.ObserverOptions{})
					observer = newLeaveAtGrant(base)
					return observer, err
				}})
			// A server of the test's own, whose Close returns once every
			// request's handler has.
			srv := httptest.NewServer(server.New(stack.Limiter, server.Options{}).Handler())
			defer srv.Close()

			user := newUser(t)
			if tc.waits {
				if _, err := stack.Limiter.Acquire(t.Context(), limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "first"}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			observer.arm(cancel)
			acquire := httpapi.AcquireRequest{UserID: user, Plan: "wait", StreamID: tc.streamID, WaitMs: 5000}
			if tc.pooled {
				acquire.Pools = map[string]string{"model": "gpt-4o"}
			}
			body := mustJSON(t, acquire)
			answered := make(chan error, 1)
			go func() {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+httpapi.PathAcquire, bytes.NewReader(body))
				if err != nil {
					answered <- err
					return
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := srv.Client().Do(req)
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					err = fmt.Errorf("answered %d %s", resp.StatusCode, b)
				}
				answered <- err
			}()
			if tc.waits {
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
					got, err := stack.Limiter.Slots(context.Background(), user)
					if err == nil && len(got.Queue) == 1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the acquire never queued: %+v, %v", got, err)
					}
				}
				if _, err := stack.Limiter.Release(context.Background(), user, "first"); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-answered; !errors.Is(err, context.Canceled) {
				t.Fatalf("the client left at the grant: got %v, want no answer (context canceled)", err)
			}
			if !<-observer.saw {
				t.Fatal("the server did not see the client go within 5s of the grant")
			}
			srv.Close() // the handler has returned
			var got limiter.UserSlots
			var err error
			for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				got, err = stack.Limiter.Slots(context.Background(), user)
				if err == nil && got.Used == tc.want || time.Now().After(deadline) {
					break
				}
			}
			if err != nil || got.Used != tc.want {
				t.Errorf("slots of the user 2s after its client left at the grant: got %d (%+v, %v), want %d", got.Used, got.Slots, err, tc.want)
			}
			if tc.pooled {
				if got, err := stack.Limiter.PoolSlots(context.Background(), "model", "gpt-4o"); err != nil || got.Used != tc.want {
					t.Errorf("places of model=gpt-4o once the user's slot is free: got %d (%+v, %v), want %d", got.Used, got.Holders, err, tc.want)
				}
			}
		})
	}
}
