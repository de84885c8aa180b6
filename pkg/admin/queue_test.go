package admin_test

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/apitest"
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
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		t.Cleanup(func() { cancel(); <-done }) // the one still waiting leaves
		go func() {
			defer close(done)
			res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: stream, Wait: 5 * time.Second})
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
		if q.Plan != "wait" || q.Priority != 0 || q.UserID != "" || q.Caller != "" || q.Label != "" {
			t.Errorf("ticket %d = %+v, want plan wait, priority 0, no user, caller or label", i, q)
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

// TestAdminListsTheQueueByPriority: a user's queue is listed as it is
// served, by priority then arrival: an acquire of a priority-5 plan comes
// before an earlier one of priority 0, with its plan, caller and label.
func TestAdminListsTheQueueByPriority(t *testing.T) {
	t.Parallel()
	high := waitTier()
	high.Plan, high.Priority = "wait-high", 5
	e := newAdminEnvOn(t, limitertest.Options{Tiers: append(limitertest.Tiers(), waitTier(), high)}, nil)
	user := newUser()
	if res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "holder"}); err != nil || !res.Granted {
		t.Fatalf("holder: %+v, %v", res, err)
	}
	var got httpapi.AdminSlotsResponse
	for i, req := range []limiter.AcquireRequest{
		{UserID: user, Plan: "wait", StreamID: "w-low"},
		{UserID: user, Plan: "wait-high", StreamID: "w-high", Caller: "chat-api", Label: "pod-7"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		t.Cleanup(func() { cancel(); <-done })
		go func() {
			defer close(done)
			req.Wait = 5 * time.Second
			_, _ = e.lim.Acquire(ctx, req)
		}()
		for deadline := time.Now().Add(5 * time.Second); len(got.Queue) <= i; time.Sleep(5 * time.Millisecond) {
			got = apitest.Decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken}), http.StatusOK)
			if time.Now().After(deadline) {
				t.Fatalf("queue %+v, want %s queued", got.Queue, req.StreamID)
			}
		}
	}
	want := []httpapi.AdminTicket{
		{StreamID: "w-high", Place: 1, Priority: 5, Plan: "wait-high", Caller: "chat-api", Label: "pod-7"},
		{StreamID: "w-low", Place: 2, Priority: 0, Plan: "wait"},
	}
	for i, q := range got.Queue {
		if q.StreamID != want[i].StreamID || q.Place != want[i].Place || q.Priority != want[i].Priority || q.Plan != want[i].Plan ||
			q.Caller != want[i].Caller || q.Label != want[i].Label || q.UserID != "" {
			t.Errorf("ticket %d: got %+v, want %+v", i+1, q, want[i])
		}
	}
}

