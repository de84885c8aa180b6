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

// TestAPoolOnAHungMasterAnswersByItsFailureModeWithinOneDeadline (DESIGN
// §10 P4 and §16): with the master of some pool keys stopped (SIGSTOP, a
// hung node), an acquire that joins two of them still answers within one
// per-call deadline (+100ms), not one per pool: granted degraded when the
// pools fail open, a pool key on a healthy master counted all the same,
// though the healthy masters lack the scripts (NOSCRIPT, then EVAL),
// whether rueidis bounds the call itself (the first call after the stop,
// as a rule) or the limiter does (after the first timeout, see
// deadlineClient); refused with ErrUnavailable when one fails closed, the
// user's slot then free again. Streams whose scopes are on the healthy
// masters keep beating, alone and in a batch beside a stream in a hung
// pool, which is kept alive degraded.
func TestAPoolOnAHungMasterAnswersByItsFailureModeWithinOneDeadline(t *testing.T) {
	t.Parallel()
	const timeout = 400 * time.Millisecond
	// P4's bound, and room for a loaded machine under -race: still less
	// than the two deadlines of an acquire whose pool steps had one each.
	const bound, slack = timeout + 100*time.Millisecond, 200 * time.Millisecond
	cl := startHangableCluster(t)
	nodes := dialNodes(t, cl.Addrs)
	schema := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}

	// Pool keys and users on the master to stop and on the others.
	hung := cl.MasterOf(mustPoolKey(t, schema, "model", "m-0"))
	find := func(what string, on bool, key func(i int) (string, string)) string {
		t.Helper()
		for i := range 2000 {
			name, k := key(i)
			if (cl.MasterOf(k) == hung) == on {
				return name
			}
		}
		t.Fatalf("no %s found on the wanted side of %s", what, hung)
		return ""
	}
	poolKey := func(pool string) func(int) (string, string) {
		return func(i int) (string, string) {
			name := fmt.Sprintf("k-%d", i)
			return name, mustPoolKey(t, schema, pool, name)
		}
	}
	userKey := func(i int) (string, string) {
		user := fmt.Sprintf("u-%d-%s", i, keys.NewStreamID()[:6])
		k, err := schema.UserKey(user)
		if err != nil {
			t.Fatal(err)
		}
		return user, k
	}
	hungModel := find("model key", true, poolKey("model"))
	hungRegion := find("region key", true, poolKey("region"))
	hungOrg := find("org key", true, poolKey("org"))
	healthyModel := find("model key", false, poolKey("model"))
	healthyTeam := find("team key", false, poolKey("team"))
	users := make([]string, 5)
	for i := range users {
		users[i] = find("user", false, userKey)
	}

	table := poolTable(t,
		pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(10)},
		pools.Pool{Pool: "region", MaxConcurrentStreams: ptr(10)},
		pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(10), FailureMode: tiers.FailClosed},
		pools.Pool{Pool: "team", MaxConcurrentStreams: ptr(10)},
	)
	lim := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: cl.Addrs, Timeout: timeout},
		Limiter: limiter.Options{Keys: schema, Pools: table}}).Limiter
	ctx := context.Background()
	acquire := func(user string, named map[string]string) (limiter.AcquireResult, error, time.Duration) {
		start := time.Now()
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: named})
		return res, err, time.Since(start)
	}
	within := func(what string, took time.Duration) {
		t.Helper()
		t.Logf("%s: answered in %v", what, took.Round(time.Millisecond))
		if took > bound+slack {
			t.Errorf("%s took %v, want within one per-call deadline + 100ms (%v, +%v slack)", what, took.Round(time.Millisecond), bound, slack)
		}
	}

	healthy, err, _ := acquire(users[0], map[string]string{"model": healthyModel})
	if err != nil || !healthy.Granted || healthy.Degraded {
		t.Fatalf("acquire on healthy masters: %+v, %v; want granted from Redis", healthy, err)
	}
	// Warm every node's connection before the stop.
	if res, err, _ := acquire(users[1], map[string]string{"model": hungModel, "region": hungRegion}); err != nil || !res.Granted || res.Degraded {
		t.Fatalf("acquire before the stop: %+v, %v", res, err)
	}
	// Until two dial timeouts after the latest dial, the limiter bounds
	// each call by its deadline itself; from then on rueidis does, and the
	// calls run in their callers' goroutines (see cluster.Client.HonorsDeadlines).
	inCaller := func() bool {
		wrapped := limiter.WrappedCalls(lim)
		if _, err := lim.Slots(ctx, users[0]); err != nil {
			t.Fatalf("Slots: %v", err)
		}
		return limiter.WrappedCalls(lim) == wrapped
	}
	for deadline := time.Now().Add(10 * time.Second); !inCaller(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the limiter's calls never ran in their callers' goroutines")
		}
	}
	// The healthy nodes lack the scripts, as after a restart or a
	// failover: each answers NOSCRIPT first, and must get its EVAL without
	// waiting for the hung node's answers.
	flushHealthy := func() {
		t.Helper()
		for _, n := range nodes {
			if n.addr == hung {
				continue
			}
			if err := n.client.Do(ctx, n.client.B().ScriptFlush().Build()).Error(); err != nil {
				t.Fatalf("SCRIPT FLUSH on %s: %v", n.addr, err)
			}
		}
	}
	flushHealthy()
	testenv.Pause(t, hung)

	wrapped := limiter.WrappedCalls(lim)
	open, err, took := acquire(users[2], map[string]string{"model": hungModel, "region": hungRegion, "team": healthyTeam})
	within("an acquire joining two pools that fail open, both on the stopped master", took)
	// Bounded by rueidis, unless the limiter's probe of the stopped master
	// failed first: the same answers are asserted either way.
	t.Logf("the first acquire after the stop ran in its caller's goroutine: %v", limiter.WrappedCalls(lim) == wrapped)
	if err != nil || !open.Granted || !open.Degraded || len(open.Pools) != 3 || !open.Pools[0].Degraded || !open.Pools[1].Degraded {
		t.Errorf("acquire with two open pools on the stopped master: %+v, %v; want granted, degraded in both pools", open, err)
	} else if team := open.Pools[2]; team.Degraded || team.Used != 1 {
		t.Errorf("the same acquire's pool key on a healthy master: %+v; want counted, 1 used", team)
	}
	// From the first timeout on, the limiter bounds its calls by their
	// deadline itself, each node's commands on a goroutine of their own.
	// The acquire may answer before the timeout of its hung node's
	// commands is noted: wait for it.
	for deadline := time.Now().Add(5 * time.Second); inCaller(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the limiter's calls still ran in their callers' goroutines 5s after a timeout")
		}
	}
	flushHealthy()
	wrapped = limiter.WrappedCalls(lim)
	again, err, took := acquire(users[4], map[string]string{"model": hungModel, "team": healthyTeam})
	within("an acquire joining a pool on the stopped master and one on a healthy one, the limiter bounding the call", took)
	if limiter.WrappedCalls(lim) == wrapped {
		t.Errorf("the acquire after the first timeout ran in its caller's goroutine; want it bounded by the limiter")
	}
	if err != nil || !again.Granted || len(again.Pools) != 2 || !again.Pools[0].Degraded {
		t.Errorf("acquire with an open pool on the stopped master: %+v, %v; want granted, degraded in it", again, err)
	} else if team := again.Pools[1]; team.Degraded || team.Used != 2 {
		t.Errorf("the same acquire's pool key on a healthy master: %+v; want counted, 2 used", team)
	}

	closed, err, took := acquire(users[3], map[string]string{"model": healthyModel, "org": hungOrg})
	within("an acquire joining a pool that fails closed on the stopped master", took)
	if !errors.Is(err, limiter.ErrUnavailable) || closed.Granted {
		t.Errorf("acquire with a closed pool on the stopped master: %+v, %v; want ErrUnavailable", closed, err)
	}
	// What the refused acquire took is gone: the user's three slots and
	// the healthy model key's (it holds the first user's stream alone).
	// The undo had 50ms past the decision's end; on a loaded machine what
	// it could not confirm by then is removed beside the answer.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		slots, err := lim.Slots(ctx, users[3])
		key, keyErr := lim.PoolSlots(ctx, "model", healthyModel)
		if err == nil && slots.Used == 0 && keyErr == nil && key.Used == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("2s after the refusal, the refused user holds %+v (%v) and model=%s %+v (%v); want nothing, and the first user's stream alone", slots, err, healthyModel, key, keyErr)
		}
	}
	for i := range 3 {
		if res, err, _ := acquire(users[3], nil); err != nil || !res.Granted || res.Degraded || res.Used != i+1 {
			t.Errorf("the refused user's slot %d: %+v, %v; want granted, %d used", i+1, res, err, i+1)
		}
	}
	if res, err, _ := acquire(users[0], map[string]string{"model": healthyModel}); err != nil || !res.Granted || res.Pools[0].Used != 2 {
		t.Errorf("the healthy model key after the refusal: %+v, %v; want 2 members (the refused one removed)", res, err)
	}

	start := time.Now()
	beat, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: users[0], Plan: "three", StreamID: healthy.StreamID})
	if err != nil || !beat.Alive || beat.Degraded {
		t.Errorf("heartbeat of a stream on healthy masters: %+v, %v; want alive from Redis", beat, err)
	}
	within("a heartbeat on healthy masters", time.Since(start))
	start = time.Now()
	beat, err = lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: users[2], Plan: "three", StreamID: open.StreamID})
	within("a heartbeat of a stream in two pools on the stopped master", time.Since(start))
	if err != nil || !beat.Alive || !beat.Degraded {
		t.Errorf("heartbeat of a stream in pools on the stopped master: %+v, %v; want alive, degraded", beat, err)
	}
	start = time.Now()
	beats, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{
		{UserID: users[0], Plan: "three", StreamID: healthy.StreamID},
		{UserID: users[2], Plan: "three", StreamID: open.StreamID},
	})
	within("a batch of both", time.Since(start))
	if errs[0] != nil || !beats[0].Alive || beats[0].Degraded {
		t.Errorf("batch: the stream on healthy masters: %+v, %v; want alive from Redis", beats[0], errs[0])
	}
	if errs[1] != nil || !beats[1].Alive || !beats[1].Degraded {
		t.Errorf("batch: the stream in pools on the stopped master: %+v, %v; want alive, degraded", beats[1], errs[1])
	}
}

