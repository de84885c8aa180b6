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
	"github.com/joishi/limiter/pkg/pools"
)

// TestPoolSlotsNameEachHolder: a pool key's listing names the user and
// stream of each membership with its acquire's record, the key's cap, and
// the override in force; another spelling of the key is another key.
func TestPoolSlotsNameEachHolder(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.RedisCluster, limitertest.Standalone} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			lim := poolReplicas(t, b, 1)[0].Limiter
			ctx := context.Background()
			want := map[string]string{} // stream → user
			for i := range 2 {
				user := newUser(t)
				res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Caller: "chat-api", Label: "pod-" + string(rune('a'+i)),
					Pools: map[string]string{"model": "gpt-4o"}})
				if err != nil || !res.Granted {
					t.Fatalf("acquire %d: got %+v, %v; want granted", i, res, err)
				}
				want[res.StreamID] = user
			}
			got, err := lim.PoolSlots(ctx, "model", "gpt-4o")
			if err != nil {
				t.Fatal(err)
			}
			if got.Pool != "model" || got.Key != "gpt-4o" || got.Used != 2 || len(got.Holders) != 2 || got.Limit != 5 || !got.Capped || got.Override != nil {
				t.Fatalf("PoolSlots: got %+v, want 2 holders of model=gpt-4o, capped at 5, no override", got)
			}
			for _, h := range got.Holders {
				if want[h.StreamID] != h.UserID || h.Caller != "chat-api" || h.Plan != "three" || !strings.HasPrefix(h.Label, "pod-") ||
					h.StartedAt.IsZero() || h.TTL <= 0 || h.TTL > 10*time.Second {
					t.Errorf("holder %+v: want user %q, caller chat-api, plan three, a pod- label, a start and time left", h, want[h.StreamID])
				}
			}
			if other, err := lim.PoolSlots(ctx, "model", "GPT-4o"); err != nil || other.Used != 0 || other.Limit != 2 || !other.Capped {
				t.Errorf("PoolSlots of model=GPT-4o: got %+v, %v; want no holder, the pool's default cap of 2", other, err)
			}
			if open, err := lim.PoolSlots(ctx, "open", "anything"); err != nil || open.Capped || open.Used != 0 {
				t.Errorf("PoolSlots of a pool that caps nothing: got %+v, %v; want not capped, no holder", open, err)
			}
		})
	}
}

