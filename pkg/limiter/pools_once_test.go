package limiter_test

// A pooled acquire sends its user's script and its pool keys' at once
// (DESIGN §16): what it took and does not answer granted is removed
// before the answer, and an acquire waiting in one key's queue holds none
// of the keys after it.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/redis/rueidis"
)

// members is how many members the pool key pool=key holds.
func members(t *testing.T, s *limitertest.Stack, pool, key string) int64 {
	t.Helper()
	slots, err := s.Keys.PoolKey(pool, key)
	if err != nil {
		t.Fatal(err)
	}
	return zcard(t, s, slots)
}

// TestAPooledAcquireKeepsNothingItRefuses: an acquire whose user's limit
// refuses it, whose stream id is another caller's, or whose first pool
// key is full leaves no membership of any key it named (each asked for
// at the same time as the user's slot), and no slot of its user.
func TestAPooledAcquireKeepsNothingItRefuses(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.RedisCluster, limitertest.Standalone} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			s := poolReplicas(t, b, 1)[0]
			lim, ctx := s.Limiter, context.Background()
			named := map[string]string{"model": "llama", "org": "acme"} // caps 2 and 1
			empty := func(why string) {
				t.Helper()
				for pool, key := range named {
					if n := members(t, s, pool, key); n != 0 {
						t.Errorf("%s: %s=%s holds %d members; want 0", why, pool, key, n)
					}
				}
			}

			// The user's limit: "one" holds its one slot.
			full := newUser(t)
			if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: full, Plan: "one"}); err != nil || !res.Granted {
				t.Fatalf("first acquire: %+v, %v", res, err)
			}
			res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: full, Plan: "one", Pools: named})
			if err != nil || res.Granted || res.RefusedBy != nil || res.Used != 1 {
				t.Fatalf("acquire over the user's limit: %+v, %v; want refused by the user's limit", res, err)
			}
			empty("after the user's limit refused")

			// Another caller's stream id, held without pools.
			victim := newUser(t)
			if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: victim, Plan: "three", Caller: "alice", StreamID: "s-1"}); err != nil || !res.Granted {
				t.Fatalf("alice's acquire: %+v, %v", res, err)
			}
			if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: victim, Plan: "three", Caller: "mallory", StreamID: "s-1", Pools: named}); !errors.Is(err, limiter.ErrNotSlotHolder) || res.Granted {
				t.Fatalf("mallory's acquire of alice's stream with pools: %+v, %v; want ErrNotSlotHolder", res, err)
			}
			empty("after another caller's stream id was refused")

			// The first key by name full: the later one, taken at the same
			// time, is left, and so is the user's slot.
			for range 2 {
				mustJoin(t, lim, newUser(t), map[string]string{"model": "llama"})
			}
			user := newUser(t)
			res, err = lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "one", Pools: named})
			if err != nil || res.Granted || res.RefusedBy == nil || res.RefusedBy.Pool != "model" {
				t.Fatalf("acquire with model=llama full: %+v, %v; want refused by model", res, err)
			}
			if n := members(t, s, "org", "acme"); n != 0 {
				t.Errorf("org=acme, asked for beside model=llama that refused, holds %d; want 0", n)
			}
			if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "one", Pools: map[string]string{"org": "acme"}}); err != nil || !res.Granted {
				t.Errorf("the refused user's next acquire (plan one, org=acme cap 1): %+v, %v; want granted, nothing of it left", res, err)
			}
		})
	}
}

