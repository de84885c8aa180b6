package admin_test

import (
	"context"
	"github.com/joishi/limiter/internal/apitest"
	"net/http"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// waitTier: one slot per user, which an acquire may wait 5s for.
func waitTier() tiers.Tier {
	return tiers.Tier{Plan: "wait", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 5 * time.Second}
}

// TestAdminListsTheQueue: the admin listing shows the acquires waiting
// for a user's slots, in the order they will be served, and releasing the
// user's slots serves the first of them.
func TestAdminListsTheQueue(t *testing.T) {
	t.Parallel()
	e := newAdminEnvOn(t, limitertest.Options{Tiers: append(limitertest.Tiers(), waitTier())}, nil)
	user := newUser()
	if res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "holder"}); err != nil || !res.Granted {
		t.Fatalf("holder: %+v, %v", res, err)
	}
	granted := make(chan string, 2)
	var got httpapi.AdminSlotsResponse
	for i, stream := range []string{"w-first", "w-second"} {
		go func() {
			res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: stream, Wait: 5 * time.Second})
			if err == nil && res.Granted {
				granted <- stream
			}
		}()
		for deadline := time.Now().Add(5 * time.Second); len(got.Queue) <= i; time.Sleep(5 * time.Millisecond) {
			got = apitest.Decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken}), http.StatusOK)
			if time.Now().After(deadline) {
				t.Fatalf("queue %+v, want %s at place %d", got.Queue, stream, i+1)
			}
		}
	}
	if len(got.Queue) != 2 || got.Queue[0].StreamID != "w-first" || got.Queue[1].StreamID != "w-second" {
		t.Fatalf("queue = %+v, want w-first then w-second", got.Queue)
	}
	for i, q := range got.Queue {
		if q.Place != i+1 || q.WaitedMs < 0 || q.WaitedMs > 5000 || !q.ExpiresAt.After(q.WaitingSince) || (i > 0 && q.WaitingSince.Before(got.Queue[i-1].WaitingSince)) {
			t.Errorf("ticket %d = %+v, want place %d, waiting a while, in arrival order", i, q, i+1)
		}
	}
	r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(user), token: operatorToken, body: `{"reason":"ticket 1"}`})
	apitest.Decode[httpapi.AdminReleaseResponse](t, r, http.StatusOK)
	select {
	case stream := <-granted:
		if stream != "w-first" {
			t.Errorf("%s was granted the slot released, want w-first", stream)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no waiter was granted the slot support released")
	}
}