// TestAPoolOverrideJudgesTheKey: a pool key's override replaces its cap
// for every stream that joins it, is counted with the users' overrides,
// and once removed the pool's cap applies again.
func TestAPoolOverrideJudgesTheKey(t *testing.T) {
	lim := poolReplicas(t, limitertest.RedisCluster, 1)[0].Limiter
	ctx := context.Background()
	before, err := lim.ActiveOverrides(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set, err := lim.SetPoolOverride(ctx, "org", "acme", limiter.OverrideRequest{MaxConcurrentStreams: 2, For: time.Hour, Actor: "opal", Reason: "ticket 5"})
	if err != nil || set.MaxConcurrentStreams != 2 || set.Actor != "opal" || set.TTL != time.Hour {
		t.Fatalf("SetPoolOverride: got %+v, %v; want 2 streams for an hour by opal", set, err)
	}
	if n, err := lim.ActiveOverrides(ctx); err != nil || n != before+1 {
		t.Errorf("ActiveOverrides: got %d, %v; want %d", n, err, before+1)
	}
	join := func() limiter.AcquireResult {
		t.Helper()
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: map[string]string{"org": "acme"}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for i := range 2 {
		if res := join(); !res.Granted || res.Pools[0].Limit != 2 || !res.Pools[0].Overridden {
			t.Fatalf("stream %d joining org=acme (cap 1) under an override of 2: got %+v, want granted, overridden, limit 2", i+1, res)
		}
	}
	if res := join(); res.Granted || res.RefusedBy == nil || res.RefusedBy.Limit != 2 {
		t.Fatalf("3rd stream: got %+v, want refused by org=acme at its override of 2", res)
	}
	listed, err := lim.PoolSlots(ctx, "org", "acme")
	if err != nil || listed.Override == nil || listed.Override.MaxConcurrentStreams != 2 || listed.Override.Reason != "ticket 5" || listed.Limit != 1 {
		t.Fatalf("PoolSlots: got %+v, %v; want the override of 2 beside the pool's cap of 1", listed, err)
	}

	for i, want := range []bool{true, false} {
		if removed, err := lim.RemovePoolOverride(ctx, "org", "acme"); err != nil || removed != want {
			t.Errorf("RemovePoolOverride %d: got %v, %v; want %v", i+1, removed, err, want)
		}
	}
	if n, err := lim.ActiveOverrides(ctx); err != nil || n != before {
		t.Errorf("ActiveOverrides after the removal: got %d, %v; want %d", n, err, before)
	}
	if res := join(); res.Granted || res.RefusedBy == nil || res.RefusedBy.Limit != 1 {
		t.Errorf("a stream after the removal: got %+v, want refused by the pool's cap of 1", res)
	}
}

// TestPoolKeyAdminRefusals: a pool the table does not hold, a key out of
// bounds, a key the pool does not cap and an override out of bounds are
// refused with the sentinel the HTTP layer maps, and store nothing.
func TestPoolKeyAdminRefusals(t *testing.T) {
	lim := poolReplicas(t, limitertest.Standalone, 1)[0].Limiter
	ctx := context.Background()
	ok := limiter.OverrideRequest{MaxConcurrentStreams: 1, For: time.Hour, Actor: "opal", Reason: "r"}
	for _, tc := range []struct {
		name      string
		pool, key string
		req       limiter.OverrideRequest
		want      error
	}{
		{"a pool not configured", "region", "eu", ok, limiter.ErrUnknownPool},
		{"a pool named in another case", "Model", "gpt-4o", ok, limiter.ErrUnknownPool},
		{"a key of 129 bytes", "model", strings.Repeat("k", 129), ok, limiter.ErrInvalidPoolKey},
		{"a key with a space", "model", "gpt 4o", ok, limiter.ErrInvalidPoolKey},
		{"a key the pool does not cap", "org", "globex", ok, limiter.ErrInvalidOverride},
		{"a limit of 100001, over a pool's bound", "model", "gpt-4o", limiter.OverrideRequest{MaxConcurrentStreams: pools.MaxConcurrentStreams + 1, For: time.Hour, Actor: "opal", Reason: "r"}, limiter.ErrInvalidOverride},
		{"59 seconds", "model", "gpt-4o", limiter.OverrideRequest{MaxConcurrentStreams: 1, For: 59 * time.Second, Actor: "opal", Reason: "r"}, limiter.ErrInvalidOverride},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := lim.SetPoolOverride(ctx, tc.pool, tc.key, tc.req); !errors.Is(err, tc.want) {
				t.Errorf("SetPoolOverride: got %v, want %v", err, tc.want)
			}
			if tc.want != limiter.ErrInvalidOverride {
				if _, err := lim.PoolSlots(ctx, tc.pool, tc.key); !errors.Is(err, tc.want) {
					t.Errorf("PoolSlots: got %v, want %v", err, tc.want)
				}
				if _, err := lim.RemovePoolOverride(ctx, tc.pool, tc.key); !errors.Is(err, tc.want) {
					t.Errorf("RemovePoolOverride: got %v, want %v", err, tc.want)
				}
			}
		})
	}
	if n, err := lim.ActiveOverrides(ctx); err != nil || n != 0 {
		t.Errorf("ActiveOverrides after refusals only: got %d, %v; want 0", n, err)
	}
}

