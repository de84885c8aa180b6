package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

// TestAHungUsersShardLeavesABatchsHealthyMembershipsAlive (DESIGN §10: a
// node that is down or hung never stops heartbeats to slots on healthy
// nodes, within one decision; §16: a stream's memberships are slots of
// their pool keys, kept by its heartbeat). A batch names stream A, whose
// user's slot is on a hung (SIGSTOPped) master, and streams B, whose
// user's slot and pool key are on healthy masters, one in a pool that
// fails closed, one in a pool that fails open. A is kept alive degraded;
// each B is alive from Redis, not degraded, its membership extended,
// whether the replica granted the streams (and remembers their pools) or
// never saw them.
func TestAHungUsersShardLeavesABatchsHealthyMembershipsAlive(t *testing.T) {
	t.Parallel()
	cl := startHangableCluster(t)
	schema := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	hung := cl.MasterOf(mustPoolKey(t, schema, "model", "m-0"))
	var userHung, userOK, closedKey, openKey string
	for i := 0; i < 5000 && (userHung == "" || userOK == "" || closedKey == "" || openKey == ""); i++ {
		u := newUser(t)
		k, _ := schema.UserKey(u)
		switch {
		case cl.MasterOf(k) == hung && userHung == "":
			userHung = u
		case cl.MasterOf(k) != hung && userOK == "":
			userOK = u
		}
		mk := fmt.Sprintf("k-%d", i)
		if closedKey == "" && cl.MasterOf(mustPoolKey(t, schema, "closed", mk)) != hung {
			closedKey = mk
		}
		if openKey == "" && cl.MasterOf(mustPoolKey(t, schema, "open", mk)) != hung {
			openKey = mk
		}
	}
	if userHung == "" || userOK == "" || closedKey == "" || openKey == "" {
		t.Fatalf("no user on %s, or no user or pool keys off it", hung)
	}
	const ttl, timeout = 4 * time.Second, 300 * time.Millisecond
	const bound, slack = timeout + 100*time.Millisecond, 200 * time.Millisecond
	table := poolTable(t,
		pools.Pool{Pool: "closed", MaxConcurrentStreams: ptr(1), FailureMode: tiers.FailClosed},
		pools.Pool{Pool: "open", MaxConcurrentStreams: ptr(1)},
	)
	ts := []tiers.Tier{{Plan: "t", MaxConcurrentStreams: 3, SlotTTL: ttl, HeartbeatInterval: ttl / 4, FailureMode: tiers.FailOpen}}
	newLim := func() *limiter.Limiter {
		return limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: cl.Addrs, Timeout: timeout},
			Tiers: ts, Limiter: limiter.Options{Keys: schema, Pools: table}}).Limiter
	}
	granter, other := newLim(), newLim() // two replicas; other never saw the grants
	ctx := context.Background()
	a, err := granter.Acquire(ctx, limiter.AcquireRequest{UserID: userHung, Plan: "t"})
	if err != nil || !a.Granted || a.Degraded {
		t.Fatalf("acquire A: %+v, %v", a, err)
	}
	bClosed, err := granter.Acquire(ctx, limiter.AcquireRequest{UserID: userOK, Plan: "t", Pools: map[string]string{"closed": closedKey}})
	if err != nil || !bClosed.Granted || bClosed.Degraded {
		t.Fatalf("acquire B in the closed pool: %+v, %v", bClosed, err)
	}
	bOpen, err := granter.Acquire(ctx, limiter.AcquireRequest{UserID: userOK, Plan: "t", Pools: map[string]string{"open": openKey}})
	if err != nil || !bOpen.Granted || bOpen.Degraded {
		t.Fatalf("acquire B in the open pool: %+v, %v", bOpen, err)
	}
	// Both replicas' connections to every node, warm.
	for _, l := range []*limiter.Limiter{granter, other} {
		if _, errs := l.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{{UserID: userHung, Plan: "t", StreamID: a.StreamID}}); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	// Dialled before the stop: finding a master asks every node, the hung one too.
	closedPK, openPK := mustPoolKey(t, schema, "closed", closedKey), mustPoolKey(t, schema, "open", openKey)
	nodeOf := map[string]node{
		closedPK: dialNodes(t, []string{cl.MasterOf(closedPK)})[0],
		openPK:   dialNodes(t, []string{cl.MasterOf(openPK)})[0],
	}
	expiry := func(pk, stream string) int64 {
		t.Helper()
		n := nodeOf[pk]
		s, err := n.client.Do(ctx, n.client.B().Zscore().Key(pk).Member(stream+" "+userOK).Build()).ToString()
		if err != nil {
			t.Fatalf("ZSCORE %s: %v (membership gone)", pk, err)
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("ZSCORE %s: %q: %v", pk, s, err)
		}
		return v
	}
	testenv.Pause(t, hung)

	batch := []limiter.HeartbeatRequest{
		{UserID: userHung, Plan: "t", StreamID: a.StreamID},
		{UserID: userOK, Plan: "t", StreamID: bClosed.StreamID},
		{UserID: userOK, Plan: "t", StreamID: bOpen.StreamID},
	}
	for _, c := range []struct {
		name string
		lim  *limiter.Limiter
	}{{"a replica that never saw the streams", other}, {"the replica that granted them", granter}} {
		beforeClosed, beforeOpen := expiry(closedPK, bClosed.StreamID), expiry(openPK, bOpen.StreamID)
		time.Sleep(200 * time.Millisecond) // so that an extension moves the scores
		start := time.Now()
		beats, errs := c.lim.HeartbeatBatch(ctx, batch)
		took := time.Since(start)
		afterClosed, afterOpen := expiry(closedPK, bClosed.StreamID), expiry(openPK, bOpen.StreamID)
		t.Logf("%s: batch answered in %v", c.name, took.Round(time.Millisecond))
		if took > bound+slack {
			t.Errorf("%s: the batch took %v; want within one decision (%v, +%v slack)", c.name, took.Round(time.Millisecond), bound, slack)
		}
		if errs[0] != nil || !beats[0].Alive || !beats[0].Degraded {
			t.Errorf("%s: A, its user's shard hung, its plan Open: %+v, %v; want alive, degraded", c.name, beats[0], errs[0])
		}
		if errs[1] != nil || !beats[1].Alive || beats[1].Degraded {
			t.Errorf("%s: B in the closed pool, its user's and pool key's shards healthy: %+v, %v; want alive from Redis, not degraded", c.name, beats[1], errs[1])
		}
		if errs[2] != nil || !beats[2].Alive || beats[2].Degraded {
			t.Errorf("%s: B in the open pool, its user's and pool key's shards healthy: %+v, %v; want alive from Redis, not degraded", c.name, beats[2], errs[2])
		}
		// Kept by its own TTL from the batch on: not the grant's, nor a
		// degraded estimate's.
		if afterClosed <= beforeClosed || afterClosed < start.Add(ttl).UnixMilli()-50 {
			t.Errorf("%s: B's membership of closed=%s (healthy shard) expires at %d, before the batch at %d; want extended by the batch to about %d", c.name, closedKey, afterClosed, beforeClosed, start.Add(ttl).UnixMilli())
		}
		if afterOpen <= beforeOpen || afterOpen < start.Add(ttl).UnixMilli()-50 {
			t.Errorf("%s: B's membership of open=%s (healthy shard) expires at %d, before the batch at %d; want extended by the batch to about %d", c.name, openKey, afterOpen, beforeOpen, start.Add(ttl).UnixMilli())
		}
	}
}

