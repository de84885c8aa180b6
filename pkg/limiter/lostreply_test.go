package limiter_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// lostReplies is a limiter whose Redis runs every call but can be made to
// lose the answers: the connection drops before the reply, and the Redis
// client tries again on a fresh one.
func lostReplies(t *testing.T, timeout time.Duration) (*env, *testenv.Proxy) {
	t.Helper()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: timeout}})
	// Load the scripts: a NOSCRIPT answer would take the drop instead.
	user := newUser(t)
	e.acquire(t, user, "three", "s")
	if _, err := e.lim.Release(context.Background(), user, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.lim.ReleaseAll(context.Background(), user, newAuditID()); err != nil {
		t.Fatal(err)
	}
	return e, proxy
}

// TestReleaseAllWhoseReplyIsLostAnswersWhatItReleased: the retry after a
// lost reply finds the slots gone; it must still answer the ones the call
// released, or the admin answer and its audit record would say none.
func TestReleaseAllWhoseReplyIsLostAnswersWhatItReleased(t *testing.T) {
	t.Parallel()
	e, proxy := lostReplies(t, 2*time.Second)
	ctx := context.Background()
	user := newUser(t)
	e.acquire(t, user, "three", "a")
	e.acquire(t, user, "three", "b")

	proxy.DropReplies(1)
	ids, err := e.lim.ReleaseAll(ctx, user, newAuditID())
	if err != nil || !slices.Equal(ids, []string{"a", "b"}) {
		t.Fatalf("ReleaseAll whose first reply was lost: got %v, %v; want [a b], the slots it released", ids, err)
	}
	if slots, err := e.lim.Slots(ctx, user); err != nil || slots.Used != 0 {
		t.Errorf("slots after ReleaseAll: got %+v, %v; want none", slots, err)
	}
	e.acquire(t, user, "three", "c")
	if ids, err := e.lim.ReleaseAll(ctx, user, newAuditID()); err != nil || !slices.Equal(ids, []string{"c"}) {
		t.Errorf("the next ReleaseAll: got %v, %v; want [c], its own answer", ids, err)
	}
}

// TestReleaseAllWithEveryReplyLostSaysTheOutcomeIsUnknown: when no answer
// comes back, ReleaseAll cannot say what it released, and says so.
func TestReleaseAllWithEveryReplyLostSaysTheOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	e, proxy := lostReplies(t, 300*time.Millisecond)
	ctx := context.Background()
	user := newUser(t)
	e.acquire(t, user, "three", "a")

	proxy.DropReplies(1 << 20)
	ids, err := e.lim.ReleaseAll(ctx, user, newAuditID())
	if !errors.Is(err, limiter.ErrOutcomeUnknown) || !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("ReleaseAll with every reply lost: got %v, %v; want ErrOutcomeUnknown (and ErrUnavailable)", ids, err)
	}
	proxy.DropReplies(0)
	// The client is redialling the connections the proxy dropped; a read
	// may time out until it has one again.
	slots, err := e.lim.Slots(ctx, user)
	for deadline := time.Now().Add(3 * time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		slots, err = e.lim.Slots(ctx, user)
	}
	if err != nil || slots.Used != 0 {
		t.Errorf("slots after: got %+v, %v; want none (it ran, only its answers were lost)", slots, err)
	}
}

// TestReleaseWhoseReplyIsLostIsNeverReportedNotHeld: a retry after a lost
// reply finds the slot gone and would answer released false for a slot the
// first run released. The answer must be true, or degraded (unknown).
func TestReleaseWhoseReplyIsLostIsNeverReportedNotHeld(t *testing.T) {
	t.Parallel()
	e, proxy := lostReplies(t, 2*time.Second)
	ctx := context.Background()
	user := newUser(t)
	e.acquire(t, user, "three", "a")

	proxy.DropReplies(1)
	res, err := e.lim.Release(ctx, user, "a")
	if err != nil || (!res.Released && !res.Degraded) {
		t.Fatalf("Release of a held slot whose reply was lost: got %+v, %v; want released or degraded, never a plain released false", res, err)
	}
	if slots, err := e.lim.Slots(ctx, user); err != nil || slots.Used != 0 {
		t.Errorf("slots after Release: got %+v, %v; want none", slots, err)
	}
}