// TestAnotherCallersMembershipIsNotAFullPool: a pool key holding the
// stream as another caller's (alice's membership, which her slot, gone,
// left behind until it expires) answers bob's acquire of that stream
// ErrNotSlotHolder (403 not_slot_holder), not a refusal by the key, which
// has room; bob keeps no slot, and alice's membership stays as it was.
func TestAnotherCallersMembershipIsNotAFullPool(t *testing.T) {
	eachPoolStack(t, func(t *testing.T, s *limitertest.Stack, c rueidis.Client) {
		lim, ctx := s.Limiter, context.Background()
		user := newUser(t)
		slots, err := s.Keys.PoolKey("model", "llama") // cap 2
		if err != nil {
			t.Fatal(err)
		}
		left, err := lua.Acquire(ctx, c, slots, "s-1 "+user, 2, 10*time.Second, lua.Record{Caller: "alice", Plan: "three", User: user}, false)
		if err != nil || !left.Granted {
			t.Fatalf("alice's membership: %+v, %v", left, err)
		}
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Caller: "bob", StreamID: "s-1", Pools: map[string]string{"model": "llama"}})
		if !errors.Is(err, limiter.ErrNotSlotHolder) || res.Granted || res.RefusedBy != nil {
			t.Fatalf("bob's acquire of the stream alice's membership holds: %+v (refused by %+v), %v; want ErrNotSlotHolder", res, res.RefusedBy, err)
		}
		if held, err := lim.Slots(ctx, user); err != nil || held.Used != 0 {
			t.Errorf("bob's user after the refusal holds %+v, %v; want no slot", held.Slots, err)
		}
		if n := members(t, s, "model", "llama"); n != 1 {
			t.Errorf("model=llama holds %d members; want alice's one", n)
		}
	})
}

// TestRefusedRetriesKeepNoCrashedMembershipAlive: a crash between an
// acquire's steps leaves a membership of model=b, or the user's slot,
// that expires by its own score (DESIGN §16: nothing outlives one TTL).
// A retry of the stream extends it, and gives the time back when it
// gives up: refused by org=acme (full), or by the stream's slot naming
// other pools (ErrPoolsDiffer). Retried every 100 ms, they keep it no
// longer than its TTL (300 ms).
func TestRefusedRetriesKeepNoCrashedMembershipAlive(t *testing.T) {
	eachPoolStack(t, func(t *testing.T, s *limitertest.Stack, c rueidis.Client) {
		lim, ctx := s.Limiter, context.Background()
		mustJoin(t, lim, newUser(t), map[string]string{"org": "acme"}) // cap 1: full
		fullPool := func(res limiter.AcquireResult, err error) bool {
			return err == nil && !res.Granted && res.RefusedBy != nil && res.RefusedBy.Pool == "org"
		}
		for _, tc := range []struct {
			name     string
			slotLeft bool              // the crash left the user's slot, not a membership of model=b
			slot     map[string]string // the stream's slot, taken first; nil: none
			retry    map[string]string
			want     func(limiter.AcquireResult, error) bool
		}{
			{"a membership, refused by a full pool", false, nil, map[string]string{"model": "b", "org": "acme"}, fullPool},
			{"a membership, refused for naming other pools", false, map[string]string{"model": "a"}, map[string]string{"model": "b"}, func(res limiter.AcquireResult, err error) bool {
				return errors.Is(err, limiter.ErrPoolsDiffer) && !res.Granted
			}},
			{"the user's slot, refused by a full pool", true, nil, map[string]string{"org": "acme"}, fullPool},
		} {
			t.Run(tc.name, func(t *testing.T) {
				user := newUser(t)
				key, err := s.Keys.PoolKey("model", "b")
				id, rec := "s1 "+user, lua.Record{Plan: "short", User: user, Token: "crashed"}
				if tc.slotLeft {
					key, err = s.Keys.UserKey(user)
					id, rec = "s1", lua.Record{Plan: "short", Pools: "org=acme", Token: "crashed"}
				}
				if err != nil {
					t.Fatal(err)
				}
				// What the crashed acquire left: its membership, or its
				// slot, alone.
				if got, err := lua.Acquire(ctx, c, key, id, 2, 300*time.Millisecond, rec, false); err != nil || !got.Granted {
					t.Fatalf("what the crashed acquire left: %+v, %v", got, err)
				}
				if tc.slot != nil {
					if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "short", StreamID: "s1", Pools: tc.slot}); err != nil || !res.Granted {
						t.Fatalf("s1 naming %v: %+v, %v", tc.slot, res, err)
					}
				}
				for start := time.Now(); time.Since(start) < 1200*time.Millisecond; time.Sleep(100 * time.Millisecond) {
					if tc.slot != nil {
						if beat, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: "s1"}); err != nil || !beat.Alive {
							t.Fatalf("the slot's heartbeat: %+v, %v", beat, err)
						}
					}
					if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "short", StreamID: "s1", Pools: tc.retry}); !tc.want(res, err) {
						t.Fatalf("a retry naming %v: %+v, %v; want refused", tc.retry, res, err)
					}
				}
				if n := members(t, s, "model", "b"); n != 0 {
					got, _ := lim.PoolSlots(ctx, "model", "b")
					t.Errorf("model=b 1.2 s (4 TTLs) after the crash, refused retries since: %d held %+v; want none", got.Used, got.Holders)
				}
				if n := zcard(t, s, key); tc.slotLeft && n != 0 {
					got, _ := lim.Slots(ctx, user)
					t.Errorf("the user 1.2 s (4 TTLs) after the crash, refused retries since: %d held %+v; want none", got.Used, got.Slots)
				}
			})
		}
	})
}

