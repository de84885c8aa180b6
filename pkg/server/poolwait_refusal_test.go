package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestAPoolRefusalAfterAUserWaitSaysWhyThePoolWasNotWaited: an acquire
// waits in its user's queue (plan "wait", maxWait 5s), is granted the
// user's slot, and is then refused at once by pool "nowait" (maxWait 0s:
// never waited for). The 429 says it waited for the user's own slot and
// not for the key, whose pool has maxWait 0s; not that it waited without
// a place of the pool freeing up. waited_ms is the whole wait.
func TestAPoolRefusalAfterAUserWaitSaysWhyThePoolWasNotWaited(t *testing.T) {
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "nowait", Keys: map[string]int{"k": 1}}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{Tiers: waitTiers(), Limiter: limiter.Options{Pools: table}}).Limiter
	a := newAPIOf(t, server.New(lim, server.Options{}))
	suffix := time.Now().Format("150405.000000")
	ana, bo := "ana-"+suffix, "bo-"+suffix
	// bo holds the pool key; ana holds her one slot.
	if r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": bo, "plan": "wait", "pools": map[string]string{"nowait": "k"}}); r.status != http.StatusOK {
		t.Fatalf("bo: %d %s", r.status, r.body)
	}
	r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": ana, "plan": "wait"})
	var first httpapi.AcquireResponse
	if r.status != http.StatusOK || json.Unmarshal(r.body, &first) != nil {
		t.Fatalf("ana: %d %s", r.status, r.body)
	}
	refused := waitThenRefused(t, a, ana, first.StreamID, "nowait")
	if !strings.Contains(refused.Error.Message, `pool "nowait" has maxWait 0s`) || !strings.Contains(refused.Error.Message, "for the user's own slot") {
		t.Errorf("the refusal does not say the pool is never waited for (maxWait 0s): %q", refused.Error.Message)
	}
	if strings.Contains(refused.Error.Message, "without a place freeing up") {
		t.Errorf("the refusal says the acquire waited for a place of the pool without one freeing up, yet it never waited in the pool's queue: %q", refused.Error.Message)
	}
	if w := refused.Error.WaitedMs; w == nil || *w < 250 {
		t.Errorf("waited_ms %v; want the wait for the user's slot, about 300", w)
	}
}

// TestAFullPoolQueueAfterAUserWaitIsNotADisplacement: after a wait in the
// user's queue, the pool key's queue is full (MaxQueue 1) and the acquire
// is refused without ever having had a place in it. The 429 says the
// key's queue was full, not that it had a place there and lost it.
func TestAFullPoolQueueAfterAUserWaitIsNotADisplacement(t *testing.T) {
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"k": 1}, MaxWait: 5 * time.Second}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{Tiers: waitTiers(), Limiter: limiter.Options{Pools: table, MaxQueue: 1}}).Limiter
	a := newAPIOf(t, server.New(lim, server.Options{}))
	suffix := time.Now().Format("150405.000000")
	ana, bo, carl := "ana-"+suffix, "bo-"+suffix, "carl-"+suffix
	if r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": bo, "plan": "wait", "pools": map[string]string{"model": "k"}}); r.status != http.StatusOK {
		t.Fatalf("bo: %d %s", r.status, r.body)
	}
	carlWaits := a.postAsync(t, "/v1/slots/acquire", map[string]any{"user_id": carl, "plan": "wait", "wait_ms": 4000, "pools": map[string]string{"model": "k"}})
	r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": ana, "plan": "wait"})
	var first httpapi.AcquireResponse
	if r.status != http.StatusOK || json.Unmarshal(r.body, &first) != nil {
		t.Fatalf("ana: %d %s", r.status, r.body)
	}
	time.Sleep(200 * time.Millisecond) // carl queued in model=k
	refused := waitThenRefused(t, a, ana, first.StreamID, "model")
	if strings.Contains(refused.Error.Message, "its place went to a waiter served before it") {
		t.Errorf("the refusal says the acquire had a place in the key's queue and was displaced, yet it never queued there: %q", refused.Error.Message)
	}
	if !strings.Contains(refused.Error.Message, "holds its most waiters, 1,") {
		t.Errorf("the refusal does not say the key's queue was full: %q", refused.Error.Message)
	}
	<-carlWaits
}