// lostPooledReplies is lostReplies with the pools model and org, capped
// at models and orgs.
func lostPooledReplies(t *testing.T, models, orgs int) (*env, *testenv.Proxy) {
	t.Helper()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	table := poolTable(t,
		pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(models)},
		pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(orgs)},
	)
	return newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: 2 * time.Second},
		Limiter: limiter.Options{Pools: table}}), proxy
}

// requirePoolMembers fails t unless each of named's pool keys holds want
// members, asking again for up to 3 s while the client redials a
// connection that dropped its replies.
func requirePoolMembers(t *testing.T, e *env, named map[string]string, want int64) {
	t.Helper()
	ctx := context.Background()
	c := e.raw(t)
	for pool, key := range named {
		slots, _ := e.keys.PoolKey(pool, key)
		n, err := c.Do(ctx, c.B().Zcard().Key(slots).Build()).AsInt64()
		for deadline := time.Now().Add(3 * time.Second); err != nil && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			n, err = c.Do(ctx, c.B().Zcard().Key(slots).Build()).AsInt64()
		}
		if err != nil || n != want {
			t.Errorf("%s=%s holds %d members (%v), want %d", pool, key, n, err, want)
		}
	}
}

// TestAPooledAcquireWhoseRepliesAreLostIsAskedAgain: on one Redis a
// pooled acquire's scripts go in one pipeline; when the connection drops
// before their replies, each is asked again, as a call of its own is,
// and the stream is granted once: one slot, one membership of each key.
func TestAPooledAcquireWhoseRepliesAreLostIsAskedAgain(t *testing.T) {
	t.Parallel()
	e, proxy := lostPooledReplies(t, 5, 1)
	ctx := context.Background()
	named := map[string]string{"model": "m", "org": "o"}
	// Load the scripts: a NOSCRIPT answer would take the drop instead.
	user := newUser(t)
	if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: "warm", Pools: named}); err != nil || !res.Granted {
		t.Fatalf("warm-up acquire: %+v, %v", res, err)
	}
	if _, err := e.lim.Release(ctx, user, "warm"); err != nil {
		t.Fatal(err)
	}

	proxy.DropReplies(1)
	res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: "s", Pools: named})
	if err != nil || !res.Granted || res.Degraded || len(res.Pools) != 2 {
		t.Fatalf("acquire whose replies were lost: %+v, %v; want granted by Redis, in both pools", res, err)
	}
	requirePoolMembers(t, e, named, 1)
	if slots, err := e.lim.Slots(ctx, user); err != nil || slots.Used != 1 {
		t.Errorf("the user's slots: %+v, %v; want 1", slots, err)
	}
	// org=o is full: another user's stream is refused by it.
	if got, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: named}); err != nil || got.Granted || got.RefusedBy == nil || got.RefusedBy.Pool != "org" {
		t.Errorf("another user's acquire: %+v, %v; want refused by org=o", got, err)
	}
}

// TestARefusedAcquireWhoseRepliesAreLostLeavesNoMembership: a pooled
// acquire its user's limit refuses, whose replies are lost after the pool
// keys' scripts added the stream: asked again, those scripts answer the
// stream held (an extension). The limiter chose the stream id, so no one
// held it before the call: those memberships are the call's own, and
// are removed with its refusal, not left to hold the keys for a TTL.
func TestARefusedAcquireWhoseRepliesAreLostLeavesNoMembership(t *testing.T) {
	t.Parallel()
	e, proxy := lostPooledReplies(t, 5, 5)
	ctx := context.Background()
	named := map[string]string{"model": "m", "org": "o"}
	user := newUser(t)
	for _, id := range []string{"a", "b", "c"} { // plan three: at its limit
		if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: id}); err != nil || !res.Granted {
			t.Fatalf("acquire %s: %+v, %v", id, res, err)
		}
	}
	proxy.DropReplies(1)
	res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: named})
	if err != nil || res.Granted || res.RefusedBy != nil {
		t.Fatalf("acquire over the limit whose replies were lost: %+v, %v; want refused by the user's limit", res, err)
	}
	requirePoolMembers(t, e, named, 0)
}