// eachPoolStack runs fn, in parallel, on a limiter of poolReplicas on
// Redis Cluster and on standalone Redis, with a client of its Redis.
func eachPoolStack(t *testing.T, fn func(t *testing.T, s *limitertest.Stack, c rueidis.Client)) {
	for _, b := range []limitertest.Backend{limitertest.RedisCluster, limitertest.Standalone} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			s := poolReplicas(t, b, 1)[0]
			c, err := s.Redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			fn(t, s, c)
		})
	}
}

func mustJoin(t *testing.T, lim *limiter.Limiter, user string, named map[string]string) limiter.AcquireResult {
	t.Helper()
	res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three", Pools: named})
	if err != nil || !res.Granted || res.Degraded {
		t.Fatalf("%s's acquire of %v: %+v, %v; want granted", user, named, res, err)
	}
	return res
}

// TestAPoolWaiterHoldsNoLaterKey: an acquire of model=gpt-4o (full) and
// zone=z waits in gpt-4o's queue without zone=z's membership, which was
// asked for beside it: another user takes z's one place meanwhile. Once
// gpt-4o frees and z does too, it is granted both.
func TestAPoolWaiterHoldsNoLaterKey(t *testing.T) {
	t.Parallel()
	table := poolTable(t,
		pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1}, MaxWait: 10 * time.Second},
		pools.Pool{Pool: "zone", Keys: map[string]int{"z": 1}, MaxWait: 10 * time.Second},
	)
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second},
		Tiers: poolWaitTiers(), Limiter: limiter.Options{Keys: keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}, Pools: table}})
	lim, ctx := s.Limiter, context.Background()
	holderUser := newUser(t)
	holder := mustAcquire(t, lim, holderUser, "low", "gpt-4o")

	waiter := newUser(t)
	q := queue(t, ctx, s, lim, limiter.AcquireRequest{UserID: waiter, Plan: "low", Pools: map[string]string{"model": "gpt-4o", "zone": "z"}}, 10*time.Second)
	if n := members(t, s, "zone", "z"); n != 0 {
		t.Fatalf("zone=z while its acquire waits for model=gpt-4o: %d members; want 0", n)
	}
	otherUser := newUser(t)
	other, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: otherUser, Plan: "low", Pools: map[string]string{"zone": "z"}})
	if err != nil || !other.Granted {
		t.Fatalf("another user's zone=z while the waiter waits: %+v, %v; want granted", other, err)
	}
	for user, stream := range map[string]string{holderUser: holder.StreamID, otherUser: other.StreamID} {
		if rel, err := lim.Release(ctx, user, stream); err != nil || !rel.Released {
			t.Fatalf("release of %s: %+v, %v", user, rel, err)
		}
	}
	a, ok := q.answer(5 * time.Second)
	if !ok || a.err != nil || !a.res.Granted || len(a.res.Pools) != 2 {
		t.Fatalf("the waiter after both keys freed: %+v, %v (answered %v); want granted with both keys", a.res, a.err, ok)
	}
	if n := members(t, s, "zone", "z"); n != 1 {
		t.Errorf("zone=z after the grant: %d members; want 1", n)
	}
}
