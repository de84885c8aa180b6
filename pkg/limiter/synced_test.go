package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestSyncReplicas: with redis.syncReplicas a grant stands when enough
// replicas confirm it; when fewer do (each cluster master has one replica,
// standalone none) it is marked Unsynced and kept on an Open plan, and on
// a Closed plan refused with ErrUnavailable and its slot released.
func TestSyncReplicas(t *testing.T) {
	tests := []struct {
		name         string
		backend      limitertest.Backend
		replicas     int
		plan         string
		wantUnsynced bool
		wantErr      error
	}{
		{"one replica confirms on the cluster", limitertest.RedisCluster, 1, "closed", false, nil},
		{"two replicas wanted on the cluster, Open keeps the grant", limitertest.RedisCluster, 2, "three", true, nil},
		{"two replicas wanted on the cluster, Closed refuses", limitertest.RedisCluster, 2, "closed", true, limiter.ErrUnavailable},
		{"a standalone server has no replica, Closed refuses", limitertest.Standalone, 1, "closed", true, limiter.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, limitertest.Options{Backend: tt.backend, Redis: cluster.Options{Timeout: time.Second}})
			lim := limiter.New(e.redis, e.table, limiter.Options{Keys: e.keys, SyncReplicas: tt.replicas})
			user := newUser(t)
			res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: tt.plan, StreamID: "s"})
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("Acquire err = %v, want %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, limiter.ErrUnconfirmed) {
				t.Errorf("Acquire err = %v; want it to say the replicas did not confirm the slot (ErrUnconfirmed), not only that Redis is unavailable", err)
			}
			if res.Unsynced != tt.wantUnsynced {
				t.Errorf("Unsynced = %v, want %v", res.Unsynced, tt.wantUnsynced)
			}
			if res.Granted != (tt.wantErr == nil) {
				t.Errorf("Granted = %v, want %v", res.Granted, tt.wantErr == nil)
			}
			slots, err := e.lim.Slots(context.Background(), user)
			if err != nil {
				t.Fatal(err)
			}
			if held := len(slots.Slots) == 1; held != (tt.wantErr == nil) {
				t.Errorf("slots held after the acquire: %+v; want the slot kept only when granted", slots.Slots)
			}
		})
	}
}

// TestARetryWhoseReplicasDoNotConfirmKeepsTheRunningStream: a stream runs
// (its slot granted on one replica); a retry of it on another replica
// whose WAIT is not confirmed (a Closed plan wanting 2 replicas, the
// cluster's masters having one each) is refused, and leaves only its own
// share of the slot: the running stream keeps it.
func TestARetryWhoseReplicasDoNotConfirmKeepsTheRunningStream(t *testing.T) {
	t.Parallel()
	prefix := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	a := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: time.Second},
		Limiter: limiter.Options{Keys: prefix}})
	b := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Addrs: a.Redis.Addrs(), Timeout: time.Second},
		Limiter: limiter.Options{Keys: prefix, SyncReplicas: 2}})
	ctx := context.Background()
	user := newUser(t)
	if res, err := a.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "closed", StreamID: "s"}); err != nil || !res.Granted {
		t.Fatalf("the running stream: %+v, %v", res, err)
	}
	if res, err := b.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "closed", StreamID: "s"}); !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("the retry, unconfirmed: %+v, %v; want ErrUnavailable", res, err)
	}
	if beat, err := a.Limiter.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "closed", StreamID: "s"}); err != nil || !beat.Alive {
		t.Fatalf("the running stream's heartbeat after its retry was refused: %+v, %v; want alive", beat, err)
	}
}