// TestAPooledReleaseWhoseLeavesLoseTheirRepliesFreesEveryKey: on one
// Redis a released stream that the limiter did not grant on nobody's
// behalf (so it knows its pool keys from the slot's record only) leaves
// them in one pipeline after the slot; when the connection drops before
// its replies (the leaves ran; each is asked again, alone), the release
// still answers released, and both keys are free at once, not after a
// TTL.
func TestAPooledReleaseWhoseLeavesLoseTheirRepliesFreesEveryKey(t *testing.T) {
	t.Parallel()
	e, proxy := lostPooledReplies(t, 1, 1)
	ctx := context.Background()
	named := map[string]string{"model": "m", "org": "o"}
	user := newUser(t)
	// Twice: the first loads the scripts (a NOSCRIPT answer would take
	// the drop instead); the second's leaves lose their replies.
	for i, drop := range []bool{false, true} {
		if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: "s", Caller: "svc", Pools: named}); err != nil || !res.Granted || len(res.Pools) != 2 {
			t.Fatalf("acquire %d: %+v, %v; want granted in both pools", i+1, res, err)
		}
		if drop {
			proxy.DropRepliesAfter(1, 1) // the user's release answers; the leaves' pipeline does not
		}
		if rel, err := e.lim.Release(ctx, user, "s"); err != nil || !rel.Released || rel.Degraded {
			t.Fatalf("release %d: %+v, %v; want released by Redis", i+1, rel, err)
		}
		if drop && proxy.DropsLeft() != 0 {
			t.Fatal("the leaves' replies were not dropped: the release made fewer script calls than the user's and one pipeline of leaves")
		}
	}
	requirePoolMembers(t, e, named, 0)
	// Both keys hold their cap of 1 free: another user's stream joins them.
	if got, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: named}); err != nil || !got.Granted {
		t.Errorf("another user's acquire after the release: %+v, %v; want granted", got, err)
	}
}

// TestAPooledReleaseBesideItsLeavesWhoseRepliesAreLostFreesEveryKey: a
// stream this limiter granted on nobody's behalf is released with its
// leaves in one pipeline (see Limiter.Release); when the connection
// drops before that pipeline's replies (everything in it ran), the
// release answers released or degraded (unknown), never released false,
// and both keys are free at once, not after a TTL.
func TestAPooledReleaseBesideItsLeavesWhoseRepliesAreLostFreesEveryKey(t *testing.T) {
	t.Parallel()
	e, proxy := lostPooledReplies(t, 1, 1)
	ctx := context.Background()
	named := map[string]string{"model": "m", "org": "o"}
	user := newUser(t)
	for i, drop := range []bool{false, true} { // the first loads the scripts
		if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: "s", Pools: named}); err != nil || !res.Granted || len(res.Pools) != 2 {
			t.Fatalf("acquire %d: %+v, %v; want granted in both pools", i+1, res, err)
		}
		if drop {
			proxy.DropReplies(1)
		}
		if rel, err := e.lim.Release(ctx, user, "s"); err != nil || (!rel.Released && !rel.Degraded) {
			t.Fatalf("release %d: %+v, %v; want released, or degraded when its reply was lost", i+1, rel, err)
		}
		if drop && proxy.DropsLeft() != 0 {
			t.Fatal("the release's replies were not dropped: it made no script call")
		}
	}
	requirePoolMembers(t, e, named, 0)
	if slots, err := e.lim.Slots(ctx, user); err != nil || slots.Used != 0 {
		t.Errorf("the user's slots after the release: %+v, %v; want none", slots, err)
	}
}

// TestAnAcquireWhoseRepliesAreLostThenRefusedLeavesNothing: an acquire
// of a stream id the client chose, whose replies are lost after its
// scripts took the user's slot and a membership (asked again, each finds
// the stream held), and which a full pool then refuses: what its first
// try took is still its own, not another request's share, so its
// refusal leaves the slot and the membership free at once, not held for
// a TTL.
func TestAnAcquireWhoseRepliesAreLostThenRefusedLeavesNothing(t *testing.T) {
	t.Parallel()
	e, proxy := lostPooledReplies(t, 5, 1)
	ctx := context.Background()
	named := map[string]string{"model": "m", "org": "o"}
	// Another user's stream fills org=o (cap 1), and loads the scripts: a
	// NOSCRIPT answer would take the drop instead.
	if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", StreamID: "held", Pools: named}); err != nil || !res.Granted {
		t.Fatalf("the other user's acquire: %+v, %v", res, err)
	}
	user := newUser(t)
	proxy.DropReplies(1)
	res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: "s", Pools: named})
	if err != nil || res.Granted || res.RefusedBy == nil || res.RefusedBy.Pool != "org" {
		t.Fatalf("acquire whose replies were lost: %+v, %v; want refused by org=o", res, err)
	}
	if proxy.DropsLeft() != 0 {
		t.Fatal("the acquire's replies were not dropped")
	}
	if slots, err := e.lim.Slots(ctx, user); err != nil || slots.Used != 0 {
		t.Errorf("the user's slots after the refusal: %+v, %v; want none", slots, err)
	}
	requirePoolMembers(t, e, map[string]string{"model": "m"}, 1) // the other user's
}

