package limiter_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestAnOverrideJudgesTheUsersAcquires: support's override replaces the
// plan's limit in the acquire that counts the slots, shows in the
// listing with who set it and why, is counted (never per user), and once
// removed the plan's limit applies again to the next acquire while held
// slots are kept.
func TestAnOverrideJudgesTheUsersAcquires(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		ctx := context.Background()
		user := newUser(t)
		if n, err := e.lim.ActiveOverrides(ctx); err != nil || n != 0 {
			t.Fatalf("ActiveOverrides before any: got %d, %v; want 0", n, err)
		}
		set, err := e.lim.SetOverride(ctx, user, limiter.OverrideRequest{MaxConcurrentStreams: 2, For: time.Hour, Actor: "opal", Reason: "ticket 1"})
		if err != nil {
			t.Fatal(err)
		}
		if set.MaxConcurrentStreams != 2 || set.Actor != "opal" || set.Reason != "ticket 1" || set.ExpiresAt.Sub(set.SetAt) != time.Hour || set.TTL != time.Hour {
			t.Fatalf("SetOverride: got %+v, want 2 streams for an hour, by opal for ticket 1", set)
		}
		for _, s := range []string{"a", "b"} {
			if res := e.acquire(t, user, "one", s); !res.Granted || !res.Overridden || res.Limit != 2 {
				t.Fatalf("acquire %s on plan one (limit 1) under an override of 2: got %+v, want granted, overridden, limit 2", s, res)
			}
		}
		if res := e.acquire(t, user, "one", "c"); res.Granted || !res.Overridden || res.Limit != 2 || res.Used != 2 {
			t.Fatalf("3rd acquire under an override of 2: got %+v, want denied at 2 of 2, overridden", res)
		}
		listed, err := e.lim.Slots(ctx, user)
		if err != nil {
			t.Fatal(err)
		}
		if o := listed.Override; o == nil || o.MaxConcurrentStreams != 2 || o.Actor != "opal" || o.Reason != "ticket 1" || !o.ExpiresAt.Equal(set.ExpiresAt) || o.TTL <= 0 || o.TTL > time.Hour {
			t.Fatalf("listed override: got %+v, want the one set, with time left", listed.Override)
		}
		if n, err := e.lim.ActiveOverrides(ctx); err != nil || n != 1 {
			t.Errorf("ActiveOverrides with one set: got %d, %v; want 1", n, err)
		}

		removed, err := e.lim.RemoveOverride(ctx, user)
		if err != nil || !removed {
			t.Fatalf("RemoveOverride: got %v, %v; want removed", removed, err)
		}
		if res := e.acquire(t, user, "one", "c"); res.Granted || res.Overridden || res.Limit != 1 || res.Used != 2 {
			t.Fatalf("acquire after the removal: got %+v, want denied by plan one's limit of 1, the 2 held slots kept", res)
		}
		if listed, err := e.lim.Slots(ctx, user); err != nil || listed.Override != nil || listed.Used != 2 {
			t.Fatalf("listing after the removal: got %+v, %v; want no override and the 2 slots", listed, err)
		}
		if n, err := e.lim.ActiveOverrides(ctx); err != nil || n != 0 {
			t.Errorf("ActiveOverrides after the removal: got %d, %v; want 0", n, err)
		}
		if removed, err := e.lim.RemoveOverride(ctx, user); err != nil || removed {
			t.Errorf("RemoveOverride again: got %v, %v; want false (none in force)", removed, err)
		}
	})
}