// TestAnUnconfirmedGrantIsGivenBackThoughItsCallerLeft: on a Closed plan
// with redis.syncReplicas 1 and no replica, a grant's WAIT runs for half
// the call's deadline and finds it unconfirmed; the slot is given back
// even when the caller left during that WAIT, for an acquire that waited
// in the user's queue, under an id the limiter made (which no one else
// can release) or the caller's own, and for one that did not wait, under
// an id the limiter made. (One that did not wait, under its own id, is
// answered its context's error before the WAIT's, not knowing whether
// Redis ran it: the caller retries under the id or releases it.)
func TestAnUnconfirmedGrantIsGivenBackThoughItsCallerLeft(t *testing.T) {
	t.Parallel()
	plans := []tiers.Tier{
		{Plan: "closed-one", MaxConcurrentStreams: 1, SlotTTL: 20 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailClosed, MaxWait: 10 * time.Second},
		{Plan: "open-one", MaxConcurrentStreams: 1, SlotTTL: 20 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
	}
	// A 2s deadline: a WAIT takes 1s.
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.Standalone, Tiers: plans,
		Redis: cluster.Options{Timeout: 2 * time.Second}, Limiter: limiter.Options{SyncReplicas: 1}})
	c, err := s.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, stream string
		waits        bool
	}{
		{"waited, an id the limiter made", "", true},
		{"waited, the caller's own id", "mine", true},
		{"not waited, an id the limiter made", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			user := newUser(t)
			key, err := s.Keys.UserKey(user)
			if err != nil {
				t.Fatal(err)
			}
			req := limiter.AcquireRequest{UserID: user, Plan: "closed-one", StreamID: tc.stream}
			leave := func() {}
			acquireCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			if tc.waits {
				// The user's one slot, held under an Open plan (kept though
				// unconfirmed), freed once the acquire waits.
				if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "open-one", StreamID: "held"}); err != nil || !res.Granted {
					t.Fatalf("the holder: %+v, %v", res, err)
				}
				// The caller leaves as soon as the wait is granted the slot
				// (seen in Redis), while that grant's WAIT runs.
				req.Wait = 5 * time.Second
				req.OnWait = func(time.Duration) {
					go func() { _, _ = s.Limiter.Release(ctx, user, "held") }()
					go func() {
						defer cancel()
						for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
							ids, err := c.Do(ctx, c.B().Zrange().Key(key).Min("0").Max("-1").Build()).AsStrSlice()
							if err == nil && len(ids) == 1 && ids[0] != "held" {
								return
							}
						}
						t.Error("the waiter was never granted the freed slot")
					}()
				}
			} else {
				leave = func() { time.AfterFunc(300*time.Millisecond, cancel) } // into the WAIT
			}
			leave()
			start := time.Now()
			res, err := s.Limiter.Acquire(acquireCtx, req)
			t.Logf("answered after %v: granted %v waited %v, %v", time.Since(start), res.Granted, res.Waited, err)
			if err == nil || res.Granted {
				t.Fatalf("the acquire: %+v, %v; want it refused, unconfirmed or its caller gone", res, err)
			}
			// A waiter's grant comes from its queue's call, whose WAIT runs
			// on whatever the waiter does: one that left meanwhile is
			// answered as one that left, not as the limiter failing. (One
			// that did not wait is answered whichever comes first, its
			// context's end or the WAIT's.)
			if tc.waits && !errors.Is(err, context.Canceled) {
				t.Errorf("the acquire: %v; want its caller's leaving (context.Canceled), as it left before the answer, not the limiter failing", err)
			}
			// Its grant went unconfirmed all the same: counted so
			// (limiter_acquire_unsynced_total), whoever left.
			if tc.waits && !res.Unsynced {
				t.Errorf("the acquire: %+v; want Unsynced, as its replicas did not confirm the grant it gave back", res)
			}
			time.Sleep(1500 * time.Millisecond) // past its WAIT, and any give-back beside the answer
			slots, err := s.Limiter.Slots(ctx, user)
			if err != nil {
				t.Fatal(err)
			}
			if len(slots.Slots) != 0 {
				t.Errorf("the user holds %+v after the refused acquire whose caller left; want nothing (given back), not a slot for its 20s TTL", slots.Slots)
			}
		})
	}
}
