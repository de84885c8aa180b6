package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
)

func ptr(n int) *int { return &n }

// poolReplicas returns n limiters on one backend sharing one key prefix
// and one pool table: model caps gpt-4o at 5 and every other key at 2;
// org caps acme at 1; open caps nothing.
func poolReplicas(t *testing.T, b limitertest.Backend, n int) []*limitertest.Stack {
	t.Helper()
	return replicasOf(t, b, n, nil, poolTable(t,
		pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2), Keys: map[string]int{"gpt-4o": 5}},
		pools.Pool{Pool: "org", Keys: map[string]int{"acme": 1}},
		pools.Pool{Pool: "open"},
	))
}

// TestAPoolKeyAdmitsExactlyItsCap: 30 users on 3 replicas acquire a
// stream of model=gpt-4o (cap 5) at once, round after round: exactly 5
// are granted each round, every refusal names the pool key, and a refused
// user's own slot is free again.
func TestAPoolKeyAdmitsExactlyItsCap(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.RedisCluster, limitertest.Standalone} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			stacks := poolReplicas(t, b, 3)
			for round := range 3 {
				var mu sync.Mutex
				var granted []limiter.AcquireResult
				var granter []*limiter.Limiter
				users := make([]string, 30)
				var wg sync.WaitGroup
				for i := range users {
					users[i] = fmt.Sprintf("%s-r%d-%d", newUser(t), round, i)
					lim := stacks[i%3].Limiter
					wg.Go(func() {
						res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: users[i], Plan: "three", Pools: map[string]string{"model": "gpt-4o"}})
						switch {
						case err != nil:
							t.Errorf("acquire: %v", err)
						case res.Granted:
							if len(res.Pools) != 1 || res.Pools[0].Pool != "model" || res.Pools[0].Key != "gpt-4o" || res.Pools[0].Limit != 5 || res.Pools[0].Used < 1 || res.Pools[0].Used > 5 {
								t.Errorf("grant's pools: %+v", res.Pools)
							}
							mu.Lock()
							granted, granter = append(granted, res), append(granter, lim)
							mu.Unlock()
						default:
							if r := res.RefusedBy; r == nil || r.Pool != "model" || r.Key != "gpt-4o" || r.Used != 5 || r.Limit != 5 || r.RetryAfter <= 0 {
								t.Errorf("refusal: %+v, refused by %+v; want model=gpt-4o with 5 of 5 held", res, r)
							}
						}
					})
				}
				wg.Wait()
				if len(granted) != 5 {
					t.Fatalf("round %d: %d granted, want exactly 5", round, len(granted))
				}
				for _, u := range users {
					if n := held(t, stacks[0].Limiter, u); n > 1 {
						t.Errorf("user %s holds %d slots", u, n)
					}
				}
				held := 0
				for _, u := range users {
					got, err := stacks[0].Limiter.Slots(context.Background(), u)
					if err != nil {
						t.Fatal(err)
					}
					held += got.Used
				}
				if held != 5 {
					t.Errorf("round %d: users hold %d slots, want 5: a refused acquire left its user's slot", round, held)
				}
				for i, res := range granted {
					user := users[0]
					for _, u := range users {
						if got, _ := stacks[0].Limiter.Slots(context.Background(), u); len(got.Slots) == 1 && got.Slots[0].StreamID == res.StreamID {
							user = u
						}
					}
					if rel, err := granter[i].Release(context.Background(), user, res.StreamID); err != nil || !rel.Released {
						t.Fatalf("release: %+v, %v", rel, err)
					}
				}
			}
		})
	}
}