// TestAClosedPoolsOutageInAHeartbeatNamesThePool (api/openapi.yaml:
// limiter_unavailable names what fails closed): a stream of a plan
// failing Open joined a pool failing Closed; Redis stops answering. Its
// heartbeat, alone and in a batch, answers ErrUnavailable as a
// *PoolUnavailableError naming the pool key, as an acquire joining it
// does, so that the API names the pool and not "this plan fails closed".
func TestAClosedPoolsOutageInAHeartbeatNamesThePool(t *testing.T) {
	t.Parallel()
	path := testenv.StartProxy(t, testenv.Redis(t))
	ts := []tiers.Tier{tiers.Tier{Plan: "open", MaxConcurrentStreams: 3, FailureMode: tiers.FailOpen}.WithDefaults()}
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(5), FailureMode: tiers.FailClosed})
	lim := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 200 * time.Millisecond},
		Tiers: ts, Limiter: limiter.Options{Pools: table}}).Limiter
	ctx := context.Background()
	user := newUser(t)
	res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "open", Pools: map[string]string{"model": "k"}})
	if err != nil || !res.Granted || res.Degraded {
		t.Fatalf("acquire: %+v, %v", res, err)
	}
	path.BlackHole()

	req := limiter.HeartbeatRequest{UserID: user, Plan: "open", StreamID: res.StreamID}
	beat, err := lim.Heartbeat(ctx, req)
	beats, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{req})
	for _, c := range []struct {
		name string
		beat limiter.HeartbeatResult
		err  error
	}{{"heartbeat", beat, err}, {"batch heartbeat", beats[0], errs[0]}} {
		var poolErr *limiter.PoolUnavailableError
		if !errors.Is(c.err, limiter.ErrUnavailable) || !errors.As(c.err, &poolErr) || poolErr.Pool != "model" || poolErr.Key != "k" || c.beat.Alive {
			t.Errorf("%s of a stream in a Closed pool, Redis not answering: %+v, %v; want ErrUnavailable as a PoolUnavailableError naming model=k, not alive", c.name, c.beat, c.err)
		}
	}
}