// TestADeletedPoolsKeysStaySeen: a pool deleted while streams hold its
// keys (its LimitPool removed, or taken out of pools.static) lets them
// beat on, by its last definition; support still sees who holds a key
// (Deleted) and can remove its override, which would otherwise judge the
// key again, unannounced, were the pool made anew: on the replica that
// saw the deletion, and on one started since, which knows no definition
// of the pool (no cap). A new override needs the pool in force; a name
// no pool has, under which nothing is held, is unknown.
func TestADeletedPoolsKeysStaySeen(t *testing.T) {
	t.Parallel()
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(3)}.WithDefaults()
	org := pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(3)}.WithDefaults()
	table := poolTable(t, model, org)
	first := limitertest.New(t, limitertest.Options{Backend: limitertest.Standalone, Limiter: limiter.Options{Pools: table}})
	lim := first.Limiter
	ctx := context.Background()
	user := newUser(t)
	res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: map[string]string{"model": "gpt-4o"}})
	if err != nil || !res.Granted {
		t.Fatalf("acquire: %+v, %v", res, err)
	}
	if _, err := lim.SetPoolOverride(ctx, "model", "gpt-4o", limiter.OverrideRequest{MaxConcurrentStreams: 50, For: time.Hour, Actor: "t", Reason: "launch"}); err != nil {
		t.Fatal(err)
	}
	if err := table.Replace([]pools.Pool{org}); err != nil { // model is deleted
		t.Fatal(err)
	}
	if beat, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: res.StreamID}); err != nil || !beat.Alive {
		t.Fatalf("heartbeat after the pool's deletion: %+v, %v; want alive", beat, err)
	}
	got, err := lim.PoolSlots(ctx, "model", "gpt-4o")
	if err != nil || got.Used != 1 || len(got.Holders) != 1 || got.Holders[0].StreamID != res.StreamID || got.Limit != 3 || got.Override == nil || !got.Deleted {
		t.Errorf("PoolSlots of the deleted pool's key: %+v, %v; want its holder, its last cap of 3, the override, deleted", got, err)
	}

	// A replica started since: the same Redis and prefix, org alone.
	later := limitertest.New(t, limitertest.Options{Backend: limitertest.Standalone,
		Limiter: limiter.Options{Pools: poolTable(t, org), Keys: keys.Schema{Prefix: first.Keys.Prefix}}}).Limiter
	got, err = later.PoolSlots(ctx, "model", "gpt-4o")
	if err != nil || got.Used != 1 || len(got.Holders) != 1 || got.Holders[0].StreamID != res.StreamID || got.Holders[0].UserID != user ||
		got.Capped || got.Override == nil || !got.Deleted {
		t.Errorf("PoolSlots of the deleted pool's key on a replica started since: %+v, %v; want its holder, no cap known, the override, deleted", got, err)
	}
	if _, err := later.PoolSlots(ctx, "model", "llama"); !errors.Is(err, limiter.ErrUnknownPool) {
		t.Errorf("PoolSlots of a key of the deleted pool that holds nothing, on a replica started since: %v; want ErrUnknownPool", err)
	}
	if removed, err := later.RemovePoolOverride(ctx, "model", "gpt-4o"); err != nil || !removed {
		t.Errorf("removing the deleted pool's key's override on a replica started since: %v, %v; want removed", removed, err)
	}
	if removed, err := later.RemovePoolOverride(ctx, "model", "gpt-4o"); !errors.Is(err, limiter.ErrUnknownPool) || removed {
		t.Errorf("removing it again there: %v, %v; want ErrUnknownPool (no pool, no override)", removed, err)
	}
	if removed, err := lim.RemovePoolOverride(ctx, "model", "gpt-4o"); !errors.Is(err, limiter.ErrUnknownPool) || removed {
		t.Errorf("removing it again on the replica that saw the deletion: %v, %v; want ErrUnknownPool, as the other replica answers", removed, err)
	}
	if _, err := lim.PoolSlots(ctx, "model", "llama"); !errors.Is(err, limiter.ErrUnknownPool) {
		t.Errorf("PoolSlots of a key of the deleted pool that holds nothing, on the replica that saw the deletion: %v; want ErrUnknownPool, as the other replica answers", err)
	}
	if _, err := later.SetPoolOverride(ctx, "model", "gpt-4o", limiter.OverrideRequest{MaxConcurrentStreams: 50, For: time.Hour, Actor: "t", Reason: "again"}); !errors.Is(err, limiter.ErrUnknownPool) {
		t.Errorf("a new override of the deleted pool's key on a replica started since: %v; want ErrUnknownPool", err)
	}
	if _, err := lim.SetPoolOverride(ctx, "model", "gpt-4o", limiter.OverrideRequest{MaxConcurrentStreams: 50, For: time.Hour, Actor: "t", Reason: "again"}); !errors.Is(err, limiter.ErrUnknownPool) {
		t.Errorf("a new override of the deleted pool's key: %v; want ErrUnknownPool", err)
	}
	if _, err := lim.PoolSlots(ctx, "region", "eu"); !errors.Is(err, limiter.ErrUnknownPool) {
		t.Errorf("PoolSlots of a pool never configured: %v; want ErrUnknownPool", err)
	}
}