// TestAPoolRefusalLeavesTheUsersSlotsFree: a user refused by a pool key
// can take every one of its own slots at once afterwards.
func TestAPoolRefusalLeavesTheUsersSlotsFree(t *testing.T) {
	t.Parallel()
	lim := poolReplicas(t, limitertest.RedisCluster, 1)[0].Limiter
	ctx := context.Background()
	other, user := newUser(t), newUser(t)
	if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: other, Plan: "three", Pools: map[string]string{"org": "acme"}}); err != nil || !res.Granted {
		t.Fatalf("other's acquire: %+v, %v", res, err)
	}
	res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: map[string]string{"model": "llama", "org": "acme"}})
	if err != nil || res.Granted || res.RefusedBy == nil || res.RefusedBy.Pool != "org" {
		t.Fatalf("acquire with org=acme full: %+v, %v; want refused by org", res, err)
	}
	for i := range 3 {
		if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: map[string]string{"model": fmt.Sprintf("m%d", i)}}); err != nil || !res.Granted {
			t.Fatalf("acquire %d of 3 after the refusal: %+v, %v", i+1, res, err)
		}
	}
	// model=llama (cap 2) was joined before org refused, and left again.
	for _, u := range []string{newUser(t), newUser(t)} {
		if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: u, Plan: "three", Pools: map[string]string{"model": "llama"}}); err != nil || !res.Granted {
			t.Fatalf("model=llama after the refusal: %+v, %v; want both of its 2 free", res, err)
		}
	}
}

// TestHeartbeatAndReleaseCoverEveryMembership: a stream's memberships live
// as long as its heartbeats, whatever the caller resends; a release drops
// them; a membership lost answers slot_lost naming the pool key, and the
// lost stream's slot and other memberships go with it, not a TTL later.
func TestHeartbeatAndReleaseCoverEveryMembership(t *testing.T) {
	t.Parallel()
	s := poolReplicas(t, limitertest.RedisCluster, 1)[0]
	lim, ctx := s.Limiter, context.Background()
	user := newUser(t)
	res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "short", Pools: map[string]string{"org": "acme", "open": "x"}})
	if err != nil || !res.Granted || len(res.Pools) != 1 {
		t.Fatalf("acquire: %+v, %v; want granted with one capped membership (open caps nothing)", res, err)
	}
	// Past the 300ms TTL, kept by heartbeats alone (single and batched).
	for i := range 8 {
		time.Sleep(100 * time.Millisecond)
		req := limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: res.StreamID}
		if i%2 == 0 {
			if beat, err := lim.Heartbeat(ctx, req); err != nil || !beat.Alive {
				t.Fatalf("heartbeat %d: %+v, %v", i, beat, err)
			}
		} else if beats, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{req}); errs[0] != nil || !beats[0].Alive {
			t.Fatalf("batch heartbeat %d: %+v, %v", i, beats[0], errs[0])
		}
	}
	if got, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "short", Pools: map[string]string{"org": "acme"}}); err != nil || got.Granted {
		t.Fatalf("another user's org=acme acquire while the stream beats: %+v, %v; want refused", got, err)
	}
	if rel, err := lim.Release(ctx, user, res.StreamID); err != nil || !rel.Released {
		t.Fatalf("release: %+v, %v", rel, err)
	}
	// The pool key is lost (deleted, a failover): the next heartbeat of
	// a stream of it is slot_lost, naming it, single or batched.
	c, err := s.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	poolKey, _ := s.Keys.PoolKey("org", "acme")
	for _, batched := range []bool{false, true} {
		secondUser := newUser(t)
		second, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: secondUser, Plan: "three", Pools: map[string]string{"org": "acme", "model": "m"}})
		if err != nil || !second.Granted || len(second.Pools) != 2 {
			t.Fatalf("org=acme and model=m after the release: %+v, %v; want granted with both", second, err)
		}
		if err := c.Do(ctx, c.B().Del().Key(poolKey).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		req := limiter.HeartbeatRequest{UserID: secondUser, Plan: "three", StreamID: second.StreamID}
		if !batched {
			if beat, err := lim.Heartbeat(ctx, req); !errors.Is(err, limiter.ErrSlotLost) || beat.Alive || !strings.Contains(err.Error(), "org=acme") {
				t.Errorf("heartbeat with its pool key lost: %+v, %v; want slot lost, naming org=acme", beat, err)
			}
		} else if beats, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{req}); !errors.Is(errs[0], limiter.ErrSlotLost) || beats[0].Alive || !strings.Contains(errs[0].Error(), "org=acme") {
			t.Errorf("batch heartbeat with its pool key lost: %+v, %v; want slot lost, naming org=acme", beats[0], errs[0])
		}
		if got, err := lim.Slots(ctx, secondUser); err != nil || len(got.Slots) != 0 {
			t.Errorf("batched %v: the lost stream's user holds %+v, %v; want its slot gone with the stream", batched, got.Slots, err)
		}
		if got, err := lim.PoolSlots(ctx, "model", "m"); err != nil || got.Used != 0 {
			t.Errorf("batched %v: model=m holds %d, %v; want the lost stream's membership gone with it", batched, got.Used, err)
		}
	}
}