// TestAWaitGrantWhoseReplyIsLostThenRefusedLeavesNothing is
// TestAnAcquireWhoseRepliesAreLostThenRefusedLeavesNothing for the wait
// path: an acquire of a client-chosen stream id waits in its user's
// queue; the wait call that grants it a new slot loses its reply and is
// sent again, which finds the stream held: it is the same request's
// grant, not another request's extension. A full pool then refuses the
// stream, and its user's slot goes with it, not held until its TTL.
func TestAWaitGrantWhoseReplyIsLostThenRefusedLeavesNothing(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	table := poolTable(t,
		pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(5)},
		pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(1)},
	)
	e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: 2 * time.Second},
		Tiers:   []tiers.Tier{tiers.Tier{Plan: "w1", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, MaxWait: 10 * time.Second}.WithDefaults()},
		Limiter: limiter.Options{Pools: table}})
	ctx := context.Background()
	named := map[string]string{"model": "m", "org": "o"}
	// Another user fills org=o (and loads the scripts).
	if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "w1", StreamID: "held", Pools: named}); err != nil || !res.Granted {
		t.Fatalf("the other user's acquire: %+v, %v", res, err)
	}
	user := newUser(t)
	e.acquire(t, user, "w1", "x") // the user's limit (1) is reached
	type answer struct {
		res limiter.AcquireResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "w1", StreamID: "s", Pools: named, Wait: 5 * time.Second})
		done <- answer{res, err}
	}()
	// Wait until the ticket is queued.
	c := e.raw(t)
	q := keys.Queue(e.key(t, user))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, _ := c.Do(ctx, c.B().Zcard().Key(q).Build()).AsInt64(); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the acquire never queued")
		}
	}
	// The release's reply passes; the next script call, the wait call
	// that grants "s", loses its reply.
	proxy.DropRepliesAfter(1, 1)
	if _, err := e.lim.Release(ctx, user, "x"); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || a.res.Granted || a.res.RefusedBy == nil || a.res.RefusedBy.Pool != "org" {
		t.Fatalf("acquire: %+v, %v; want refused by org=o", a.res, a.err)
	}
	if proxy.DropsLeft() != 0 {
		t.Fatal("no reply was dropped")
	}
	var slots limiter.UserSlots
	var err error
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if slots, err = e.lim.Slots(ctx, user); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || slots.Used != 0 {
		t.Errorf("the user's slots after the refusal: %+v, %v; want none (the request that took \"s\" gave up)", slots, err)
	}
}

// TestAShadowAcquireWhoseReplyIsLostSaysItWouldRefuse: in a plan in
// shadow mode, an acquire over the limit whose reply is lost is asked
// again; the answer still says it would have been refused, so that the
// shadow refusal is counted (metrics, the proxy's header). So too when
// the limiter chose the stream id, as for the proxy's and ext_proc's
// streams.
func TestAShadowAcquireWhoseReplyIsLostSaysItWouldRefuse(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"s", ""} {
		srv := testenv.StartRedis(t)
		proxy := testenv.StartProxy(t, srv.Addr())
		off := false
		e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: 2 * time.Second},
			Tiers: []tiers.Tier{tiers.Tier{Plan: "shadow1", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, Enforce: &off}.WithDefaults()}})
		ctx := context.Background()
		user := newUser(t)
		e.acquire(t, user, "shadow1", "x") // at the limit (loads the scripts)
		proxy.DropReplies(1)
		res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "shadow1", StreamID: id})
		if err != nil || !res.Granted || proxy.DropsLeft() != 0 {
			t.Fatalf("acquire (stream id %q): %+v, %v (drops left %d)", id, res, err, proxy.DropsLeft())
		}
		if res.WouldRefuse != limiter.CodeStreamLimitReached || res.Used != 2 {
			t.Errorf("a shadow grant over the limit (stream id %q) whose reply was lost: WouldRefuse %q, Used %d; want %q, 2 (as without the lost reply)",
				id, res.WouldRefuse, res.Used, limiter.CodeStreamLimitReached)
		}
	}
}

