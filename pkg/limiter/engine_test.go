package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
)

func TestConcurrentAcquireGrantsExactlyTheLimit(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		var granted, maxUsed atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 500 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: fmt.Sprintf("s%d", i)})
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				if res.Degraded {
					t.Errorf("Acquire degraded: Redis did not answer within the deadline")
				}
				if res.Granted {
					granted.Add(1)
				}
				for {
					cur := maxUsed.Load()
					if int64(res.Used) <= cur || maxUsed.CompareAndSwap(cur, int64(res.Used)) {
						break
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		if got := granted.Load(); got != 3 {
			t.Errorf("granted = %d, want exactly 3", got)
		}
		if got := maxUsed.Load(); got > 3 {
			t.Errorf("max used seen = %d, want <= 3", got)
		}
	})
}

func TestAcquireIsIdempotentOnStreamID(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		first := e.acquire(t, user, "three", "stream-a")
		e.acquire(t, user, "three", "stream-b")
		again := e.acquire(t, user, "three", "stream-a")
		if !first.Granted || !again.Granted {
			t.Fatalf("granted = %v then %v, want both granted", first.Granted, again.Granted)
		}
		if again.Used != 2 {
			t.Errorf("used after retrying a held stream = %d, want 2 (unchanged)", again.Used)
		}
		if again.ExpiresAt.Before(first.ExpiresAt) {
			t.Errorf("retry moved expiry back from %v to %v", first.ExpiresAt, again.ExpiresAt)
		}
	})
}

func TestDenialCarriesRetryAfterOfEarliestSlot(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		held := e.acquire(t, user, "one", "held")
		time.Sleep(400 * time.Millisecond)
		denied := e.acquire(t, user, "one", "other")
		want := time.Until(held.ExpiresAt)
		if denied.Granted {
			t.Fatal("second stream granted on a limit-1 tier")
		}
		if denied.Used != 1 || denied.Limit != 1 {
			t.Errorf("denied used/limit = %d/%d, want 1/1", denied.Used, denied.Limit)
		}
		if diff := denied.RetryAfter - want; diff < -50*time.Millisecond || diff > 50*time.Millisecond {
			t.Errorf("RetryAfter = %v, want %v ± 50ms (time until the held slot expires)", denied.RetryAfter, want)
		}
	})
}

func TestRetryAfterAfterALoweredLimitWaitsForEnoughSlots(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		var held []limiter.AcquireResult
		for i := range 3 {
			held = append(held, e.acquire(t, user, "three", fmt.Sprintf("s%d", i)))
			time.Sleep(150 * time.Millisecond)
		}
		// The user's plan drops to one stream: all but one slot must expire
		// before a new one fits, so the wait is until the latest expires.
		// Until the third expires, as Redis's clock said during the call:
		// between what is left after it and what was left before it.
		before := time.Until(held[2].ExpiresAt)
		denied := e.acquire(t, user, "one", "new")
		after := time.Until(held[2].ExpiresAt)
		if denied.Granted || denied.Used != 3 || denied.Limit != 1 {
			t.Fatalf("acquire after the downgrade = %+v, want denied with used 3 of 1", denied)
		}
		if denied.RetryAfter < after-50*time.Millisecond || denied.RetryAfter > before+50*time.Millisecond {
			t.Errorf("RetryAfter = %v, want %v to %v ± 50ms (until the third slot expires)", denied.RetryAfter, after, before)
		}
	})
}

func TestUnreleasedSlotsExpireAndArePruned(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		for i := range 3 {
			e.acquire(t, user, "short", fmt.Sprintf("crashed-%d", i))
		}
		if res := e.acquire(t, user, "short", "blocked"); res.Granted {
			t.Fatal("a 4th stream was granted on a limit-3 tier")
		}
		time.Sleep(400 * time.Millisecond) // > TTL 300ms
		res := e.acquire(t, user, "short", "after")
		if !res.Granted || res.Used != 1 {
			t.Fatalf("after expiry: granted=%v used=%d, want granted with used 1", res.Granted, res.Used)
		}
		if res.Pruned != 3 {
			t.Errorf("pruned = %d, want 3 (the slots that expired unreleased)", res.Pruned)
		}
	})
}