// TestTwoUsersStreamIDsAreTwoMemberships: a stream id two users chose
// alike is two memberships of a pool key, not one extended.
func TestTwoUsersStreamIDsAreTwoMemberships(t *testing.T) {
	t.Parallel()
	lim := poolReplicas(t, limitertest.Standalone, 1)[0].Limiter
	ctx := context.Background()
	for i, user := range []string{newUser(t), newUser(t)} {
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: "req-1", Pools: map[string]string{"model": "m"}})
		if err != nil || !res.Granted || res.Pools[0].Used != i+1 {
			t.Fatalf("user %d's req-1: %+v, %v; want granted with %d held", i+1, res, err, i+1)
		}
	}
	if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", StreamID: "req-1", Pools: map[string]string{"model": "m"}}); err != nil || res.Granted {
		t.Fatalf("a third user's req-1 on model=m (cap 2): %+v, %v; want refused", res, err)
	}
}

func TestAnAcquireNamesPoolsThatExist(t *testing.T) {
	t.Parallel()
	lim := poolReplicas(t, limitertest.Standalone, 1)[0].Limiter
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		pools map[string]string
		want  error
		says  string
	}{
		{"an unknown pool", map[string]string{"region": "eu"}, limiter.ErrUnknownPool, `"region"`},
		{"a key outside the charset", map[string]string{"model": "gpt 4o"}, limiter.ErrInvalidPoolKey, `"gpt 4o"`},
		{"five pools, one over the bound", map[string]string{"model": "a", "org": "b", "open": "c", "x": "d", "y": "e"}, limiter.ErrInvalidPoolKey, "the limit is 4"},
	} {
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: tc.pools})
		if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.says) || res.Granted {
			t.Errorf("%s: %+v, %v; want %v saying %s", tc.name, res, err, tc.want, tc.says)
		}
	}
	// With no pool at all, the message says so rather than listing none.
	bare := limitertest.New(t, limitertest.Options{Backend: limitertest.Standalone}).Limiter
	res, err := bare.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: map[string]string{"model": "m"}})
	want := `"model" is not a pool: none is configured`
	if !errors.Is(err, limiter.ErrUnknownPool) || !strings.Contains(fmt.Sprint(err), want) || res.Granted {
		t.Errorf("a pool named where none is configured: %+v, %v; want ErrUnknownPool saying %s", res, err, want)
	}
	if _, err := bare.PoolSlots(ctx, "model", "m"); !errors.Is(err, limiter.ErrUnknownPool) || !strings.Contains(fmt.Sprint(err), want) {
		t.Errorf("PoolSlots where none is configured: %v; want ErrUnknownPool saying %s", err, want)
	}
}

