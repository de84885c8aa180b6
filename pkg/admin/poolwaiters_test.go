package admin_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// newPoolWaitEnv is an admin env whose plans low (priority 0) and high
// (priority 5) may wait 10s, three streams per user, and whose pool model
// caps gpt-4o at 1, with a wait of up to 10s.
func newPoolWaitEnv(t *testing.T, backend limitertest.Backend) *adminEnv {
	t.Helper()
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{
		pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1}, MaxWait: 10 * time.Second}.WithDefaults(),
	}); err != nil {
		t.Fatal(err)
	}
	plans := []tiers.Tier{
		tiers.Tier{Plan: "low", MaxConcurrentStreams: 3, MaxWait: 10 * time.Second}.WithDefaults(),
		tiers.Tier{Plan: "high", MaxConcurrentStreams: 3, MaxWait: 10 * time.Second, Priority: 5}.WithDefaults(),
	}
	return newAdminEnvOn(t, limitertest.Options{Backend: backend, Tiers: plans, Limiter: limiter.Options{Pools: table}}, nil)
}

// waitFor starts req, waiting up to 10s, in the background; its stream
// id goes to granted when it is granted. The test's cleanup cancels it
// (its ticket leaves the queue) and waits for it to return.
func (e *adminEnv) waitFor(t *testing.T, req limiter.AcquireRequest, granted chan<- string) {
	t.Helper()
	req.Wait = 10 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		if res, err := e.lim.Acquire(ctx, req); err == nil && res.Granted {
			granted <- res.StreamID
		}
	}()
}

// awaitWaiters lists model=gpt-4o until it has n waiters, or fails the test
// after 5s.
func (e *adminEnv) awaitWaiters(t *testing.T, n int) httpapi.AdminPoolKeyResponse {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := apitest.Decode[httpapi.AdminPoolKeyResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminPoolKeyPath("model", "gpt-4o"), token: viewerToken}), http.StatusOK)
		if len(got.Waiters) == n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("model=gpt-4o: got waiters %+v after 5s, want %d", got.Waiters, n)
		}
	}
}

// TestAdminPoolKeyListsTheWaiters (DESIGN §16, §17): the listing of a full
// pool key shows the acquires waiting for it in the order they will be
// served - the priority-5 one first though it came second - each naming
// its own user (not one its stream id spells), plan, priority, caller and
// label; the key's next free slot goes to the first listed, and the one
// left moves up to place 1.
func TestAdminPoolKeyListsTheWaiters(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			e := newPoolWaitEnv(t, b)
			gpt := map[string]string{"model": "gpt-4o"}
			holder, lowUser, highUser := newUser(), "u/é%2F:"+newUser(), newUser()
			held, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: holder, Plan: "low", Pools: gpt})
			if err != nil || !held.Granted {
				t.Fatalf("holder: %+v, %v", held, err)
			}
			granted := make(chan string, 2)

			// The priority-0 acquire's stream id is the holder's user id:
			// it must still be listed under its own user.
			e.waitFor(t, limiter.AcquireRequest{UserID: lowUser, Plan: "low", StreamID: holder, Pools: gpt}, granted)
			e.awaitWaiters(t, 1)
			e.waitFor(t, limiter.AcquireRequest{UserID: highUser, Plan: "high", StreamID: "w-high", Caller: "chat-api", Label: "pod-7", Pools: gpt}, granted)
			got := e.awaitWaiters(t, 2)

			if got.Used != 1 || len(got.Holders) != 1 || got.Holders[0].UserID != holder {
				t.Errorf("holders: got %d %+v, want %s's stream alone", got.Used, got.Holders, holder)
			}
			want := []httpapi.AdminTicket{
				{UserID: highUser, StreamID: "w-high", Place: 1, Priority: 5, Plan: "high", Caller: "chat-api", Label: "pod-7"},
				{UserID: lowUser, StreamID: holder, Place: 2, Priority: 0, Plan: "low"},
			}
			for i, w := range got.Waiters {
				if w.UserID != want[i].UserID || w.StreamID != want[i].StreamID || w.Place != want[i].Place || w.Priority != want[i].Priority ||
					w.Plan != want[i].Plan || w.Caller != want[i].Caller || w.Label != want[i].Label {
					t.Errorf("waiter %d: got %+v, want %+v", i+1, w, want[i])
				}
				if w.WaitedMs < 0 || w.WaitedMs > 10_000 || w.WaitingSince.IsZero() || !w.ExpiresAt.After(w.WaitingSince) {
					t.Errorf("waiter %d: got waited %dms since %v, expiring %v; want a wait under 10s and an expiry after it started", i+1, w.WaitedMs, w.WaitingSince, w.ExpiresAt)
				}
			}
			if !got.Waiters[1].WaitingSince.Before(got.Waiters[0].WaitingSince) {
				t.Errorf("waiting since: got %v for the priority-0 waiter, %v for the priority-5 one; want the priority-0 one earlier (it came first)",
					got.Waiters[1].WaitingSince, got.Waiters[0].WaitingSince)
			}
			// Nobody waits for the holder's own slots: the user queue lists
			// nothing a stream id merely spells.
			if q := apitest.Decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(holder), token: viewerToken}), http.StatusOK).Queue; len(q) != 0 {
				t.Errorf("the holder's queue: got %+v, want none", q)
			}

			if _, err := e.lim.Release(context.Background(), holder, held.StreamID); err != nil {
				t.Fatal(err)
			}
			select {
			case stream := <-granted:
				if stream != "w-high" {
					t.Errorf("%s was granted the freed membership, want w-high (place 1)", stream)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("no waiter was granted the freed membership")
			}
			left := e.awaitWaiters(t, 1).Waiters[0]
			if left.UserID != lowUser || left.StreamID != holder || left.Place != 1 || left.Priority != 0 {
				t.Errorf("the waiter left: got %+v, want %s's stream %s at place 1, priority 0", left, lowUser, holder)
			}
		})
	}
}
