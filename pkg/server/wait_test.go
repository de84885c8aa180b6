package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// waitTiers: one slot per user that may be waited for 5s, or 300ms, or
// not at all.
func waitTiers() []tiers.Tier {
	return []tiers.Tier{
		{Plan: "wait", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 5 * time.Second},
		{Plan: "short-wait", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 300 * time.Millisecond},
		{Plan: "no-wait", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
	}
}

func TestAPIAcquireWaits(t *testing.T) {
	t.Parallel()
	s := limitertest.New(t, limitertest.Options{Tiers: waitTiers()})
	a := newAPI(t, s.Limiter)

	t.Run("an acquire waits for the slot a release frees", func(t *testing.T) {
		user := newUser(t)
		decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "wait", StreamID: "first"}), http.StatusOK)
		answer := a.postAsync(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "wait", StreamID: "second", WaitMs: 5000})
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			got, err := s.Limiter.Slots(context.Background(), user)
			if err == nil && len(got.Queue) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("second never queued: %+v, %v", got, err)
			}
		}
		decode[httpapi.ReleaseResponse](t, a.post(t, httpapi.PathRelease, httpapi.ReleaseRequest{UserID: user, StreamID: "first"}), http.StatusOK)
		got := decode[httpapi.AcquireResponse](t, (<-answer).get(t), http.StatusOK)
		if !got.Granted || got.StreamID != "second" || got.Used != 1 || got.WaitedMs <= 0 {
			t.Errorf("got %+v, want second granted after a wait (waited_ms > 0)", got)
		}
	})

	t.Run("a wait that runs out is 429 with Retry-After and waited_ms", func(t *testing.T) {
		user := newUser(t)
		decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "short-wait", StreamID: "first"}), http.StatusOK)
		// 60s asked, the plan's 300ms given.
		start := time.Now()
		r := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "short-wait", WaitMs: 60_000})
		e := wantError(t, r, http.StatusTooManyRequests, httpapi.CodeStreamLimitReached)
		checkLimitReached(t, r, e, 1, 1)
		if e.WaitedMs == nil || *e.WaitedMs < 300 || time.Since(start) > 5*time.Second {
			t.Errorf("waited_ms %v after %v, want at least the plan's 300ms, not the 60s asked", e.WaitedMs, time.Since(start))
		}
	})

	t.Run("a plan without maxWait answers at once, as without wait_ms", func(t *testing.T) {
		user := newUser(t)
		decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "no-wait", StreamID: "first"}), http.StatusOK)
		without := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "no-wait"})
		with := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "no-wait", WaitMs: 5000})
		for _, r := range []reply{without, with} {
			e := wantError(t, r, http.StatusTooManyRequests, httpapi.CodeStreamLimitReached)
			if e.WaitedMs != nil {
				t.Errorf("waited_ms = %d, want none: nothing waited", *e.WaitedMs)
			}
		}
		var a, b map[string]any
		_ = json.Unmarshal(without.body, &a)
		_ = json.Unmarshal(with.body, &b)
		if !bytes.Equal(mustJSON(t, keysOf(a)), mustJSON(t, keysOf(b))) {
			t.Errorf("answers differ in fields: %s vs %s", without.body, with.body)
		}
	})

	t.Run("a wait_ms out of its range is invalid_request naming the range", func(t *testing.T) {
		for _, tc := range []struct{ wait, want string }{
			{"-1", "wait_ms must be 0 (no waiting) or more milliseconds, got -1"},
			{"99999999999999999999", "wait_ms must be 0 (no waiting) to 9223372036854775807 milliseconds (the plan's max_wait_ms caps the wait), got 99999999999999999999"},
			{"-99999999999999999999", "wait_ms must be 0 (no waiting) to 9223372036854775807 milliseconds (the plan's max_wait_ms caps the wait), got -99999999999999999999"},
		} {
			r := a.call(t, http.MethodPost, httpapi.PathAcquire, []byte(`{"user_id":"u","plan":"wait","wait_ms":`+tc.wait+`}`), true)
			if e := wantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest); e.Message != tc.want {
				t.Errorf("wait_ms %s: message %q, want %q", tc.wait, e.Message, tc.want)
			}
		}
	})

	t.Run("GET /v1/tiers names each plan's max_wait_ms", func(t *testing.T) {
		got := decode[httpapi.TiersResponse](t, a.call(t, http.MethodGet, httpapi.PathTiers, nil, false), http.StatusOK)
		want := map[string]int64{"wait": 5000, "short-wait": 300, "no-wait": 0}
		for _, tier := range got.Tiers {
			if tier.MaxWaitMs != want[tier.Plan] {
				t.Errorf("%s: max_wait_ms %d, want %d", tier.Plan, tier.MaxWaitMs, want[tier.Plan])
			}
		}
	})
}

// asyncReply is the answer of postAsync, or why there is none.
type asyncReply struct {
	reply
	err error
}

func (r asyncReply) get(t *testing.T) reply {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.reply
}