func TestHeartbeatKeepsSlotAndKeyBeyondThreeTTLs(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		key := e.key(t, user)
		e.acquire(t, user, "short-one", "long-stream")
		deadline := time.Now().Add(4 * 300 * time.Millisecond) // 4×TTL
		for time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			if _, err := e.lim.Heartbeat(context.Background(), limiter.HeartbeatRequest{UserID: user, Plan: "short-one", StreamID: "long-stream"}); err != nil {
				t.Fatalf("Heartbeat: %v", err)
			}
			if res := e.acquire(t, user, "short-one", newUser(t)); res.Granted {
				t.Fatal("another stream was granted while the heartbeating one holds the only slot")
			}
		}
		pttl, err := e.raw(t).Do(context.Background(), e.raw(t).B().Pttl().Key(key).Build()).AsInt64()
		if err != nil || pttl <= 0 {
			t.Fatalf("key PTTL after 4×TTL of heartbeats = %d, %v; want a live key with an expiry", pttl, err)
		}
		score, err := e.raw(t).Do(context.Background(), e.raw(t).B().Zscore().Key(key).Member("long-stream").Build()).AsFloat64()
		if err != nil {
			t.Fatalf("slot missing after 4×TTL of heartbeats: %v", err)
		}
		if pttl < int64(score)-time.Now().UnixMilli() {
			t.Errorf("key expires (PTTL %dms) before its slot (score %v)", pttl, score)
		}
	})
}

func TestHeartbeatOnLostSlotNeverReAdds(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		cases := []struct {
			name  string
			setup func(user string)
		}{
			{"a stream never acquired", func(string) {}},
			{"a stream whose slot expired", func(user string) {
				e.acquire(t, user, "short", "s")
				time.Sleep(400 * time.Millisecond)
			}},
			{"a released stream", func(user string) {
				e.acquire(t, user, "short", "s")
				if _, err := e.lim.Release(context.Background(), user, "s"); err != nil {
					t.Fatal(err)
				}
			}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				user := newUser(t)
				tc.setup(user)
				_, err := e.lim.Heartbeat(context.Background(), limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: "s"})
				if !errors.Is(err, limiter.ErrSlotLost) {
					t.Fatalf("Heartbeat = %v, want ErrSlotLost", err)
				}
				n, err := e.raw(t).Do(context.Background(), e.raw(t).B().Zcard().Key(e.key(t, user)).Build()).AsInt64()
				if err != nil || n != 0 {
					t.Fatalf("slots after a lost heartbeat = %d, %v; want 0 (never re-added)", n, err)
				}
			})
		}
	})
}

func TestHeartbeatNeverShortensASlot(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		long := e.acquire(t, user, "three", "s") // 10s TTL
		// A heartbeat naming a 300ms-TTL plan keeps the slot by its own
		// 10s TTL: it never moves the expiry back.
		res, err := e.lim.Heartbeat(context.Background(), limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: "s"})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExpiresAt.Before(long.ExpiresAt) || res.ExpiresAt.After(long.ExpiresAt.Add(time.Second)) {
			t.Errorf("expiry after a heartbeat naming a shorter plan = %v, want at or just after %v", res.ExpiresAt, long.ExpiresAt)
		}
		score, _ := e.raw(t).Do(context.Background(), e.raw(t).B().Zscore().Key(e.key(t, user)).Member("s").Build()).AsFloat64()
		if int64(score) != res.ExpiresAt.UnixMilli() {
			t.Errorf("stored expiry = %v, want %d", score, res.ExpiresAt.UnixMilli())
		}
	})
}