// TestReleaseAllDropsEveryMembership: support's release of every slot of
// a user drops the streams' pool memberships too, at once rather than a
// TTL later, and a retry of the same call (its answer kept) answers the
// same streams.
func TestReleaseAllDropsEveryMembership(t *testing.T) {
	t.Parallel()
	lim := poolReplicas(t, limitertest.RedisCluster, 1)[0].Limiter
	ctx := context.Background()
	user := newUser(t)
	var held []string
	for _, named := range []map[string]string{{"model": "m", "org": "acme"}, {"model": "m"}} {
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: named})
		if err != nil || !res.Granted {
			t.Fatalf("acquire %v: %+v, %v", named, res, err)
		}
		held = append(held, res.StreamID)
	}
	call := newAuditID()
	for attempt := range 2 {
		ids, err := lim.ReleaseAll(ctx, user, call)
		slices.Sort(ids)
		slices.Sort(held)
		if err != nil || !slices.Equal(ids, held) {
			t.Fatalf("release_all, attempt %d: %v, %v; want %v", attempt+1, ids, err, held)
		}
	}
	// model=m (cap 2) and org=acme (cap 1) are free for others at once.
	for i, named := range []map[string]string{{"model": "m", "org": "acme"}, {"model": "m"}} {
		if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: named}); err != nil || !res.Granted {
			t.Errorf("another user's acquire %d of %v after release_all: %+v, %v; want granted", i+1, named, res, err)
		}
	}
}

// TestMembershipsBeatByTheirStreamsTTL: a heartbeat keeps a stream's
// memberships by its slot's own TTL, which the user's heartbeat just read,
// not by a membership's record: a membership whose record names another
// TTL (an hour) still expires one slot TTL after each beat, single and
// batched.
func TestMembershipsBeatByTheirStreamsTTL(t *testing.T) {
	t.Parallel()
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster, limitertest.Embedded} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			s := poolReplicas(t, b, 1)[0]
			lim, ctx := s.Limiter, context.Background()
			user := newUser(t)
			res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "short", Pools: map[string]string{"org": "acme"}})
			if err != nil || !res.Granted {
				t.Fatalf("acquire: %+v, %v", res, err)
			}
			c, err := s.Redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			slots, _ := s.Keys.PoolKey("org", "acme")
			member := res.StreamID + " " + user
			if err := c.Do(ctx, c.B().Hset().Key(keys.SlotRecords(slots)).FieldValue().FieldValue(member, "3600000;user=1:x").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			req := limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: res.StreamID}
			for i, beat := range []func() (limiter.HeartbeatResult, error){
				func() (limiter.HeartbeatResult, error) { return lim.Heartbeat(ctx, req) },
				func() (limiter.HeartbeatResult, error) {
					r, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{req})
					return r[0], errs[0]
				},
			} {
				got, err := beat()
				if err != nil || !got.Alive {
					t.Fatalf("heartbeat %d: %+v, %v", i, got, err)
				}
				score, err := c.Do(ctx, c.B().Zscore().Key(slots).Member(member).Build()).AsFloat64()
				if err != nil {
					t.Fatal(err)
				}
				if at := time.UnixMilli(int64(score)); at.After(got.ExpiresAt.Add(100 * time.Millisecond)) {
					t.Errorf("heartbeat %d: the membership expires at %v, the slot at %v; want the slot's TTL, not its record's hour", i, at, got.ExpiresAt)
				}
			}
		})
	}
}