// startHangableCluster starts a private cluster configured as one that a
// hung node must not stop: its stopped master stays a master, and the
// others serve their own slots meanwhile (no failover within a test,
// and no CLUSTERDOWN for the slots that are served).
func startHangableCluster(t *testing.T) *testenv.PrivateCluster {
	t.Helper()
	cl := testenv.StartPrivateCluster(t)
	for _, n := range dialNodes(t, cl.Addrs) {
		for _, set := range [][2]string{{"cluster-node-timeout", "60000"}, {"cluster-require-full-coverage", "no"}} {
			if err := n.client.Do(context.Background(), n.client.B().ConfigSet().ParameterValue().ParameterValue(set[0], set[1]).Build()).Error(); err != nil {
				t.Fatalf("CONFIG SET %s %s on %s: %v", set[0], set[1], n.addr, err)
			}
		}
	}
	return cl
}

// TestMembershipsOnHealthyShardsOutliveTheUsersShardsOutage (DESIGN §10:
// a node that is down never stops heartbeats to slots on healthy nodes;
// §16: no cap is exceeded): the master of a user's slot hangs (SIGSTOP)
// while the pool key its stream joined (cap 1, failing closed) is on a
// healthy master. The stream heartbeats for three TTLs, degraded (its plan
// fails open), alone and in a batch: its membership, whose key answers,
// is kept alive all the same, so the key still refuses another stream.
// Another caller's heartbeat of it is ErrNotSlotHolder, and a
// membership removed meanwhile ends the stream (ErrSlotLost naming the
// pool).
func TestMembershipsOnHealthyShardsOutliveTheUsersShardsOutage(t *testing.T) {
	t.Parallel()
	cl := startHangableCluster(t)
	schema := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	hung := cl.MasterOf(mustPoolKey(t, schema, "model", "m-0"))
	var user, other, model string
	for i := 0; i < 5000 && (user == "" || other == "" || model == ""); i++ {
		u := newUser(t)
		k, _ := schema.UserKey(u)
		switch {
		case cl.MasterOf(k) == hung && user == "":
			user = u
		case cl.MasterOf(k) != hung && other == "":
			other = u
		}
		if mk := fmt.Sprintf("k-%d", i); model == "" && cl.MasterOf(mustPoolKey(t, schema, "model", mk)) != hung {
			model = mk
		}
	}
	if user == "" || other == "" || model == "" {
		t.Fatalf("no user on %s, or no user or pool key off it", hung)
	}
	const ttl, timeout = 2 * time.Second, 200 * time.Millisecond
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), FailureMode: tiers.FailClosed})
	ts := []tiers.Tier{{Plan: "t", MaxConcurrentStreams: 3, SlotTTL: ttl, HeartbeatInterval: ttl / 4, FailureMode: tiers.FailOpen}}
	lim := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: cl.Addrs, Timeout: timeout},
		Tiers: ts, Limiter: limiter.Options{Keys: schema, Pools: table}}).Limiter
	ctx := context.Background()
	joins := map[string]string{"model": model}
	res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "t", Caller: "a", Pools: joins})
	if err != nil || !res.Granted || res.Degraded {
		t.Fatalf("acquire: %+v, %v", res, err)
	}
	if r, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: other, Plan: "t", Caller: "a", Pools: joins}); err != nil || r.Granted {
		t.Fatalf("another stream before the outage: %+v, %v; want refused by model=%s", r, err, model)
	}
	testenv.Pause(t, hung)

	req := limiter.HeartbeatRequest{UserID: user, Plan: "t", StreamID: res.StreamID, Caller: "a"}
	for i, end := 0, time.Now().Add(3*ttl); time.Now().Before(end); i++ {
		start := time.Now()
		beat, err := lim.Heartbeat(ctx, req)
		if i%2 == 1 {
			beats, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{req})
			beat, err = beats[0], errs[0]
		}
		if err != nil || !beat.Alive || !beat.Degraded {
			t.Fatalf("heartbeat %d in the user's shard's outage: %+v, %v; want alive, degraded", i, beat, err)
		}
		// One decision (P4: the timeout + 100ms; and room for -race).
		if d := time.Since(start); d > timeout+300*time.Millisecond {
			t.Errorf("heartbeat %d in the user's shard's outage answered in %v; want within one decision", i, d)
		}
		time.Sleep(ttl / 4)
	}
	if key, err := lim.PoolSlots(ctx, "model", model); err != nil || key.Used != 1 {
		t.Errorf("model=%s after three TTLs of degraded heartbeats: used %d, %v; want its one member", model, key.Used, err)
	}
	r, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: other, Plan: "t", Caller: "a", Pools: joins})
	if err != nil || r.Granted || r.RefusedBy == nil || r.RefusedBy.Key != model {
		t.Errorf("another stream joining model=%s (cap 1, its shard healthy) while the first runs on: %+v, %v; want refused", model, r, err)
	}

	hostile := req
	hostile.Caller = "b"
	if beat, err := lim.Heartbeat(ctx, hostile); !errors.Is(err, limiter.ErrNotSlotHolder) || beat.Alive {
		t.Errorf("caller b's heartbeat of caller a's stream in the outage: %+v, %v; want ErrNotSlotHolder", beat, err)
	}
	if key, err := lim.PoolSlots(ctx, "model", model); err != nil || key.Used != 1 {
		t.Errorf("model=%s after caller b's heartbeat: used %d, %v; want caller a's member kept", model, key.Used, err)
	}

	// The membership removed (support, or its TTL run out unseen): the
	// stream is over, and the heartbeat says which scope lost it.
	pk := mustPoolKey(t, schema, "model", model)
	n := dialNodes(t, []string{cl.MasterOf(pk)})[0]
	if err := n.client.Do(ctx, n.client.B().Zrem().Key(pk).Member(res.StreamID+" "+user).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if beat, err := lim.Heartbeat(ctx, req); !errors.Is(err, limiter.ErrSlotLost) || !strings.Contains(err.Error(), "pool model="+model) || beat.Alive || beat.Degraded {
		t.Errorf("heartbeat after the membership went: %+v, %v; want ErrSlotLost naming pool model=%s, not degraded", beat, err, model)
	}
	// Lost, not "assumed alive": the API's batch result would read
	// {alive: false, degraded: true}.
	if beats, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{req}); !errors.Is(errs[0], limiter.ErrSlotLost) || beats[0].Alive || beats[0].Degraded {
		t.Errorf("batch heartbeat after the membership went: %+v, %v; want ErrSlotLost, not degraded", beats[0], errs[0])
	}
}

