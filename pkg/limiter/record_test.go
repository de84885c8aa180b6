package limiter_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
)

// retiring is a plan the test deletes while a slot is held under it. Its
// TTL is unlike every test tier's, so an expiry shows whose TTL it follows.
var retiring = tiers.Tier{Plan: "retiring", MaxConcurrentStreams: 1, SlotTTL: 7 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailClosed}

// withTiers returns a limiter on e's Redis enforcing only list: a replica
// that (re)started with that table.
func withTiers(t *testing.T, e *env, list []tiers.Tier) *limiter.Limiter {
	t.Helper()
	table := tiers.NewTable()
	if err := table.Replace(list); err != nil {
		t.Fatal(err)
	}
	return limiter.New(e.redis, table, limiter.Options{Keys: e.keys})
}

// records returns the slot records of user: stream id → record.
func (e *env) records(t *testing.T, user string) map[string]string {
	t.Helper()
	raw := e.raw(t)
	got, err := raw.Do(context.Background(), raw.B().Hgetall().Key(keys.SlotRecords(e.key(t, user))).Build()).AsStrMap()
	if err != nil {
		t.Fatalf("HGETALL of the slot records: %v", err)
	}
	return got
}

// expiryMs returns the PEXPIRETIME of key.
func (e *env) expiryMs(t *testing.T, key string) int64 {
	t.Helper()
	raw := e.raw(t)
	at, err := raw.Do(context.Background(), raw.B().Pexpiretime().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("PEXPIRETIME %s: %v", key, err)
	}
	return at
}

// TestAHeldSlotOutlivesItsPlanOnAReplicaThatNeverSawIt: the slot's TTL is
// stored with it, so a replica whose table never held the plan (one that
// restarted after the plan was deleted) keeps the slot alive by that TTL.
func TestAHeldSlotOutlivesItsPlanOnAReplicaThatNeverSawIt(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		ctx := context.Background()
		user := newUser(t)
		first := withTiers(t, e, append([]tiers.Tier{retiring}, limitertest.Tiers()...))
		if res, err := first.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: retiring.Plan, StreamID: "s"}); err != nil || !res.Granted {
			t.Fatalf("Acquire under %s: got %+v, %v; want granted", retiring.Plan, res, err)
		}
		if err := first.Tiers().Replace(limitertest.Tiers()); err != nil { // the plan is deleted
			t.Fatal(err)
		}

		restarted := withTiers(t, e, limitertest.Tiers())
		for _, plan := range []string{retiring.Plan, "short"} {
			before := time.Now()
			res, err := restarted.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: plan, StreamID: "s"})
			if err != nil || !res.Alive || res.Degraded {
				t.Fatalf("heartbeat naming plan %s on a replica without %s: got %+v, %v; want alive from Redis", plan, retiring.Plan, res, err)
			}
			if lo, hi := before.Add(retiring.SlotTTL-time.Second), time.Now().Add(retiring.SlotTTL+time.Second); res.ExpiresAt.Before(lo) || res.ExpiresAt.After(hi) {
				t.Errorf("expiry after a heartbeat naming plan %s: got %v, want about now + %v (the slot's own TTL)", plan, res.ExpiresAt, retiring.SlotTTL)
			}
		}
		if _, err := restarted.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: retiring.Plan}); !errors.Is(err, limiter.ErrUnknownPlan) {
			t.Errorf("acquire under the deleted plan: got %v, want ErrUnknownPlan (limits apply at acquire)", err)
		}
		if got := e.records(t, user); len(got) != 1 || lua.ParseRecord(got["s"]).TTL != retiring.SlotTTL || lua.ParseRecord(got["s"]).Plan != retiring.Plan {
			t.Errorf("slot records: got %v, want s → 7000 (its TTL in ms) of plan %s", got, retiring.Plan)
		}
		// The same instant. The embedded store keeps a TTL relative to
		// when it was set, so what it reads back drifts by a few ms.
		slack := int64(0)
		if e.redis.Embedded() {
			slack = 100
		}
		key := e.key(t, user)
		if slots, records := e.expiryMs(t, key), e.expiryMs(t, keys.SlotRecords(key)); slots <= 0 || records < slots-slack || records > slots+slack {
			t.Errorf("PEXPIRETIME of the records %d, of the slots %d: want the same", records, slots)
		}
	})
}