// TestAQueuesFirstPlaceIsTheAcquireTheNextFreeSlotGoesTo (openapi
// AdminTicket.place, "1 for the acquire served next"; docs/api.md "A
// waiter blocks only what it could take"): a user holding 3 slots has an
// acquire of a plan of 1 waiting, then one of a plan of 3. The first is
// owed nothing while the user holds a slot, so the next free slot goes to
// the second: the listing puts that one first, and the freed slot goes to
// it.
func TestAQueuesFirstPlaceIsTheAcquireTheNextFreeSlotGoesTo(t *testing.T) {
	wait1 := tiers.Tier{Plan: "wait1", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 10 * time.Second}
	wait3 := wait1
	wait3.Plan, wait3.MaxConcurrentStreams = "wait3", 3
	e := newAdminEnvOn(t, limitertest.Options{Tiers: append(limitertest.Tiers(), wait1, wait3)}, nil)
	user := newUser()
	var held []string
	for range 3 {
		res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "wait3"})
		if err != nil || !res.Granted {
			t.Fatalf("holder: %+v, %v", res, err)
		}
		held = append(held, res.StreamID)
	}
	granted := make(chan string, 2)
	var got httpapi.AdminSlotsResponse
	for i, req := range []limiter.AcquireRequest{
		{UserID: user, Plan: "wait1", StreamID: "w-plan-1"},
		{UserID: user, Plan: "wait3", StreamID: "w-plan-3"},
	} {
		e.waitFor(t, req, granted)
		for deadline := time.Now().Add(5 * time.Second); len(got.Queue) <= i; time.Sleep(5 * time.Millisecond) {
			got = apitest.Decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken}), http.StatusOK)
			if time.Now().After(deadline) {
				t.Fatalf("queue %+v, want %s queued", got.Queue, req.StreamID)
			}
		}
	}
	var listed []string
	for i, w := range got.Queue {
		listed = append(listed, w.StreamID)
		if w.Place != i+1 {
			t.Errorf("queue[%d] %s has place %d; want %d", i, w.StreamID, w.Place, i+1)
		}
	}
	if want := []string{"w-plan-3", "w-plan-1"}; !slices.Equal(listed, want) {
		t.Errorf("queue listed %v; want %v: the plan of 1 is owed nothing while the user holds 3", listed, want)
	}

	if _, err := e.lim.Release(context.Background(), user, held[0]); err != nil {
		t.Fatal(err)
	}
	select {
	case served := <-granted:
		if served != listed[0] {
			t.Errorf("the listing put %s at place 1 (\"served next\"), but the freed slot went to %s", listed[0], served)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no waiter was granted the freed slot")
	}
}

// TestAPlansLoweredLimitHoldsForItsWaitersAtOnce (docs/api.md: "judged
// as it is granted: by its plan as it is when a slot frees"): a user holds
// 3 slots of plan big; an acquire of plan small (allowed 3 as it queued)
// waits, then one of big. small is lowered to 1. The listing puts the
// big acquire first at once, and the slot the user frees next goes to it
// at once: the small ticket's record still held the limit it queued with,
// by which the release woke it, and its call, at small's limit, took
// nothing and woke no one, so the slot stayed free until a held one
// expired.
func TestAPlansLoweredLimitHoldsForItsWaitersAtOnce(t *testing.T) {
	small := tiers.Tier{Plan: "small", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 30 * time.Second}
	big := small
	big.Plan = "big"
	e := newAdminEnvOn(t, limitertest.Options{Tiers: append(limitertest.Tiers(), small, big)}, nil)
	user := newUser()
	var held []string
	for range 3 {
		res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "big"})
		if err != nil || !res.Granted {
			t.Fatalf("holder: %+v, %v", res, err)
		}
		held = append(held, res.StreamID)
	}
	granted := make(chan string, 2)
	list := func() []string {
		got := apitest.Decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken}), http.StatusOK)
		var ids []string
		for _, w := range got.Queue {
			ids = append(ids, w.StreamID)
		}
		return ids
	}
	for i, req := range []limiter.AcquireRequest{
		{UserID: user, Plan: "small", StreamID: "w-small"},
		{UserID: user, Plan: "big", StreamID: "w-big"},
	} {
		e.waitFor(t, req, granted)
		for deadline := time.Now().Add(5 * time.Second); len(list()) <= i; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s not queued after 5s", req.StreamID)
			}
		}
	}
	if got, want := list(), []string{"w-small", "w-big"}; !slices.Equal(got, want) {
		t.Fatalf("queue before the change: %v; want %v (both plans allow 3)", got, want)
	}
	small.MaxConcurrentStreams = 1
	if err := e.tiers.Replace(append(limitertest.Tiers(), small, big)); err != nil {
		t.Fatal(err)
	}
	if got, want := list(), []string{"w-big", "w-small"}; !slices.Equal(got, want) {
		t.Errorf("queue after small's limit fell to 1: %v; want %v (the freed slots go to big first)", got, want)
	}
	if _, err := e.lim.Release(context.Background(), user, held[0]); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case served := <-granted:
		if took := time.Since(released); served != "w-big" || took > time.Second {
			t.Errorf("the freed slot went to %s %v after the release; want w-big at once (the slots expire in 10s)", served, took.Round(time.Millisecond))
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no waiter was granted the freed slot")
	}
}