func mustPoolKey(t *testing.T, schema keys.Schema, pool, key string) string {
	t.Helper()
	k, err := schema.PoolKey(pool, key)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestAPoolThatFailsClosedRefusesWhenTheUsersSlotCannotBeTaken: Redis
// does not answer (black-holed) and the plan fails open: an acquire that
// names a pool failing closed is refused with ErrUnavailable naming that
// pool, not granted degraded past its cap uncounted; one naming pools
// that fail open is granted degraded, and says so of each pool key.
func TestAPoolThatFailsClosedRefusesWhenTheUsersSlotCannotBeTaken(t *testing.T) {
	t.Parallel()
	proxy := testenv.StartProxy(t, testenv.Redis(t))
	table := poolTable(t,
		pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(10)},
		pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(10), FailureMode: tiers.FailClosed},
	)
	lim := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: 300 * time.Millisecond},
		Limiter: limiter.Options{Pools: table}}).Limiter
	ctx := context.Background()
	if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: map[string]string{"org": "acme"}}); err != nil || !res.Granted || res.Degraded {
		t.Fatalf("acquire before the outage: %+v, %v", res, err)
	}
	proxy.BlackHole()

	res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: map[string]string{"model": "m", "org": "acme"}})
	var poolErr *limiter.PoolUnavailableError
	if !errors.Is(err, limiter.ErrUnavailable) || !errors.As(err, &poolErr) || poolErr.Pool != "org" || poolErr.Key != "acme" || res.Granted {
		t.Fatalf("an acquire joining org (failing closed) in the outage: %+v, %v; want ErrUnavailable naming org=acme", res, err)
	}
	res, err = lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: map[string]string{"model": "m"}})
	if err != nil || !res.Granted || !res.Degraded || len(res.Pools) != 1 || !res.Pools[0].Degraded || res.Pools[0].Key != "m" {
		t.Fatalf("an acquire joining model (failing open) in the outage: %+v, %v; want granted degraded, model=m degraded", res, err)
	}
	// A degraded expiry is in whole milliseconds, as Redis's are.
	beat, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: newUser(t), Plan: "three", StreamID: res.StreamID})
	if err != nil || !beat.Degraded {
		t.Fatalf("a heartbeat in the outage: %+v, %v; want degraded", beat, err)
	}
	for what, at := range map[string]time.Time{"the acquire's": res.ExpiresAt, "the heartbeat's": beat.ExpiresAt} {
		if at.IsZero() || !at.Equal(at.Truncate(time.Millisecond)) {
			t.Errorf("%s degraded expiry %s; want whole milliseconds", what, at.Format(time.RFC3339Nano))
		}
	}
}