// TestASlotWithoutARecordFallsBackToTheRequestTTL: slots taken before
// records existed have none; a heartbeat keeps them by the request's tier
// and records that TTL, and answers unknown_plan only when it has neither.
func TestASlotWithoutARecordFallsBackToTheRequestTTL(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		ctx := context.Background()
		user := newUser(t)
		held := e.acquire(t, user, "three", "s")
		raw := e.raw(t)
		if err := raw.Do(ctx, raw.B().Del().Key(keys.SlotRecords(e.key(t, user))).Build()).Error(); err != nil {
			t.Fatal(err)
		}

		_, err := e.lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "gold", StreamID: "s"})
		if !errors.Is(err, limiter.ErrUnknownPlan) {
			t.Fatalf("heartbeat of a slot without a record under an unknown plan: got %v, want ErrUnknownPlan", err)
		}
		res, err := e.lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: "s"})
		if err != nil || !res.Alive {
			t.Fatalf("heartbeat of a slot without a record: got %+v, %v; want alive", res, err)
		}
		if !res.ExpiresAt.Equal(held.ExpiresAt) {
			t.Errorf("expiry: got %v, want unchanged %v (the 300ms TTL of plan short does not move it back)", res.ExpiresAt, held.ExpiresAt)
		}
		if got := e.records(t, user); got["s"] != "300" {
			t.Errorf("slot records: got %v, want s → 300 (the TTL it is now kept by)", got)
		}
	})
}

// TestNoRecordOutlivesItsSlot: release, release_all and pruning remove a
// slot's record in the script that removes the slot.
func TestNoRecordOutlivesItsSlot(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		ctx := context.Background()
		cases := []struct {
			name   string
			left   int // records left of the slots s and t
			remove func(user string)
		}{
			{"a release", 1, func(user string) {
				if res, err := e.lim.Release(ctx, user, "s"); err != nil || !res.Released {
					t.Fatalf("Release: got %+v, %v; want released", res, err)
				}
			}},
			{"a release_all", 0, func(user string) {
				if ids, err := e.lim.ReleaseAll(ctx, user, newAuditID()); err != nil || len(ids) != 2 {
					t.Fatalf("ReleaseAll: got %v, %v; want 2 released", ids, err)
				}
			}},
			{"expiry, pruned by an acquire", 0, func(user string) {
				time.Sleep(400 * time.Millisecond)
				e.acquire(t, user, "short", "later")
				if _, err := e.lim.Release(ctx, user, "later"); err != nil {
					t.Fatal(err)
				}
			}},
			{"expiry, pruned by a heartbeat", 0, func(user string) {
				time.Sleep(400 * time.Millisecond)
				if _, err := e.lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: "s"}); !errors.Is(err, limiter.ErrSlotLost) {
					t.Fatalf("Heartbeat of an expired slot: got %v, want ErrSlotLost", err)
				}
			}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				user := newUser(t)
				e.acquire(t, user, "short", "s")
				e.acquire(t, user, "short", "t")
				if got := e.records(t, user); lua.ParseRecord(got["s"]).TTL != 300*time.Millisecond || lua.ParseRecord(got["t"]).TTL != 300*time.Millisecond {
					t.Fatalf("slot records after acquiring s and t: got %v, want both with a TTL of 300ms", got)
				}
				tc.remove(user)
				if got := e.records(t, user); len(got) != tc.left || got["s"] != "" {
					t.Errorf("slot records after %s of s: got %v, want %d and none for s", tc.name, got, tc.left)
				}
			})
		}
	})
}

// TestASlotRecordsItsCaller: the caller named by the API, the plan and the
// label go into the slot's record after its TTL and start, and the
// heartbeat still reads the TTL.
func TestASlotRecordsItsCaller(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		ctx := context.Background()
		user := newUser(t)
		if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: "s", Caller: "chat-api", Label: "pod-7"}); err != nil || !res.Granted {
			t.Fatalf("Acquire: got %+v, %v; want granted", res, err)
		}
		e.acquire(t, user, "three", "anonymous")
		got := e.records(t, user)
		if s, a := lua.ParseRecord(got["s"]), lua.ParseRecord(got["anonymous"]); s.TTL != 10*time.Second || s.Record != (lua.Record{Caller: "chat-api", Plan: "three", Label: "pod-7"}) ||
			a.TTL != 10*time.Second || a.Record != (lua.Record{Plan: "three"}) || s.StartedAtMs == 0 || a.StartedAtMs < s.StartedAtMs {
			t.Errorf("slot records: got %v, want s → 10s, started, caller chat-api, plan three, label pod-7, and anonymous → 10s, started, plan three", got)
		}
		if !strings.HasPrefix(got["s"], "10000;started=") {
			t.Errorf("record of s: got %q, want its TTL first, then its start (heartbeats read the leading digits)", got["s"])
		}
		if res, err := e.lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: "s"}); err != nil || !res.Alive {
			t.Fatalf("heartbeat of a slot whose record names its caller: got %+v, %v; want alive", res, err)
		} else if left := time.Until(res.ExpiresAt); left < 5*time.Second {
			t.Errorf("expiry after the heartbeat: %v left, want about 10s (the TTL before the record's fields)", left)
		}
	})
}