// TestAShadowPoolJoinWhoseReplyIsLostSaysItWouldRefuse: the same for a
// full key of a pool in shadow mode, the stream id the caller's or the
// limiter's.
func TestAShadowPoolJoinWhoseReplyIsLostSaysItWouldRefuse(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"given", ""} {
		srv := testenv.StartRedis(t)
		proxy := testenv.StartProxy(t, srv.Addr())
		off := false
		table := poolTable(t, pools.Pool{Pool: "provider", Keys: map[string]int{"openai": 1}, Enforce: &off})
		e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: 2 * time.Second},
			Limiter: limiter.Options{Pools: table}})
		ctx := context.Background()
		named := map[string]string{"provider": "openai"}
		if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: named}); err != nil || !res.Granted || res.WouldRefuse != "" {
			t.Fatalf("the first stream: %+v, %v", res, err) // the key at its cap; the scripts loaded
		}
		proxy.DropReplies(1)
		res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", StreamID: id, Pools: named})
		if err != nil || !res.Granted || proxy.DropsLeft() != 0 {
			t.Fatalf("acquire (stream id %q): %+v, %v (drops left %d)", id, res, err, proxy.DropsLeft())
		}
		if res.WouldRefuse != limiter.CodePoolLimitReached || res.WouldRefuseBy == nil || len(res.Pools) != 1 || !res.Pools[0].WouldRefuse || res.Pools[0].Used != 2 {
			t.Errorf("a join of a full shadow pool key (stream id %q) whose reply was lost: WouldRefuse %q by %+v, pools %+v; want %q by provider=openai, 2 of 1 (as without the lost reply)",
				id, res.WouldRefuse, res.WouldRefuseBy, res.Pools, limiter.CodePoolLimitReached)
		}
	}
}

// TestAShadowAcquireBehindAWaiterWhoseReplyIsLostSaysItWouldRefuse: a
// user's slot is owed to a waiting acquire of an enforced plan; an
// acquire of a shadow plan is let in over the limit and says so
// (WouldRefuse), with its reply lost and the script sent again as
// without.
func TestAShadowAcquireBehindAWaiterWhoseReplyIsLostSaysItWouldRefuse(t *testing.T) {
	t.Parallel()
	for _, drop := range []bool{false, true} {
		srv := testenv.StartRedis(t)
		proxy := testenv.StartProxy(t, srv.Addr())
		off := false
		e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: 2 * time.Second},
			Tiers: []tiers.Tier{
				tiers.Tier{Plan: "w1", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, MaxWait: 10 * time.Second}.WithDefaults(),
				tiers.Tier{Plan: "shadow1", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, Enforce: &off}.WithDefaults(),
			}})
		ctx := context.Background()
		user := newUser(t)
		e.acquire(t, user, "shadow1", "warm") // loads the scripts
		if _, err := e.lim.Release(ctx, user, "warm"); err != nil {
			t.Fatal(err)
		}
		c := e.raw(t)
		key := e.key(t, user)
		if got, err := lua.Acquire(ctx, c, key, "x", 1, 10*time.Second, lua.Record{Plan: "w1"}, false); err != nil || !got.Granted {
			t.Fatalf("x: %+v, %v", got, err)
		}
		// A waiter of plan w1 (another replica's ticket), then x goes
		// without waking it: the free slot is owed to it.
		args := lua.WaitArgs{Limit: 1, SlotTTL: 10 * time.Second, TicketTTL: 10 * time.Second, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "q", Record: lua.Record{Plan: "w1", Token: "tokQ"}}}}
		if w, err := lua.Wait(ctx, c, key, args); err != nil || w.Tickets[0].State != lua.TicketQueued {
			t.Fatalf("queue q: %+v, %v", w, err)
		}
		if _, err := lua.Release(ctx, c, "", key, "x"); err != nil {
			t.Fatal(err)
		}
		if drop {
			proxy.DropReplies(1)
		}
		res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "shadow1", StreamID: "s"})
		if err != nil || !res.Granted || proxy.DropsLeft() != 0 {
			t.Fatalf("drop %v: acquire: %+v, %v (drops left %d)", drop, res, err, proxy.DropsLeft())
		}
		if res.WouldRefuse != limiter.CodeStreamLimitReached {
			t.Errorf("reply lost %v: WouldRefuse %q Used %d; want %q (the free slot was owed to the waiter, as the answer without a lost reply says)",
				drop, res.WouldRefuse, res.Used, limiter.CodeStreamLimitReached)
		}
	}
}