// TestADegradedPoolGrantLeavesNoOtherRequestsPlace: an acquire (on
// replica A) and its retry (on replica B) wait for model=k (cap 1, failing
// open); B loses Redis. A's loop grants k to the first, which then waits
// for org=acme; B's loop fails and grants the retry k degraded (nothing in
// Redis, no share known), and the retry's join of org (failing closed)
// fails. Its undo leaves nothing of k: the first, granted once acme frees
// up, holds k, and k (cap 1) admits no other stream.
func TestADegradedPoolGrantLeavesNoOtherRequestsPlace(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	table := poolTable(t,
		pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second, FailureMode: tiers.FailOpen},
		pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second, FailureMode: tiers.FailClosed},
	)
	prefix := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	a := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{srv.Addr()}, Timeout: 5 * time.Second},
		Tiers: poolWaitTiers(), Limiter: limiter.Options{Keys: prefix, Pools: table}})
	b := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: time.Second},
		Tiers: poolWaitTiers(), Limiter: limiter.Options{Keys: prefix, Pools: table}})
	ctx := context.Background()
	acquire := func(user string, pools map[string]string) limiter.AcquireResult {
		t.Helper()
		res, err := a.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "low", Pools: pools})
		if err != nil || !res.Granted || res.Degraded {
			t.Fatalf("acquire of %v: %+v, %v", pools, res, err)
		}
		return res
	}
	u1, u2 := newUser(t), newUser(t)
	h1 := acquire(u1, map[string]string{"model": "k"})
	h2 := acquire(u2, map[string]string{"org": "acme"})
	user := newUser(t)
	req := limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "s", Pools: map[string]string{"model": "k", "org": "acme"}}
	first := queue(t, ctx, a, a.Limiter, req, 9*time.Second)
	retry := retryWaiting(t, ctx, b.Limiter, req)
	proxy.BlackHole()
	if _, err := a.Limiter.Release(ctx, u1, h1.StreamID); err != nil {
		t.Fatal(err)
	}
	keyHolds(t, a.Limiter, "model", "k", 1, "k granted to the first")
	if _, ok := retry.answer(6 * time.Second); !ok {
		t.Fatal("the retry, its Redis black-holed, did not answer within 6s")
	}
	proxy.Restore()
	time.Sleep(1500 * time.Millisecond) // what the undo left beside the answer, asked again
	if f, ok := first.answer(0); ok {
		t.Fatalf("the first answered %+v, %v; want it waiting for acme", f.res, f.err)
	}
	keyHolds(t, a.Limiter, "model", "k", 1, "the retry's undo done")
	if _, err := a.Limiter.Release(ctx, u2, h2.StreamID); err != nil {
		t.Fatal(err)
	}
	f, ok := first.answer(3 * time.Second)
	if !ok || f.err != nil || !f.res.Granted || len(f.res.Pools) != 2 {
		t.Fatalf("the first once acme freed: %+v, %v (answered %v); want granted in both", f.res, f.err, ok)
	}
	if other, err := a.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "k"}}); err != nil || other.Granted {
		t.Errorf("another stream's acquire of k (cap 1) while the first holds it: %+v, %v; want refused", other, err)
	}
	if beat, err := a.Limiter.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "low", StreamID: "s"}); err != nil || !beat.Alive {
		t.Errorf("the first's heartbeat: %+v, %v; want alive, holding k", beat, err)
	}
}