func TestReleaseIsIdempotentAndReleaseAllEmptiesTheSet(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		ctx := context.Background()
		user := newUser(t)
		e.acquire(t, user, "three", "a")
		first, err := e.lim.Release(ctx, user, "a")
		if err != nil || !first.Released {
			t.Fatalf("first Release = %+v, %v; want released", first, err)
		}
		second, err := e.lim.Release(ctx, user, "a")
		if err != nil || second.Released {
			t.Fatalf("second Release = %+v, %v; want released false and no error", second, err)
		}
		for _, s := range []string{"x", "y", "z"} {
			e.acquire(t, user, "three", s)
		}
		ids, err := e.lim.ReleaseAll(ctx, user, newAuditID())
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(ids, ",") != "x,y,z" {
			t.Errorf("ReleaseAll = %v, want [x y z]", ids)
		}
		exists, _ := e.raw(t).Do(ctx, e.raw(t).B().Exists().Key(e.key(t, user)).Build()).AsInt64()
		if exists != 0 {
			t.Errorf("key exists after ReleaseAll")
		}
		slots, err := e.lim.Slots(ctx, user)
		if err != nil || slots.Used != 0 {
			t.Errorf("Slots after ReleaseAll = %+v, %v; want used 0", slots, err)
		}
		if again, err := e.lim.ReleaseAll(ctx, user, newAuditID()); err != nil || len(again) != 0 {
			t.Errorf("second ReleaseAll = %v, %v; want none and no error", again, err)
		}
	})
}

// A slot an earlier release granted to a user id it accepted and this one
// refuses at acquire (a format character) runs to its end on a replica of
// this one, as during a rolling update: its heartbeats keep it, support
// lists it and lifts the user's override, and its release frees it. Only
// a new slot or override is refused.
func TestASlotTakenUnderAnEarlierReleasesUserIDRunsToItsEnd(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		ctx := context.Background()
		user := newUser(t) + "\u200b"
		key, err := e.keys.HeldUserKey(user)
		if err != nil {
			t.Fatal(err)
		}
		e.acquire(t, newUser(t), "one", "warm") // loads the scripts
		c := e.raw(t)
		for _, id := range []string{"s1", "s2"} { // as an earlier release took them
			if got, err := lua.Acquire(ctx, c, key, id, 3, 10*time.Second, lua.Record{Plan: "three"}, false); err != nil || !got.Granted {
				t.Fatalf("%s: %+v, %v", id, got, err)
			}
		}
		if _, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three"}); !errors.Is(err, limiter.ErrInvalidUserID) {
			t.Fatalf("a new acquire: %v, want ErrInvalidUserID", err)
		}
		if _, err := e.lim.SetOverride(ctx, user, limiter.OverrideRequest{MaxConcurrentStreams: 5, For: time.Hour, Reason: "r", Actor: "a"}); !errors.Is(err, limiter.ErrInvalidUserID) {
			t.Fatalf("a new override: %v, want ErrInvalidUserID", err)
		}
		beat, err := e.lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: "s1"})
		if err != nil || !beat.Alive {
			t.Fatalf("Heartbeat = %+v, %v; want alive", beat, err)
		}
		batch, errs := e.lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{{UserID: user, Plan: "three", StreamID: "s2"}})
		if errs[0] != nil || !batch[0].Alive {
			t.Fatalf("HeartbeatBatch = %+v, %v; want alive", batch[0], errs[0])
		}
		if slots, err := e.lim.Slots(ctx, user); err != nil || slots.Used != 2 {
			t.Fatalf("Slots = %+v, %v; want 2 used", slots, err)
		}
		if _, err := e.lim.RemoveOverride(ctx, user); err != nil {
			t.Fatalf("RemoveOverride: %v", err)
		}
		if rel, err := e.lim.Release(ctx, user, "s1"); err != nil || !rel.Released {
			t.Fatalf("Release = %+v, %v; want released", rel, err)
		}
		if ids, err := e.lim.ReleaseAll(ctx, user, newAuditID()); err != nil || strings.Join(ids, ",") != "s2" {
			t.Fatalf("ReleaseAll = %v, %v; want [s2]", ids, err)
		}
		if slots, err := e.lim.Slots(ctx, user); err != nil || slots.Used != 0 {
			t.Fatalf("Slots after the releases = %+v, %v; want none used", slots, err)
		}
	})
}