// TestPoolKeysBesideTheUsersAndElsewhereDecideAsOne: on a cluster, an
// acquire whose pool keys are one on the node of the user's key (sent in
// the user's pipeline) and one on another node (sent alone) is one
// decision, whichever of them refuses: a refusal leaves nothing held, the
// user's slot and the other key's membership included, and a grant holds
// both memberships.
func TestPoolKeysBesideTheUsersAndElsewhereDecideAsOne(t *testing.T) {
	t.Parallel()
	table := poolTable(t,
		pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1)},
		pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(1)},
	)
	schema := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	stack := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Limiter: limiter.Options{Keys: schema, Pools: table}})
	raw, err := stack.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !stack.Redis.Warmed(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the client has not learnt the cluster's slots in 10s")
		}
	}
	nodeOf := func(key string) string {
		cmd := raw.B().Type().Key(key).Build()
		node := stack.Redis.NodeOf(cmd.Slot())
		if node == "" {
			t.Fatalf("no node known for %s", key)
		}
		return node
	}
	// Two users on one node; a model key on theirs, an org key on another.
	var node string
	var users []string
	for i := 0; len(users) < 2; i++ {
		u := fmt.Sprintf("%s-%d", newUser(t), i)
		k, err := schema.UserKey(u)
		if err != nil {
			t.Fatal(err)
		}
		if node == "" {
			node = nodeOf(k)
		}
		if nodeOf(k) == node {
			users = append(users, u)
		}
	}
	pick := func(pool string, beside bool) string {
		for i := range 2000 {
			name := fmt.Sprintf("%s-%d", pool, i)
			if (nodeOf(mustPoolKey(t, schema, pool, name)) == node) == beside {
				return name
			}
		}
		t.Fatalf("no %s key found beside=%v the users' node %s", pool, beside, node)
		return ""
	}
	model, org := pick("model", true), pick("org", false)
	ctx := context.Background()
	acquire := func(user string, named map[string]string) limiter.AcquireResult {
		t.Helper()
		res, err := stack.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: named})
		if err != nil {
			t.Fatalf("acquire of %s in %v: %v", user, named, err)
		}
		return res
	}
	both := map[string]string{"model": model, "org": org}

	first := acquire(users[0], both)
	if !first.Granted || len(first.Pools) != 2 || first.Pools[0].Used != 1 || first.Pools[1].Used != 1 {
		t.Fatalf("first acquire: %+v; want granted, one of one held in each pool", first)
	}
	// Each key refuses in turn, the other having room: nothing is left.
	for _, full := range []string{"model", "org"} {
		named := map[string]string{"model": model + "-free", "org": org + "-free"}
		if full == "model" {
			named["model"] = model
		} else {
			named["org"] = org
		}
		res := acquire(users[1], named)
		if res.Granted || res.RefusedBy == nil || res.RefusedBy.Pool != full {
			t.Fatalf("acquire with %s full: %+v, refused by %+v; want refused by %s", full, res, res.RefusedBy, full)
		}
		if n := held(t, stack.Limiter, users[1]); n != 0 {
			t.Errorf("%s refused: %s holds %d slots, want none", full, users[1], n)
		}
		for pool, key := range named {
			if key == model || key == org {
				continue
			}
			// The key with room was left: another stream takes its one place.
			if res := acquire(newUser(t), map[string]string{pool: key}); !res.Granted {
				t.Errorf("%s refused: %s=%s should have been left, got %+v", full, pool, key, res)
			}
		}
	}
	if rel, err := stack.Limiter.Release(ctx, users[0], first.StreamID); err != nil || !rel.Released {
		t.Fatalf("release: %+v, %v", rel, err)
	}
	if res := acquire(users[1], both); !res.Granted {
		t.Errorf("acquire after the release: %+v; want granted, both keys free again", res)
	}
}

// poolTable returns a table of pools ps, each with its defaults.
func poolTable(tb testing.TB, ps ...pools.Pool) *pools.Table {
	tb.Helper()
	for i := range ps {
		ps[i] = ps[i].WithDefaults()
	}
	table := pools.NewTable()
	if err := table.Replace(ps); err != nil {
		tb.Fatal(err)
	}
	return table
}

