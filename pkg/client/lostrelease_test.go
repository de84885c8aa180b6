package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
)

// TestRealReleaseOfALostLeaseSparesTheSlotReacquiredUnderItsID: support
// frees a stream's slot, its lease is lost with ErrSlotLost, and the
// application acquires the stream again under its stream id (DESIGN §4:
// stop the stream or re-acquire). The lost lease's deferred Release must
// not free the new lease's slot: the user would hold one stream more than
// the plan allows, and the new lease would be lost at its next heartbeat.
// Whether the Client that re-acquires is the lost lease's or another.
func TestRealReleaseOfALostLeaseSparesTheSlotReacquiredUnderItsID(t *testing.T) {
	for _, tc := range []struct {
		name    string
		another bool
	}{
		{"re-acquired by the same client", false},
		{"re-acquired by another client", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReal(t)
			c := newClient(t, r.url)
			ctx := context.Background()
			user := "alice-" + newID()
			old, err := c.Acquire(ctx, user, "free", client.WithStreamID("chat-1"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.lim.ReleaseAll(ctx, user, "support-frees-the-slot"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-old.Lost():
			case <-time.After(3 * realInterval):
				t.Fatalf("Lost did not close within %s of the release", 3*realInterval)
			}
			if !errors.Is(old.Err(), client.ErrSlotLost) {
				t.Fatalf("got Err %v, want ErrSlotLost", old.Err())
			}

			again := c
			if tc.another {
				again = newClient(t, r.url)
			}
			cur, err := again.Acquire(ctx, user, "free", client.WithStreamID("chat-1"))
			if err != nil {
				t.Fatalf("re-acquire: %v", err)
			}
			if cur == old {
				t.Fatal("the re-acquire returned the lost lease")
			}
			if err := old.Release(ctx); err != nil {
				t.Errorf("Release of the lost lease: got %v, want nil", err)
			}
			if got := r.used(t, user); got != 1 {
				t.Errorf("after the lost lease's release the user holds %d slots, want 1: the re-acquired lease's", got)
			}
			switch other, err := c.Acquire(ctx, user, "free"); {
			case err == nil:
				t.Errorf("a second stream (%s) of a 1-stream plan was granted while the re-acquired lease is held", other.StreamID())
			case !client.IsLimited(err):
				t.Errorf("a second stream of a 1-stream plan while the re-acquired lease is held: got %v, want ErrLimitReached", err)
			}
			select {
			case <-cur.Lost():
				t.Errorf("the re-acquired lease was lost (%v): the lost lease's release freed its slot", cur.Err())
			case <-time.After(3 * realInterval):
			}
		})
	}
}

// TestReleaseOfALostLeaseIsSentOnlyWhereItsSlotMayBeHeld: a lost lease's
// Release frees what the limiter may still hold under its stream id for
// it: not when it answered that it holds nothing (slot_lost, a degraded
// lease refused on re-acquire), and never once the Client holds a lease
// acquired under the id since, whose slot it is.
func TestReleaseOfALostLeaseIsSentOnlyWhereItsSlotMayBeHeld(t *testing.T) {
	slotError := func(e httpapi.Error) func(f *fakeLimiter) {
		return func(f *fakeLimiter) {
			f.slotError = func(id string) *httpapi.Error {
				if id == "s" {
					return &e
				}
				return nil
			}
		}
	}
	for _, tc := range []struct {
		name     string
		degraded bool                 // the lease is granted degraded
		lose     func(f *fakeLimiter) // makes the limiter answer that loses it
		wantIs   error
		wantSent bool // by a Release with no lease of the id held since
	}{
		{"alive false", false, func(f *fakeLimiter) { delete(f.slots["u1"], "s") }, client.ErrSlotLost, false},
		{"per-slot slot_lost", false, slotError(httpapi.Error{Code: httpapi.CodeSlotLost, Message: "gone"}), client.ErrSlotLost, false},
		{"per-slot unknown_plan", false, slotError(httpapi.Error{Code: httpapi.CodeUnknownPlan, Message: "plan removed"}), client.ErrUnknownPlan, true},
		{"per-slot plan_not_allowed", false, slotError(httpapi.Error{Code: httpapi.CodePlanNotAllowed, Message: "not yours"}), client.ErrPlanNotAllowed, true},
		{"degraded, refused on re-acquire", true, func(f *fakeLimiter) {
			f.degraded = false
			f.slots["u1"] = map[string]bool{"a": true, "b": true, "c": true} // the user's three slots are taken
		}, client.ErrLimitReached, false},
	} {
		for _, reacquired := range []bool{false, true} {
			name := tc.name + ", released"
			if reacquired {
				name = tc.name + ", re-acquired first"
			}
			t.Run(name, func(t *testing.T) {
				f := newFake(t)
				f.degraded = tc.degraded
				c := newClient(t, f.URL())
				ctx := context.Background()
				lease, err := c.Acquire(ctx, "u1", "paid", client.WithStreamID("s"))
				if err != nil {
					t.Fatal(err)
				}
				f.set(tc.lose)
				select {
				case <-lease.Lost():
				case <-time.After(2 * time.Second):
					t.Fatal("Lost did not close")
				}
				if !errors.Is(lease.Err(), tc.wantIs) {
					t.Fatalf("got Err %v, want %v", lease.Err(), tc.wantIs)
				}
				wantSent := tc.wantSent
				if reacquired {
					f.set(func(f *fakeLimiter) {
						f.slotError = nil
						delete(f.slots["u1"], "a")
					})
					cur, err := c.Acquire(ctx, "u1", "paid", client.WithStreamID("s"))
					if err != nil {
						t.Fatalf("re-acquire: %v", err)
					}
					if cur == lease {
						t.Fatal("the re-acquire returned the lost lease")
					}
					wantSent = false
				}
				var before int
				f.set(func(f *fakeLimiter) { before = f.releases })
				if err := lease.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
				var sent int
				var held bool
				f.set(func(f *fakeLimiter) { sent, held = f.releases-before, f.slots["u1"]["s"] })
				if want := map[bool]int{false: 0, true: 1}[wantSent]; sent != want {
					t.Errorf("releases sent by the lost lease's Release: got %d, want %d", sent, want)
				}
				if reacquired && !held {
					t.Error("the slot re-acquired under the stream id was freed by the lost lease's Release")
				}
			})
		}
	}
}