// waitThenRefused sends an acquire of user's that waits up to 3s in its
// queue (user holds stream, its one slot) and then joins pool's key k,
// releases stream 300ms later, and returns the acquire's refusal, a 429
// pool_limit_reached.
func waitThenRefused(t *testing.T, a *api, user, stream, pool string) httpapi.ErrorResponse {
	t.Helper()
	waiting := a.postAsync(t, "/v1/slots/acquire", map[string]any{"user_id": user, "plan": "wait", "wait_ms": 3000, "pools": map[string]string{pool: "k"}})
	time.Sleep(300 * time.Millisecond)
	if r := a.post(t, "/v1/slots/release", map[string]any{"user_id": user, "stream_id": stream}); r.status != http.StatusOK {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	got := <-waiting
	if got.err != nil {
		t.Fatal(got.err)
	}
	var refused httpapi.ErrorResponse
	if got.status != http.StatusTooManyRequests || json.Unmarshal(got.body, &refused) != nil || refused.Error.Code != httpapi.CodePoolLimitReached {
		t.Fatalf("%d %s; want 429 pool_limit_reached", got.status, got.body)
	}
	return refused
}

// TestAPoolOrPlanRemovedWhileAnAcquireWaitsForAPoolIsUnknown: an acquire
// waiting in a pool key's queue when its pool or plan is removed is
// answered 422 unknown_pool or unknown_plan (docs/api.md), as one naming
// it afterwards is: a retry gets the same answer, so it is no outage
// (503). The user's slot the acquire took goes back.
func TestAPoolOrPlanRemovedWhileAnAcquireWaitsForAPoolIsUnknown(t *testing.T) {
	for _, removed := range []string{"pool", "plan"} {
		t.Run(removed, func(t *testing.T) {
			table := pools.NewTable()
			model := pools.Pool{Pool: "model", Keys: map[string]int{"k": 1}, MaxWait: 5 * time.Second}.WithDefaults()
			if err := table.Replace([]pools.Pool{model}); err != nil {
				t.Fatal(err)
			}
			st := limitertest.New(t, limitertest.Options{Tiers: waitTiers(), Limiter: limiter.Options{Pools: table}})
			a := newAPIOf(t, server.New(st.Limiter, server.Options{}))
			suffix := time.Now().Format("150405.000000")
			ana, bo := "ana-"+suffix, "bo-"+suffix
			if r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": bo, "plan": "wait", "pools": map[string]string{"model": "k"}}); r.status != http.StatusOK {
				t.Fatalf("bo: %d %s", r.status, r.body)
			}
			waiting := a.postAsync(t, "/v1/slots/acquire", map[string]any{"user_id": ana, "plan": "wait", "wait_ms": 4000, "pools": map[string]string{"model": "k"}})
			time.Sleep(400 * time.Millisecond) // ana waits in model=k's queue
			code := "unknown_pool"
			if removed == "pool" {
				if err := table.Replace(nil); err != nil {
					t.Fatal(err)
				}
			} else {
				code = "unknown_plan"
				var rest []tiers.Tier
				for _, tr := range waitTiers() {
					if tr.Plan != "wait" {
						rest = append(rest, tr)
					}
				}
				if err := st.Table.Replace(rest); err != nil {
					t.Fatal(err)
				}
			}
			got := <-waiting
			if got.err != nil {
				t.Fatal(got.err)
			}
			if got.status != http.StatusUnprocessableEntity || !strings.Contains(string(got.body), `"code":"`+code+`"`) {
				t.Errorf("%s removed while the acquire waited in the pool key's queue: got %d %s; want 422 %s", removed, got.status, got.body, code)
			}
			if removed == "pool" {
				if r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": ana, "plan": "wait"}); r.status != http.StatusOK {
					t.Errorf("ana's next acquire after the refused wait: %d %s; want granted (the refused acquire's slot given back)", r.status, r.body)
				}
			}
		})
	}
}