// TestAReacquireNamesThePoolsTheStreamHolds: an acquire of a held stream
// extends it, and a stream's memberships are those its slot's record
// names, which heartbeat and release cover. A re-acquire naming other
// pool keys (more, fewer or others) is refused and joins none of them:
// joined, they would be held past the stream's release, beside no
// record, until they expired (and kept by each re-acquire).
func TestAReacquireNamesThePoolsTheStreamHolds(t *testing.T) {
	t.Parallel()
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			lim := poolReplicas(t, b, 1)[0].Limiter
			ctx := context.Background()
			user := newUser(t)
			acquire := func(streamID string, named map[string]string) (limiter.AcquireResult, error) {
				return lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: streamID, Pools: named})
			}
			if res, err := acquire("bare", nil); err != nil || !res.Granted {
				t.Fatalf("acquire of a stream joining no pool: %+v, %v", res, err)
			}
			if res, err := acquire("pooled", map[string]string{"model": "a"}); err != nil || !res.Granted {
				t.Fatalf("acquire of a stream joining model=a: %+v, %v", res, err)
			}
			for _, tc := range []struct {
				stream string
				named  map[string]string
			}{
				{"bare", map[string]string{"org": "acme"}},
				{"pooled", map[string]string{"model": "b"}},
				{"pooled", map[string]string{"model": "a", "org": "acme"}},
				{"pooled", nil},
			} {
				res, err := acquire(tc.stream, tc.named)
				if !errors.Is(err, limiter.ErrPoolsDiffer) || res.Granted || !strings.Contains(fmt.Sprint(err), tc.stream) {
					t.Errorf("re-acquire of %s with %v: %+v, %v; want ErrPoolsDiffer naming the stream", tc.stream, tc.named, res, err)
				}
			}
			if res, err := acquire("pooled", map[string]string{"model": "a", "open": "x"}); err != nil || !res.Granted || len(res.Pools) != 1 {
				t.Errorf("re-acquire of pooled with model=a (and open, which caps nothing): %+v, %v; want granted, one membership", res, err)
			}
			// Nothing refused was joined: org=acme (cap 1) and model=b (cap 2)
			// are free for others; once pooled is released, model=a is too.
			if rel, err := lim.Release(ctx, user, "pooled"); err != nil || !rel.Released {
				t.Fatalf("release: %+v, %v", rel, err)
			}
			for _, named := range []map[string]string{{"org": "acme"}, {"model": "b"}, {"model": "b"}, {"model": "a"}, {"model": "a"}} {
				if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: named}); err != nil || !res.Granted {
					t.Errorf("another user's acquire of %v: %+v, %v; want granted", named, res, err)
				}
			}
		})
	}
}

// TestAnExtensionIsJudgedByThePoolsItNames: an acquire of a held stream
// is its extension when it names the pool keys the stream's record holds,
// whether each is capped now or not: a retry of the very acquire that
// took the stream, after the operator lifted the key's cap, extends it,
// and the membership it had stays, released with the stream. Naming
// another key, or none, or a key capped since the stream was taken
// without it, is ErrPoolsDiffer, and the message names what was asked.
func TestAnExtensionIsJudgedByThePoolsItNames(t *testing.T) {
	t.Parallel()
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2)})
	lim := replicasOf(t, limitertest.RedisCluster, 1, nil, table)[0].Limiter
	ctx := context.Background()
	user := newUser(t)
	acquire := func(stream string, named map[string]string) (limiter.AcquireResult, error) {
		return lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: stream, Pools: named})
	}
	a := map[string]string{"model": "a"}
	if res, err := acquire("s1", a); err != nil || !res.Granted || len(res.Pools) != 1 {
		t.Fatalf("acquire of s1 joining model=a: %+v, %v", res, err)
	}
	// Lifted: model=a is no longer capped.
	uncapped := pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 5}}.WithDefaults()
	if err := table.Replace([]pools.Pool{uncapped}); err != nil {
		t.Fatal(err)
	}
	if res, err := acquire("s1", a); err != nil || !res.Granted {
		t.Errorf("s1's acquire again, model=a's cap lifted since: %+v, %v; want granted, an extension", res, err)
	}
	for _, tc := range []struct {
		named map[string]string
		says  string
	}{
		{map[string]string{"model": "b"}, "holds model=a, and this acquire names model=b"},
		{nil, "holds model=a, and this acquire names no pool"},
	} {
		if res, err := acquire("s1", tc.named); !errors.Is(err, limiter.ErrPoolsDiffer) || !strings.Contains(err.Error(), tc.says) || res.Granted {
			t.Errorf("s1's acquire naming %v: %+v, %v; want ErrPoolsDiffer saying %q", tc.named, res, err, tc.says)
		}
	}
	if key, err := lim.PoolSlots(ctx, "model", "a"); err != nil || key.Used != 1 {
		t.Errorf("model=a after s1's extensions: used %d, %v; want s1's membership kept", key.Used, err)
	}
	if rel, err := lim.Release(ctx, user, "s1"); err != nil || !rel.Released {
		t.Fatalf("release s1: %+v, %v", rel, err)
	}
	if key, err := lim.PoolSlots(ctx, "model", "a"); err != nil || key.Used != 0 {
		t.Errorf("model=a after s1's release: used %d, %v; want its membership gone with it", key.Used, err)
	}

	// Taken while model=a is uncapped, the stream holds no membership of
	// it; capped since, an acquire of it would join a key it does not
	// hold.
	if res, err := acquire("s2", a); err != nil || !res.Granted || len(res.Pools) != 0 {
		t.Fatalf("acquire of s2, model=a uncapped: %+v, %v", res, err)
	}
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2)}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	if res, err := acquire("s2", a); !errors.Is(err, limiter.ErrPoolsDiffer) || !strings.Contains(err.Error(), "holds no pool, and this acquire names model=a") || res.Granted {
		t.Errorf("s2's acquire again, model=a capped since: %+v, %v; want ErrPoolsDiffer", res, err)
	}
	if key, err := lim.PoolSlots(ctx, "model", "a"); err != nil || key.Used != 0 {
		t.Errorf("model=a after s2's refused extension: used %d, %v; want nothing joined", key.Used, err)
	}
}