// TestAStreamIDTakenAgainIsNotBeatenByItsPredecessorsPools: a replica
// remembers the pool keys of the streams it granted and beat, to keep
// their memberships alive while their user's shard does not answer. A
// stream id released and taken again without pools must not be beaten by
// what was remembered of its predecessor: its membership gone, the
// heartbeat would end the live stream (410 naming a pool it never
// joined) instead of answering degraded. The remembered keys go when
// this replica releases the stream (for a named caller too), grants its
// id again, or beats it and its record names no pool; each is one case
// below, the other replica (R2) doing the rest.
func TestAStreamIDTakenAgainIsNotBeatenByItsPredecessorsPools(t *testing.T) {
	t.Parallel()
	cl := startHangableCluster(t)
	schema := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	hung := cl.MasterOf(mustPoolKey(t, schema, "model", "m-0"))
	var user, model string
	for i := 0; i < 5000 && (user == "" || model == ""); i++ {
		u := newUser(t)
		k, _ := schema.UserKey(u)
		if cl.MasterOf(k) == hung && user == "" {
			user = u
		}
		if mk := fmt.Sprintf("k-%d", i); model == "" && cl.MasterOf(mustPoolKey(t, schema, "model", mk)) != hung {
			model = mk
		}
	}
	if user == "" || model == "" {
		t.Fatalf("no user on %s, or no pool key off it", hung)
	}
	const ttl, timeout = 2 * time.Second, 200 * time.Millisecond
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(5)})
	ts := []tiers.Tier{{Plan: "t", MaxConcurrentStreams: 3, SlotTTL: ttl, HeartbeatInterval: ttl / 4, FailureMode: tiers.FailOpen}}
	replica := func() *limiter.Limiter {
		return limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: cl.Addrs, Timeout: timeout},
			Tiers: ts, Limiter: limiter.Options{Keys: schema, Pools: table}}).Limiter
	}
	r, r2 := replica(), replica()
	ctx := context.Background()
	acquire := func(lim *limiter.Limiter, stream string, named map[string]string) {
		t.Helper()
		if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "t", Caller: "a", StreamID: stream, Pools: named}); err != nil || !res.Granted || len(res.Pools) != len(named) {
			t.Fatalf("acquire %s joining %v: %+v, %v", stream, named, res, err)
		}
	}
	release := func(lim *limiter.Limiter, stream string) {
		t.Helper()
		if rel, err := lim.ReleaseAs(ctx, "a", user, stream); err != nil || !rel.Released {
			t.Fatalf("release %s: %+v, %v", stream, rel, err)
		}
	}
	beat := func(stream string) limiter.HeartbeatRequest {
		return limiter.HeartbeatRequest{UserID: user, Plan: "t", StreamID: stream, Caller: "a"}
	}
	joins := map[string]string{"model": model}
	for _, stream := range []string{"released-here", "granted-here", "beaten-here"} {
		acquire(r, stream, joins)
	}
	release(r, "released-here") // then taken again elsewhere
	acquire(r2, "released-here", nil)
	release(r2, "granted-here") // then taken again here
	acquire(r, "granted-here", nil)
	release(r2, "beaten-here") // taken again elsewhere, then beaten here
	acquire(r2, "beaten-here", nil)
	if got, err := r.Heartbeat(ctx, beat("beaten-here")); err != nil || !got.Alive || got.Degraded {
		t.Fatalf("heartbeat of beaten-here before the outage: %+v, %v", got, err)
	}

	testenv.Pause(t, hung)
	for _, stream := range []string{"released-here", "granted-here", "beaten-here"} {
		if got, err := r.Heartbeat(ctx, beat(stream)); err != nil || !got.Alive || !got.Degraded {
			t.Errorf("heartbeat of %s (no pool), its user's shard hung, its plan failing open: %+v, %v; want alive, degraded", stream, got, err)
		}
		got, errs := r.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{beat(stream)})
		if errs[0] != nil || !got[0].Alive || !got[0].Degraded {
			t.Errorf("batch heartbeat of %s, the same: %+v, %v; want alive, degraded", stream, got[0], errs[0])
		}
	}
}