// TestOverridesOutOfBoundsAreRefused: the limit is bounded like a tier's,
// the duration, actor and reason too; nothing is stored.
func TestOverridesOutOfBoundsAreRefused(t *testing.T) {
	e := newEnv(t, limitertest.Options{})
	ctx := context.Background()
	ok := limiter.OverrideRequest{MaxConcurrentStreams: 5, For: time.Hour, Actor: "opal", Reason: "r"}
	for _, tc := range []struct {
		name string
		edit func(*limiter.OverrideRequest)
		want string
	}{
		{"a negative limit", func(r *limiter.OverrideRequest) { r.MaxConcurrentStreams = -1 }, "must be 0 to 1000, got -1"},
		{"a limit over a tier's bound", func(r *limiter.OverrideRequest) { r.MaxConcurrentStreams = tiers.MaxConcurrentStreams + 1 }, "must be 0 to 1000, got 1001"},
		{"under a minute", func(r *limiter.OverrideRequest) { r.For = 59 * time.Second }, "must be 1m0s to 720h0m0s, got 59s"},
		{"over 30 days", func(r *limiter.OverrideRequest) { r.For = 31 * 24 * time.Hour }, "got 744h0m0s"},
		{"no actor", func(r *limiter.OverrideRequest) { r.Actor = "" }, "the actor must be 1 to 256 bytes"},
		{"no reason", func(r *limiter.OverrideRequest) { r.Reason = "" }, "the reason must be 1 to 4096 bytes"},
		{"a reason over 4 KiB", func(r *limiter.OverrideRequest) { r.Reason = strings.Repeat("r", 4097) }, "got 4097"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := newUser(t)
			req := ok
			tc.edit(&req)
			_, err := e.lim.SetOverride(ctx, user, req)
			if !errors.Is(err, limiter.ErrInvalidOverride) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("SetOverride(%+v): got %v, want ErrInvalidOverride saying %q", req, err, tc.want)
			}
			if listed, err := e.lim.Slots(ctx, user); err != nil || listed.Override != nil {
				t.Errorf("listing after a refused override: got %+v, %v; want none stored", listed.Override, err)
			}
		})
	}
	if _, err := e.lim.SetOverride(ctx, "a}b", ok); !errors.Is(err, limiter.ErrInvalidUserID) {
		t.Errorf("SetOverride for user a}b: got %v, want ErrInvalidUserID", err)
	}
}

// TestSlotsShowWhoHoldsWhatSinceWhen: the listing carries each slot's
// start (Redis time), age, caller, plan and label; a label the limiter
// cannot show is refused before any slot is taken.
func TestSlotsShowWhoHoldsWhatSinceWhen(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		ctx := context.Background()
		user := newUser(t)
		before := time.Now()
		if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: "s", Caller: "chat-api", Label: "gpt-4o@pod-7"}); err != nil || !res.Granted {
			t.Fatalf("Acquire: got %+v, %v", res, err)
		}
		time.Sleep(50 * time.Millisecond)
		if _, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Label: "two words"}); !errors.Is(err, limiter.ErrInvalidLabel) {
			t.Fatalf("Acquire with a label holding a space: got %v, want ErrInvalidLabel", err)
		}
		if _, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Label: strings.Repeat("l", 129)}); !errors.Is(err, limiter.ErrInvalidLabel) || !strings.Contains(err.Error(), "the limit is 128") {
			t.Fatalf("Acquire with a 129-byte label: got %v, want ErrInvalidLabel naming the limit", err)
		}
		listed, err := e.lim.Slots(ctx, user)
		if err != nil || len(listed.Slots) != 1 {
			t.Fatalf("Slots: got %+v, %v; want the one slot (the refused acquires took none)", listed, err)
		}
		s := listed.Slots[0]
		if s.Caller != "chat-api" || s.Plan != "three" || s.Label != "gpt-4o@pod-7" {
			t.Errorf("slot: got caller %q plan %q label %q, want chat-api, three, gpt-4o@pod-7", s.Caller, s.Plan, s.Label)
		}
		if s.StartedAt.Before(before.Add(-time.Second)) || s.StartedAt.After(time.Now().Add(time.Second)) {
			t.Errorf("started at %v: want about %v (Redis time)", s.StartedAt, before)
		}
		if s.Age < 40*time.Millisecond || s.Age > 5*time.Second || s.TTL <= 0 {
			t.Errorf("age %v, time left %v: want at least the 50ms slept, and time left", s.Age, s.TTL)
		}
	})
}

// TestAHeartbeatCountsTheUsersSlots: a heartbeat answers how many live
// slots the user holds (the live-streams metric) and the plan it was
// judged by, empty for a plan this replica does not know.
func TestAHeartbeatCountsTheUsersSlots(t *testing.T) {
	eachBackend(t, false, func(t *testing.T, e *env) {
		ctx := context.Background()
		user := newUser(t)
		e.acquire(t, user, "three", "a")
		e.acquire(t, user, "three", "b")
		res, err := e.lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: "a"})
		if err != nil || res.Used != 2 || res.Plan != "three" {
			t.Fatalf("Heartbeat: got %+v, %v; want alive with used 2, plan three", res, err)
		}
		results, errs := e.lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{{UserID: user, Plan: "gold", StreamID: "b"}, {UserID: user, Plan: "three", StreamID: "a"}})
		if errs[0] != nil || errs[1] != nil || results[0].Used != 2 || results[0].Plan != "" || results[1].Used != 2 || results[1].Plan != "three" {
			t.Fatalf("HeartbeatBatch: got %+v, %v; want both used 2, the unknown plan's labelled \"\"", results, errs)
		}
	})
}