// A slot is its caller's while it lives: another caller's release of it
// is refused ErrNotSlotHolder. Once it expired unreleased it is nobody's
// (DESIGN §19: its holder crashed or let it lapse): that release answers
// not held, as a heartbeat or acquire would, and removes it, rather than
// sending the caller to support for a slot no one holds.
func TestAnExpiredSlotOfAnotherCallerIsNotHeld(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		ctx := context.Background()
		user := newUser(t)
		if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "short", StreamID: "s", Caller: "ops"}); err != nil || !res.Granted {
			t.Fatalf("Acquire: got %+v, %v; want granted", res, err)
		}
		if res, err := e.lim.ReleaseAs(ctx, "chat", user, "s"); !errors.Is(err, limiter.ErrNotSlotHolder) || res.Released {
			t.Fatalf("chat's release of ops's live slot: %+v, %v; want ErrNotSlotHolder", res, err)
		}
		time.Sleep(400 * time.Millisecond) // > the 300ms TTL
		res, err := e.lim.ReleaseAs(ctx, "chat", user, "s")
		if err != nil || res.Released {
			t.Fatalf("chat's release of ops's expired slot: %+v, %v; want not held, no error", res, err)
		}
		if got := e.records(t, user); len(got) != 0 {
			t.Errorf("records after: %v, want none (the expired slot removed with its record)", got)
		}
	})
}

// TestAcquireKeepsTheKeysOneToTwoTTLsPastTheLatestSlot: a grant moves both
// keys' expiry only when it must (to two TTLs past the slot), never back,
// and never lets them expire within one TTL of a slot; a denial leaves it.
func TestAcquireKeepsTheKeysOneToTwoTTLsPastTheLatestSlot(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		// The embedded store keeps a TTL relative to when it was set, so
		// what it reads back drifts: a few ms, and over 100 on a machine
		// busy with other tests.
		slack := int64(5)
		if e.redis.Embedded() {
			slack = 500
		}
		user := newUser(t)
		key := e.key(t, user)
		ttl := int64(10_000) // plan three
		check := func(when string, latest, notBefore int64) int64 {
			t.Helper()
			slots, records := e.expiryMs(t, key), e.expiryMs(t, keys.SlotRecords(key))
			if records < slots-slack || records > slots+slack {
				t.Errorf("%s: PEXPIRETIME of the records %d, of the slots %d: want the same", when, records, slots)
			}
			if slots < latest+ttl-slack || slots > latest+2*ttl+slack {
				t.Errorf("%s: keys expire at %d, want one to two TTLs (%dms) past the latest slot's %d", when, slots, ttl, latest)
			}
			if slots < notBefore-slack {
				t.Errorf("%s: keys expire at %d, before the %d they had: an expiry moved back", when, slots, notBefore)
			}
			return slots
		}
		ms := func(r limiter.AcquireResult) int64 { return r.ExpiresAt.UnixMilli() }

		first := e.acquire(t, user, "three", "a")
		at := check("first grant", ms(first), 0)
		time.Sleep(20 * time.Millisecond)
		second := e.acquire(t, user, "three", "b")
		if !second.Granted || ms(second) <= ms(first) {
			t.Fatalf("second grant: %+v, want granted after the first's %v", second, first.ExpiresAt)
		}
		at = check("second grant", ms(second), at)
		again := e.acquire(t, user, "three", "a") // held: extended
		at = check("a held stream's acquire", max(ms(again), ms(second)), at)
		e.acquire(t, user, "three", "c")
		if res := e.acquire(t, user, "three", "d"); res.Granted {
			t.Fatalf("a 4th stream on a limit-3 plan: %+v, want denied", res)
		}
		if got := e.expiryMs(t, key); got < at-slack || got > at+slack {
			t.Errorf("after a denial the keys expire at %d, want %d as before", got, at)
		}
	})
}

// TestAnExtensionAnswersThePlanTheStreamWasTakenUnder: a retry of a held
// stream naming another plan (the user's plan changed between the two) is
// an extension of the slot as it was taken: the answer gives that plan's
// limit and tier, not a limit of 1 beside 2 used that looks like a grant
// past it.
func TestAnExtensionAnswersThePlanTheStreamWasTakenUnder(t *testing.T) {
	lim := limitertest.New(t, limitertest.Options{}).Limiter
	ctx := context.Background()
	user := newUser(t)
	for _, id := range []string{"a", "b"} {
		if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: id}); err != nil || !res.Granted {
			t.Fatalf("acquire %s: %+v, %v", id, res, err)
		}
	}
	res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "one", StreamID: "b"})
	if err != nil || !res.Granted || res.Used != 2 || res.Limit != 3 || res.Tier.Plan != "three" || res.WouldRefuse != "" {
		t.Fatalf("a retry of b under plan one: %+v, %v; want granted, 2 of plan three's 3", res, err)
	}
	if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "one", StreamID: "c"}); err != nil || res.Granted {
		t.Errorf("a new stream under plan one, 2 held: %+v, %v; want refused", res, err)
	}
}