func TestSlotsListsLiveSlots(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		e.acquire(t, user, "short", "gone")
		time.Sleep(400 * time.Millisecond)
		held := e.acquire(t, user, "three", "held")
		got, err := e.lim.Slots(context.Background(), user)
		if err != nil {
			t.Fatal(err)
		}
		if got.Used != 1 || len(got.Slots) != 1 || got.Slots[0].StreamID != "held" {
			t.Fatalf("Slots = %+v, want only the live slot \"held\"", got)
		}
		if !got.Slots[0].ExpiresAt.Equal(held.ExpiresAt) || got.Slots[0].TTL <= 9*time.Second || got.Slots[0].TTL > 10*time.Second {
			t.Errorf("slot = %+v, want expiry %v and a TTL just under 10s", got.Slots[0], held.ExpiresAt)
		}
	})
}

func TestZeroLimitPlanNeverGrants(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		res := e.acquire(t, newUser(t), "none", "")
		if res.Granted || res.Limit != 0 || res.RetryAfter <= 0 {
			t.Fatalf("Acquire on a 0-stream plan = %+v, want denied with limit 0 and a retry-after", res)
		}
	})
}

func TestScriptFlushFallsBackToEval(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		e.acquire(t, user, "three", "before")
		raw := e.raw(t)
		for _, node := range raw.Nodes() {
			if err := node.Do(context.Background(), node.B().ScriptFlush().Build()).Error(); err != nil {
				t.Fatalf("SCRIPT FLUSH: %v", err)
			}
		}
		res := e.acquire(t, user, "three", "after")
		if !res.Granted || res.Degraded || res.Used != 2 {
			t.Fatalf("Acquire after SCRIPT FLUSH = %+v, want granted (not degraded) with used 2", res)
		}
		results, errs := e.lim.HeartbeatBatch(context.Background(), []limiter.HeartbeatRequest{
			{UserID: user, Plan: "three", StreamID: "before"},
			{UserID: user, Plan: "three", StreamID: "after"},
		})
		for i, r := range results {
			if errs[i] != nil || !r.Alive || r.Degraded {
				t.Errorf("HeartbeatBatch after SCRIPT FLUSH, slot %d = %+v, %v; want alive from Redis", i, r, errs[i])
			}
		}
	})
}

func TestInvalidIDsAreRefused(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		ctx := context.Background()
		for _, id := range []string{"a}b", "{x}", "", strings.Repeat("a", 257), "a b", "a\nb", "a\x00b", "a\xffb"} {
			_, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: id, Plan: "three"})
			if !errors.Is(err, limiter.ErrInvalidUserID) {
				t.Errorf("Acquire(user %q) = %v, want ErrInvalidUserID", id, err)
			}
			if _, err := e.lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: id, Plan: "three", StreamID: "s"}); !errors.Is(err, limiter.ErrInvalidUserID) {
				t.Errorf("Heartbeat(user %q) = %v, want ErrInvalidUserID", id, err)
			}
			if _, err := e.lim.Release(ctx, id, "s"); !errors.Is(err, limiter.ErrInvalidUserID) {
				t.Errorf("Release(user %q) = %v, want ErrInvalidUserID", id, err)
			}
		}
		if _, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: "u", Plan: "three", StreamID: "a/b"}); !errors.Is(err, limiter.ErrInvalidStreamID) {
			t.Errorf("Acquire(stream a/b) = %v, want ErrInvalidStreamID", err)
		}
		if _, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: "u", Plan: "gold"}); !errors.Is(err, limiter.ErrUnknownPlan) {
			t.Errorf("Acquire(plan gold) = %v, want ErrUnknownPlan", err)
		}
	})
}

