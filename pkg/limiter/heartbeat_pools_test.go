package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestARefusedPoolScriptIsNotAnOutage (classify's contract; DESIGN §4:
// degraded is for a Redis that is unreachable or slow; api/openapi.yaml,
// HeartbeatResult: `internal` is a key of another type under the prefix):
// a pooled stream whose pool key was replaced by a string is answered
// ErrRedisRefused by its heartbeat, alone and in a batch, as an acquire
// joining the key is, not kept alive degraded as if the pool's shard did
// not answer.
func TestARefusedPoolScriptIsNotAnOutage(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(5)})
			st := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 30 * time.Second},
				Limiter: limiter.Options{Pools: table}})
			lim := st.Limiter
			ctx := context.Background()
			user := newUser(t)
			res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: map[string]string{"model": "m"}})
			if err != nil || !res.Granted || res.Degraded {
				t.Fatalf("acquire: %+v, %v", res, err)
			}
			pk, err := st.Keys.PoolKey("model", "m")
			if err != nil {
				t.Fatal(err)
			}
			c, err := st.Redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Do(ctx, c.B().Del().Key(pk).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if err := c.Do(ctx, c.B().Set().Key(pk).Value("not a sorted set").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if got, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: map[string]string{"model": "m"}}); !errors.Is(err, limiter.ErrRedisRefused) || got.Degraded {
				t.Fatalf("acquire joining the key of another type: %+v, %v; want ErrRedisRefused, as the heartbeat below", got, err)
			}

			req := limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: res.StreamID}
			beat, err := lim.Heartbeat(ctx, req)
			if !errors.Is(err, limiter.ErrRedisRefused) || errors.Is(err, limiter.ErrUnavailable) || beat.Alive || beat.Degraded {
				t.Errorf("heartbeat of a stream whose pool key is of another type: %+v, %v; want ErrRedisRefused, not alive, not degraded", beat, err)
			}
			beats, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{req})
			if !errors.Is(errs[0], limiter.ErrRedisRefused) || errors.Is(errs[0], limiter.ErrUnavailable) || beats[0].Alive || beats[0].Degraded {
				t.Errorf("batch heartbeat of the same stream: %+v, %v; want ErrRedisRefused, not alive, not degraded", beats[0], errs[0])
			}
		})
	}
}

// TestALostMembershipBesideAHungPoolAnswersWithinOneDecision (DESIGN §10
// P4: every decision within redis.timeout + 100ms, whatever Redis does):
// a stream joined pool x, its key on a healthy master, and pool y, its key
// on a hung (SIGSTOPped) master; its membership of x is gone (support, a
// failover). Its heartbeat, alone and in a batch, answers ErrSlotLost
// naming x within one decision, though y's shard took all of it; the
// lost stream's slot is dropped all the same, beside the answer.
func TestALostMembershipBesideAHungPoolAnswersWithinOneDecision(t *testing.T) {
	t.Parallel()
	cl := startHangableCluster(t)
	schema := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	hung := cl.MasterOf(mustPoolKey(t, schema, "y", "m-0"))
	var user, xKey, yKey string
	for i := 0; i < 5000 && (user == "" || xKey == "" || yKey == ""); i++ {
		u := newUser(t)
		k, _ := schema.UserKey(u)
		if cl.MasterOf(k) != hung && user == "" {
			user = u
		}
		mk := fmt.Sprintf("k-%d", i)
		if xKey == "" && cl.MasterOf(mustPoolKey(t, schema, "x", mk)) != hung {
			xKey = mk
		}
		if yKey == "" && cl.MasterOf(mustPoolKey(t, schema, "y", mk)) == hung {
			yKey = mk
		}
	}
	if user == "" || xKey == "" || yKey == "" {
		t.Fatalf("no user and x key off %s, or no y key on it", hung)
	}
	const timeout = 400 * time.Millisecond
	// P4's bound, and room for a loaded machine under -race: still less
	// than the two deadlines of a heartbeat whose drop had one of its own.
	const bound, slack = timeout + 100*time.Millisecond, 200 * time.Millisecond
	table := poolTable(t, pools.Pool{Pool: "x", MaxConcurrentStreams: ptr(5)}, pools.Pool{Pool: "y", MaxConcurrentStreams: ptr(5)})
	ts := []tiers.Tier{{Plan: "t", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen}}
	lim := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: cl.Addrs, Timeout: timeout},
		Tiers: ts, Limiter: limiter.Options{Keys: schema, Pools: table}}).Limiter
	ctx := context.Background()
	pk := mustPoolKey(t, schema, "x", xKey)
	n := dialNodes(t, []string{cl.MasterOf(pk)})[0]
	var streams []string
	for range 2 {
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "t", Pools: map[string]string{"x": xKey, "y": yKey}})
		if err != nil || !res.Granted || res.Degraded {
			t.Fatalf("acquire: %+v, %v", res, err)
		}
		if err := n.client.Do(ctx, n.client.B().Zrem().Key(pk).Member(res.StreamID+" "+user).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, res.StreamID)
	}
	testenv.Pause(t, hung)

	for i, batch := range []bool{false, true} {
		req := limiter.HeartbeatRequest{UserID: user, Plan: "t", StreamID: streams[i]}
		var beat limiter.HeartbeatResult
		var err error
		start := time.Now()
		if batch {
			beats, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{req})
			beat, err = beats[0], errs[0]
		} else {
			beat, err = lim.Heartbeat(ctx, req)
		}
		took := time.Since(start)
		t.Logf("batch=%v: %+v, %v in %v", batch, beat, err, took.Round(time.Millisecond))
		if !errors.Is(err, limiter.ErrSlotLost) || !strings.Contains(err.Error(), "pool x="+xKey) || beat.Alive || beat.Degraded {
			t.Errorf("batch=%v: heartbeat of a stream whose membership of x is lost: %+v, %v; want ErrSlotLost naming pool x=%s", batch, beat, err, xKey)
		}
		if took > bound+slack {
			t.Errorf("batch=%v: heartbeat of a stream whose membership of x is lost, beside a hung pool y, took %v; want within one decision (%v, +%v slack)", batch, took.Round(time.Millisecond), bound, slack)
		}
	}
	// The lost streams' slots, on a healthy master, are dropped.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		slots, err := lim.Slots(ctx, user)
		if err == nil && slots.Used == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("2s after their heartbeats answered lost, the user holds %+v (%v); want the lost streams' slots dropped", slots, err)
		}
	}
}