// postAsync sends v as JSON to path from a goroutine of its own (which
// must not fail the test) and returns where its answer arrives.
func (a *api) postAsync(t *testing.T, path string, v any) <-chan asyncReply {
	body := mustJSON(t, v)
	out := make(chan asyncReply, 1)
	go func() {
		resp, err := a.client.Post(a.url+path, "application/json", bytes.NewReader(body))
		if err != nil {
			out <- asyncReply{err: fmt.Errorf("POST %s: %w", path, err)}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- asyncReply{reply: reply{status: resp.StatusCode, header: resp.Header, body: b}, err: err}
	}()
	return out
}

// keysOf returns the field names of an error answer.
func keysOf(body map[string]any) []string {
	e, _ := body["error"].(map[string]any)
	var out []string
	for _, k := range []string{"code", "message", "used", "limit", "retry_after_ms", "waited_ms", "stream_id"} {
		if _, ok := e[k]; ok {
			out = append(out, k)
		}
	}
	return out
}

// TestRunLetsAnAcquireWaitPastTheTimeouts: the listener's read and write
// timeouts bound requests that answer at once; one that waits for a slot
// gets its wait on top, and is neither cut nor taken for a client that
// went away.
func TestRunLetsAnAcquireWaitPastTheTimeouts(t *testing.T) {
	t.Parallel()
	s := limitertest.New(t, limitertest.Options{Tiers: waitTiers()})
	addr, _ := runServer(t, server.New(s.Limiter, server.Options{}), tinyTimeouts)
	a := &api{url: "http://" + addr, client: &http.Client{Timeout: 10 * time.Second}}
	user := newUser(t)
	decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "wait", StreamID: "first"}), http.StatusOK)
	start := time.Now()
	answer := a.postAsync(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "wait", StreamID: "second", WaitMs: 5000})
	// Twice the read and write timeouts (600ms), then the slot frees.
	time.Sleep(1200 * time.Millisecond)
	if _, err := s.Limiter.Release(context.Background(), user, "first"); err != nil {
		t.Fatal(err)
	}
	got := decode[httpapi.AcquireResponse](t, (<-answer).get(t), http.StatusOK)
	if !got.Granted || got.StreamID != "second" || time.Since(start) < 1200*time.Millisecond {
		t.Errorf("got %+v after %v, want second granted once first was released", got, time.Since(start))
	}
}

// TestAWaitThePlanDoesNotAllowSaysSo: wait_ms on a plan whose maxWait is
// 0s answers the 429 at once, and its message says why it did not wait.
func TestAWaitThePlanDoesNotAllowSaysSo(t *testing.T) {
	t.Parallel()
	s := limitertest.New(t, limitertest.Options{Tiers: waitTiers()})
	a := newAPI(t, s.Limiter)
	user := "nowait-" + time.Now().Format("150405.000000")
	if r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": user, "plan": "no-wait"}); r.status != http.StatusOK {
		t.Fatalf("first acquire: %d %s", r.status, r.body)
	}
	r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": user, "plan": "no-wait", "wait_ms": 10000})
	var refused httpapi.ErrorResponse
	if r.status != http.StatusTooManyRequests || json.Unmarshal(r.body, &refused) != nil || refused.Error.WaitedMs != nil ||
		!strings.Contains(refused.Error.Message, `not waited: wait_ms asked 10000ms, but plan "no-wait" has maxWait 0s (no waiting)`) {
		t.Fatalf("wait_ms on a plan without maxWait: %d %s; want an immediate 429 saying the plan's maxWait capped it", r.status, r.body)
	}
}

// TestARefusalOwedToWaitersSaysSo: a user holds 2 of 3 slots, and the
// free one is owed to an acquire waiting in the user's queue (its server
// cut off from Redis, so it cannot take it); an acquire that does not
// wait is refused stream_limit_reached, used 2 of 3, and the message says
// the free slot is the waiter's.
func TestARefusalOwedToWaitersSaysSo(t *testing.T) {
	redis := testenv.StartRedis(t).Addr()
	link := testenv.StartProxy(t, redis)
	paid := []tiers.Tier{{Plan: "paid", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 10 * time.Second}}
	a := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{redis}}, Tiers: paid})
	b := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{link.Addr()}}, Tiers: paid, Limiter: limiter.Options{Keys: a.Keys}})
	api := newAPI(t, a.Limiter)
	user := newUser(t)
	var ids []string
	for range 3 {
		g := decode[httpapi.AcquireResponse](t, api.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "paid"}), http.StatusOK)
		ids = append(ids, g.StreamID)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		_, _ = b.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "paid", StreamID: "waiter", Wait: 8 * time.Second})
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if s, _ := a.Limiter.Slots(context.Background(), user); len(s.Queue) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
	}
	link.BlackHole() // the waiter's server can no longer take the slot it is owed
	decode[httpapi.ReleaseResponse](t, api.post(t, httpapi.PathRelease, httpapi.ReleaseRequest{UserID: user, StreamID: ids[0]}), http.StatusOK)
	e := wantError(t, api.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "paid"}), http.StatusTooManyRequests, httpapi.CodeStreamLimitReached)
	const want = `user holds 2 of 3 concurrent streams allowed by plan "paid"; the free one is owed to 1 acquire waiting in the user's queue`
	if *e.Used != 2 || *e.Limit != 3 || e.Message != want {
		t.Errorf("refused while the free slot is owed to a waiter: used %d of %d, message %q; want 2 of 3, message %q", *e.Used, *e.Limit, e.Message, want)
	}
}