func TestKeyHashesLikeTheUserIDOnCluster(t *testing.T) {
	e := newEnv(t, clusterOptions(t))
	raw := e.raw(t)
	ctx := context.Background()
	for _, user := range []string{"u1", "ana@example.com", "ユーザー", "a:b:c", strings.Repeat("z", 256), newUser(t)} {
		keySlot, err := raw.Do(ctx, raw.B().ClusterKeyslot().Key(e.key(t, user)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		userSlot, err := raw.Do(ctx, raw.B().ClusterKeyslot().Key(user).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if keySlot != userSlot {
			t.Errorf("CLUSTER KEYSLOT of the key of %q = %d, of the id itself = %d", user, keySlot, userSlot)
		}
	}
}

func TestHeartbeatBatchOfAThousandSlotsOnCluster(t *testing.T) {
	e := newEnv(t, clusterOptions(t))
	ctx := context.Background()
	var reqs []limiter.HeartbeatRequest
	var wantAlive []bool
	for u := range 250 {
		user := fmt.Sprintf("%s-%d", newUser(t), u)
		for s := range 4 {
			stream := fmt.Sprintf("s%d", s)
			alive := s != 3 // the 4th stream of each user is never acquired
			if alive {
				e.acquire(t, user, "three", stream)
			}
			reqs = append(reqs, limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: stream})
			wantAlive = append(wantAlive, alive)
		}
	}
	results, errs := e.lim.HeartbeatBatch(ctx, reqs)
	if len(results) != 1000 || len(errs) != 1000 {
		t.Fatalf("HeartbeatBatch returned %d results, %d errors; want 1000 each", len(results), len(errs))
	}
	for i, res := range results {
		if res.StreamID != reqs[i].StreamID {
			t.Fatalf("result %d is for stream %q, want %q (order kept)", i, res.StreamID, reqs[i].StreamID)
		}
		if wantAlive[i] {
			if errs[i] != nil || !res.Alive || res.Degraded || time.Until(res.ExpiresAt) < 9*time.Second {
				t.Errorf("slot %d (%s/%s) = %+v, %v; want alive for ~10s", i, reqs[i].UserID, reqs[i].StreamID, res, errs[i])
			}
		} else if !errors.Is(errs[i], limiter.ErrSlotLost) || res.Alive {
			t.Errorf("slot %d (never acquired) = %+v, %v; want ErrSlotLost", i, res, errs[i])
		}
	}
}

func TestSlotsOfADeletedPlanAreKept(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		e.acquire(t, user, "one", "s")
		var rest []tiers.Tier
		for _, tier := range limitertest.Tiers() {
			if tier.Plan != "one" {
				rest = append(rest, tier)
			}
		}
		if err := e.table.Replace(rest); err != nil {
			t.Fatal(err)
		}
		res, err := e.lim.Heartbeat(context.Background(), limiter.HeartbeatRequest{UserID: user, Plan: "one", StreamID: "s"})
		if err != nil || !res.Alive {
			t.Errorf("heartbeat of a slot held under a deleted plan = %+v, %v; want alive (held slots are kept)", res, err)
		}
		if _, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "one"}); !errors.Is(err, limiter.ErrUnknownPlan) {
			t.Errorf("acquire under a deleted plan = %v, want ErrUnknownPlan", err)
		}
	})
}

// A re-acquire of a stream granted degraded (Rejoin) under a plan deleted
// since is judged by the plan's last definition, as the heartbeats of its
// streams are: its limit counts the stream and refuses one more. A plan
// that never was is still unknown.
func TestARejoinUnderADeletedPlanIsJudgedByItsLastDefinition(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		var rest []tiers.Tier
		for _, tier := range limitertest.Tiers() {
			if tier.Plan != "one" {
				rest = append(rest, tier)
			}
		}
		if err := e.table.Replace(rest); err != nil {
			t.Fatal(err)
		}
		res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "one", StreamID: "s", Rejoin: true})
		if err != nil || !res.Granted || res.Used != 1 || res.Limit != 1 || res.Tier.Plan != "one" {
			t.Fatalf("rejoin under a deleted plan = %+v, %v; want granted, 1 of 1 held under plan one", res, err)
		}
		res, err = e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "one", StreamID: "t", Rejoin: true})
		if err != nil || res.Granted || res.Used != 1 {
			t.Errorf("a second rejoin under the deleted 1-stream plan = %+v, %v; want refused, 1 held", res, err)
		}
		if _, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "never", Rejoin: true}); !errors.Is(err, limiter.ErrUnknownPlan) {
			t.Errorf("rejoin under a plan that never was = %v, want ErrUnknownPlan", err)
		}
	})
}