// A pooled stream an earlier release granted under a user id this one
// refuses at acquire (a format character; see
// TestASlotTakenUnderAnEarlierReleasesUserIDRunsToItsEnd) whose
// membership is lost ends as any other's does: its heartbeat, single or
// in a batch, answers slot lost and drops the user's slot with it, rather
// than leaving the slot it just extended to hold the user's place for a
// TTL, which no client then releases.
func TestALostPooledStreamOfAnEarlierReleasesUserIDTakesItsSlot(t *testing.T) {
	for _, batched := range []bool{false, true} {
		s := poolReplicas(t, limitertest.RedisCluster, 1)[0]
		lim, ctx := s.Limiter, context.Background()
		c, err := s.Redis.Redis()
		if err != nil {
			t.Fatal(err)
		}
		// load the scripts
		if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: map[string]string{"model": "m"}}); err != nil || !res.Granted {
			t.Fatalf("warm: %+v, %v", res, err)
		}
		user := newUser(t) + "\u200b"
		key, err := s.Keys.HeldUserKey(user)
		if err != nil {
			t.Fatal(err)
		}
		poolKey, err := s.Keys.PoolKey("model", "x")
		if err != nil {
			t.Fatal(err)
		}
		// As the previous release took it: the user's slot naming its
		// membership, and the membership.
		rec := lua.Record{Plan: "three", Pools: lua.EncodePools([]lua.PoolKey{{Pool: "model", Key: "x"}})}
		if got, err := lua.Acquire(ctx, c, key, "s1", 3, 10*time.Second, rec, false); err != nil || !got.Granted {
			t.Fatalf("user slot: %+v, %v", got, err)
		}
		if got, err := lua.Acquire(ctx, c, poolKey, "s1 "+user, 2, 10*time.Second, lua.Record{Plan: "three"}, false); err != nil || !got.Granted {
			t.Fatalf("membership: %+v, %v", got, err)
		}
		if got, err := lim.Slots(ctx, user); err != nil || got.Used != 1 {
			t.Fatalf("Slots before = %+v, %v; want 1", got, err)
		}
		// The pool key is lost (a failover).
		if err := c.Do(ctx, c.B().Del().Key(poolKey).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		req := limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: "s1"}
		if !batched {
			if beat, err := lim.Heartbeat(ctx, req); !errors.Is(err, limiter.ErrSlotLost) || beat.Alive {
				t.Fatalf("heartbeat: %+v, %v; want slot lost", beat, err)
			}
		} else if beats, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{req}); !errors.Is(errs[0], limiter.ErrSlotLost) || beats[0].Alive {
			t.Fatalf("batch heartbeat: %+v, %v; want slot lost", beats[0], errs[0])
		}
		time.Sleep(200 * time.Millisecond) // any leave in the background
		if got, err := lim.Slots(ctx, user); err != nil || got.Used != 0 {
			t.Errorf("batched %v: after slot_lost the user still holds %+v, %v; want the lost stream's slot gone with it", batched, got.Slots, err)
		}
	}
}
