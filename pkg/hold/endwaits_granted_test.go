package hold_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// TestEndWaitsAfterAWaitWasGrantedEndsNoJoinWithRoom: EndWaits ends only
// an acquire that waits (docs/api.md "Shutdown": "one that finds a slot
// free is granted as before";
// Holder.EndWaits: "only one that, denied, would wait is ended"). A pooled
// acquire whose wait in its user's queue is over (the queue granted it
// the user's slot) and whose pool key has room is no longer waiting: it
// is joining a pool with room, and should be granted. Here EndWaits comes
// while that join (one Redis round trip, slowed to 300ms) is on its way.
func TestEndWaitsAfterAWaitWasGrantedEndsNoJoinWithRoom(t *testing.T) {
	t.Parallel()
	five := 5
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", MaxConcurrentStreams: &five, MaxWait: 10 * time.Second}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	path := testenv.StartProxy(t, testenv.Redis(t))
	e := newEnv(t, hold.Options{Wait: 10 * time.Second}, limitertest.Options{Tiers: waitTiers,
		Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 3 * time.Second}, Limiter: limiter.Options{Pools: table}})
	direct, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{testenv.Redis(t)}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	user, key := newUser(), "m-"+newUser()
	pool := map[string]string{"model": key}
	first, _, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "queued", Pools: pool})
	if err != nil || first == nil {
		t.Fatalf("first acquire: %v %v", first, err)
	}
	const second = "s-after-the-wait"
	done := make(chan acquired, 1)
	go func() {
		st, res, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "queued", StreamID: second, Pools: pool})
		done <- acquired{st, res, err}
	}()
	e.AwaitQueue(t, user, 1, 5*time.Second)
	userKey, err := e.Stack.Keys.UserKey(user)
	if err != nil {
		t.Fatal(err)
	}
	path.SetLatency(300 * time.Millisecond)
	go first.Release(context.Background(), hold.EndComplete)
	// Once Redis holds the second stream's slot AND its membership of
	// model=key, its wait is long over (the queue granted the slot, and
	// the acquire went on to join the pool key, which had room and
	// granted it): only the join's reply is on its way back.
	poolSlots, _ := e.Stack.Keys.PoolKey("model", key)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := direct.Do(context.Background(), direct.B().Zscore().Key(userKey).Member(second).Build()).Error()
		if err == nil {
			err = direct.Do(context.Background(), direct.B().Zscore().Key(poolSlots).Member(second+" "+user).Build()).Error()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second stream was never granted its user's slot: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.Holder.EndWaits()
	var a acquired
	select {
	case a = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the second acquire did not answer")
	}
	if a.err != nil || a.st == nil {
		t.Errorf("the acquire whose wait was over (its user's slot granted, its pool key with room) when EndWaits came: %v, %+v, %v; want granted", a.st, a.res, a.err)
	}
	if a.st != nil {
		a.st.Release(context.Background(), hold.EndComplete)
	}
	path.SetLatency(0)
	time.Sleep(500 * time.Millisecond)
	if n := e.Used(t, user); n != 0 {
		t.Logf("user slots left after: %d", n)
	}
}