// TestADisplacedWaiterIsToldItsPlaceWentToOneServedFirst: the queues hold
// one waiter (MaxQueue 1). A waiter of plan "low" has the place; one of
// plan "high" (priority 5), served before it, takes it. The first is
// answered 429 at once, saying how long it waited and that its place went
// to a waiter served before it, naming the queue's bound; in the user's
// queue and in a pool key's alike.
func TestADisplacedWaiterIsToldItsPlaceWentToOneServedFirst(t *testing.T) {
	t.Parallel()
	plans := []tiers.Tier{
		{Plan: "low", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 5 * time.Second},
		{Plan: "high", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 5 * time.Second, Priority: 5},
	}
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"k": 1}, MaxWait: 5 * time.Second}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{Tiers: plans, Limiter: limiter.Options{Pools: table, MaxQueue: 1}}).Limiter
	a := newAPIOf(t, server.New(lim, server.Options{}))
	suffix := time.Now().Format("150405.000000")

	for _, tc := range []struct {
		name                  string
		pools                 map[string]string
		holder, first, second string // the users holding the slot, waiting, served first
		code, says            string
	}{
		{"in the user's queue", nil, "ana-" + suffix, "ana-" + suffix, "ana-" + suffix, httpapi.CodeStreamLimitReached,
			"in the queue, then its place went to a waiter served before it: the queue holds its most waiters, 1"},
		{"in a pool key's queue", map[string]string{"model": "k"}, "bo-" + suffix, "carl-" + suffix, "dan-" + suffix, httpapi.CodePoolLimitReached,
			"in the key's queue, then its place went to a waiter served before it: the queue holds its most waiters, 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder, first := tc.holder, tc.first
			acquire := func(user, plan string, waitMs int) map[string]any {
				req := map[string]any{"user_id": user, "plan": plan, "wait_ms": waitMs}
				if tc.pools != nil {
					req["pools"] = tc.pools
				}
				return req
			}
			r := a.post(t, "/v1/slots/acquire", acquire(holder, "low", 0))
			var held httpapi.AcquireResponse
			if r.status != http.StatusOK || json.Unmarshal(r.body, &held) != nil {
				t.Fatalf("holder: %d %s", r.status, r.body)
			}
			start := time.Now()
			low := a.postAsync(t, "/v1/slots/acquire", acquire(first, "low", 4000))
			time.Sleep(300 * time.Millisecond)
			// low has the queue's one place before high comes.
			for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				waiting := 0
				if tc.pools == nil {
					got, err := lim.Slots(context.Background(), first)
					waiting = len(got.Queue)
					if err != nil {
						t.Fatal(err)
					}
				} else {
					got, err := lim.PoolSlots(context.Background(), "model", "k")
					waiting = len(got.Waiters)
					if err != nil {
						t.Fatal(err)
					}
				}
				if waiting == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the low waiter never queued: %d waiting", waiting)
				}
			}
			high := a.postAsync(t, "/v1/slots/acquire", acquire(tc.second, "high", 4000))
			got := <-low
			if got.err != nil {
				t.Fatal(got.err)
			}
			var refused httpapi.ErrorResponse
			if got.status != http.StatusTooManyRequests || json.Unmarshal(got.body, &refused) != nil || refused.Error.Code != tc.code {
				t.Fatalf("the displaced waiter: %d %s; want 429 %s", got.status, got.body, tc.code)
			}
			if time.Since(start) > 3500*time.Millisecond {
				t.Errorf("the displaced waiter was answered after %v; want at once when its place went", time.Since(start))
			}
			if !strings.Contains(refused.Error.Message, tc.says) {
				t.Errorf("the displaced waiter's message: %q; want it to say %q", refused.Error.Message, tc.says)
			}
			if w := refused.Error.WaitedMs; w == nil || *w < 250 {
				t.Errorf("waited_ms %v; want the 300ms or so it had its place", w)
			}
			if r := a.post(t, "/v1/slots/release", map[string]any{"user_id": holder, "stream_id": held.StreamID}); r.status != http.StatusOK {
				t.Fatalf("release: %d %s", r.status, r.body)
			}
			if r := <-high; r.err != nil || r.status != http.StatusOK {
				t.Errorf("the waiter served first, once the slot freed: %v %d %s; want granted", r.err, r.status, r.body)
			}
		})
	}
}
