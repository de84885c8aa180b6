package hold_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/joishi/limiter/internal/holdtest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// A stream granted degraded while Redis did not answer joins its pools
// too when it is acquired again once Redis answers: the pool key counts
// it, as it counts every stream granted while Redis answered, and its
// release drops the membership.
func TestDegradedStreamRejoinsItsPoolsOnceRedisAnswers(t *testing.T) {
	e, path, st, _, key := degradedPooled(t, 5)
	time.Sleep(300 * time.Millisecond) // degraded heartbeats meanwhile
	path.Restore()
	deadline := time.Now().Add(5 * time.Second)
	for {
		slots, err := e.Stack.Limiter.PoolSlots(context.Background(), "model", key)
		if err == nil && slots.Used == 1 && !st.Degraded() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s after Redis came back: model=%s %+v (err %v), degraded %v; want the stream's membership counted", key, slots, err, st.Degraded())
		}
		time.Sleep(50 * time.Millisecond)
	}
	st.Release(context.Background(), hold.EndComplete)
	if slots, err := e.Stack.Limiter.PoolSlots(context.Background(), "model", key); err != nil || slots.Used != 0 {
		t.Errorf("after the release: model=%s %+v, %v; want no membership left", key, slots, err)
	}
}

// A degraded stream whose pool key filled while Redis did not answer is
// refused by it when acquired again: the stream is lost, and its loss
// names the pool key; its user keeps no slot.
func TestDegradedStreamRefusedByAFullPoolIsLost(t *testing.T) {
	e, path, st, user, key := degradedPooled(t, 1)
	// Another replica's stream holds the key's one membership meanwhile.
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{testenv.Redis(t)}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slots, _ := e.Stack.Keys.PoolKey("model", key)
	expiry := float64(time.Now().Add(time.Minute).UnixMilli())
	if err := c.Do(context.Background(), c.B().Zadd().Key(slots).ScoreMember().ScoreMember(expiry, "s-other u-other").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	path.Restore()
	select {
	case <-st.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("5s after Redis came back, the degraded stream of a full pool key is not lost")
	}
	if err := st.Err(); !errors.Is(err, limiter.ErrSlotLost) || !strings.Contains(err.Error(), "model="+key) {
		t.Errorf("its loss: %v; want slot lost, naming model=%s", err, key)
	}
	if n := e.Used(t, user); n != 0 {
		t.Errorf("its user holds %d slots after the pool refused it; want 0", n)
	}
}

// degradedPooled starts a Holder whose Redis is reached through a proxy
// that black-holes it, and acquires a stream of a new user that joins
// a new key of pool model (capped at limit) while Redis does not
// answer: a degraded stream. The proxy is black-holed on return.
func degradedPooled(t *testing.T, limit int) (e *env, path *testenv.Proxy, st *hold.Stream, user, key string) {
	t.Helper()
	path = testenv.StartProxy(t, testenv.Redis(t))
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", MaxConcurrentStreams: &limit}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	e = newEnv(t, hold.Options{}, limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 200 * time.Millisecond},
		Limiter: limiter.Options{Pools: table}})
	user, key = newUser(), "m-"+newUser()
	path.BlackHole()
	st, res, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "short", Pools: map[string]string{"model": key}})
	if err != nil || st == nil || !st.Degraded() {
		t.Fatalf("Acquire while Redis is black-holed: %v, %+v, %v; want a degraded stream", st, res, err)
	}
	t.Cleanup(func() { st.Release(context.Background(), hold.EndComplete) })
	return e, path, st, user, key
}

// A degraded stream acquired again once Redis answers takes its slot
// with the TTL of its plan as it is then, and is heartbeated from then on
// at that plan's interval (a third of the TTL or less): a plan whose TTL
// was lowered while the stream ran degraded does not see its slot expire
// between the heartbeats of the old, longer interval.
func TestARejoinedStreamIsHeartbeatedAtItsPlansIntervalNow(t *testing.T) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	before := []tiers.Tier{{Plan: "p", MaxConcurrentStreams: 3, SlotTTL: 3 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen}}
	after := []tiers.Tier{{Plan: "p", MaxConcurrentStreams: 3, SlotTTL: 600 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond, FailureMode: tiers.FailOpen}}
	e := newEnv(t, hold.Options{}, limitertest.Options{Tiers: before, Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 200 * time.Millisecond}})
	user := newUser()
	path.BlackHole()
	st := e.acquire(t, user, "p")
	if !st.Degraded() {
		t.Fatal("Acquire while Redis is black-holed was not degraded")
	}
	defer st.Release(context.Background(), hold.EndComplete)
	if err := e.Stack.Table.Replace(after); err != nil {
		t.Fatal(err)
	}
	path.Restore()
	for deadline := time.Now().Add(5 * time.Second); st.Degraded() || e.Used(t, user) != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("5s after Redis came back: degraded %v, %d slots held, err %v; want the stream acquired again", st.Degraded(), e.Used(t, user), st.Err())
		}
	}
	rejoined := time.Now()
	select {
	case <-st.Lost():
		t.Fatalf("the stream, its slot's TTL now 600ms, was lost %v after it was acquired again, Redis answering all along: %v; want it heartbeated every 200ms",
			time.Since(rejoined).Round(time.Millisecond), st.Err())
	case <-time.After(3 * time.Second):
	}
	if got := e.Used(t, user); got != 1 {
		t.Errorf("3s after the stream was acquired again its user holds %d slots, want 1", got)
	}
}

// slowCalls is a limiter.Observer that, once armed, records how many
// Redis calls were made and the slowest.
type slowCalls struct {
	callCounter
	mu      sync.Mutex
	armed   bool
	calls   int
	slowest time.Duration
}

func (c *slowCalls) RedisCall(_ context.Context, _ string, d time.Duration, _ error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armed {
		c.calls++
		c.slowest = max(c.slowest, d)
	}
}

// Degraded streams acquired again once Redis answers do not hold up the
// heartbeats of the streams held all along (one batch per interval for
// every stream): with every call answered slowly but within its deadline,
// a stream held normally beside 16 degraded ones keeps its slot, and the
// degraded ones are all counted again. Without degraded streams (0) the
// same latency is the control.
func TestRejoinsDoNotHoldUpTheHeartbeats(t *testing.T) {
	for _, k := range []int{0, 16} {
		t.Run(fmt.Sprintf("%d degraded", k), func(t *testing.T) {
			path := testenv.StartProxy(t, testenv.Redis(t))
			ts := []tiers.Tier{{Plan: "p", MaxConcurrentStreams: 100, SlotTTL: 1500 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond, FailureMode: tiers.FailOpen}}
			obs := &slowCalls{callCounter: callCounter{ops: map[string]int{}}}
			stackOpts := limitertest.Options{Tiers: ts, Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 400 * time.Millisecond}}
			stackOpts.Limiter.Observer = obs
			e := &env{Env: holdtest.New(t, holdtest.Options{Stack: stackOpts}), calls: &obs.callCounter}
			held := e.acquire(t, newUser(), "p")
			defer held.Release(context.Background(), hold.EndComplete)
			path.BlackHole()
			degraded := make([]*hold.Stream, k)
			var wg sync.WaitGroup
			for i := range k {
				wg.Go(func() {
					degraded[i], _, _ = e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: newUser(), Plan: "p"})
				})
			}
			wg.Wait()
			for _, s := range degraded {
				if s == nil || !s.Degraded() {
					t.Fatal("a stream acquired while Redis is black-holed is not degraded")
				}
				defer s.Release(context.Background(), hold.EndComplete)
			}
			if k == 0 {
				time.Sleep(400 * time.Millisecond)
			}
			path.Restore()
			path.SetLatency(60 * time.Millisecond) // each call about 120ms, within its 400ms deadline
			time.Sleep(50 * time.Millisecond)
			obs.mu.Lock()
			obs.armed = true
			obs.mu.Unlock()
			start := time.Now()
			select {
			case <-held.Lost():
				obs.mu.Lock()
				defer obs.mu.Unlock()
				t.Fatalf("a stream held normally was lost %v after Redis came back, its holder alive and each of %d calls answered within its deadline (slowest %v): %v",
					time.Since(start).Round(time.Millisecond), obs.calls, obs.slowest.Round(time.Millisecond), held.Err())
			case <-time.After(5 * time.Second):
			}
			for i, s := range degraded {
				if s.Degraded() || s.Err() != nil {
					t.Errorf("degraded stream %d, 5s after Redis came back: degraded %v, err %v; want acquired again", i, s.Degraded(), s.Err())
				}
			}
		})
	}
}

// A degraded stream whose re-acquire takes longer than its heartbeat
// interval (a slow link, within the call's deadline) is acquired again
// once: the batches meanwhile, which find its slot not held yet, leave it
// to the re-acquire on its way.
func TestASlowRejoinIsNotStartedTwice(t *testing.T) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	ts := []tiers.Tier{{Plan: "p", MaxConcurrentStreams: 3, SlotTTL: 1500 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, FailureMode: tiers.FailOpen}}
	e := newEnv(t, hold.Options{}, limitertest.Options{Tiers: ts, Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: time.Second}})
	user := newUser()
	path.BlackHole()
	st := e.acquire(t, user, "p")
	if !st.Degraded() {
		t.Fatal("Acquire while Redis is black-holed was not degraded")
	}
	defer st.Release(context.Background(), hold.EndComplete)
	e.calls.reset()
	path.Restore()
	path.SetLatency(150 * time.Millisecond) // each call about 300ms: three intervals
	for deadline := time.Now().Add(5 * time.Second); st.Degraded(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("5s after Redis came back the stream is still degraded (err %v); want it acquired again", st.Err())
		}
	}
	time.Sleep(700 * time.Millisecond) // the batches in flight as it was granted answer
	if got := e.calls.count("acquire"); got != 1 {
		t.Errorf("acquires of the degraded stream once Redis answered: %d, want 1", got)
	}
	if st.Err() != nil || e.Used(t, user) != 1 {
		t.Errorf("after its re-acquire: err %v, %d slots held; want held, 1 slot", st.Err(), e.Used(t, user))
	}
}

// rejoinWatch records, once armed, the acquires answered, and those of a
// stream id marked released before the answer.
type rejoinWatch struct {
	callCounter
	mu           sync.Mutex
	armed        bool
	answered     int
	released     map[string]bool
	afterRelease int
	log          map[string][]string
}

func (w *rejoinWatch) Acquired(_ context.Context, _ tiers.Tier, res limiter.AcquireResult, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.armed {
		return
	}
	w.answered++
	if w.log == nil {
		w.log = map[string][]string{}
	}
	w.log[res.StreamID] = append(w.log[res.StreamID], fmt.Sprintf("%s granted=%v ext=%v deg=%v err=%v rel=%v", time.Now().Format("05.000"), res.Granted, res.Extended, res.Degraded, err, w.released[res.StreamID]))
	if w.released[res.StreamID] {
		w.afterRelease++
	}
}

func (w *rejoinWatch) count() (answered, after int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.answered, w.afterRelease
}

func degradedMany(t *testing.T, n int, latency time.Duration) (*env, *testenv.Proxy, *rejoinWatch, []*hold.Stream, []string) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	ts := []tiers.Tier{{Plan: "p", MaxConcurrentStreams: 1, SlotTTL: 6 * time.Second, HeartbeatInterval: 2 * time.Second, FailureMode: tiers.FailOpen}}
	obs := &rejoinWatch{callCounter: callCounter{ops: map[string]int{}}, released: map[string]bool{}}
	stackOpts := limitertest.Options{Tiers: ts, Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 700 * time.Millisecond}}
	stackOpts.Limiter.Observer = obs
	e := &env{Env: holdtest.New(t, holdtest.Options{Stack: stackOpts}), calls: &obs.callCounter}
	path.BlackHole()
	streams := make([]*hold.Stream, n)
	users := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		users[i] = newUser()
		wg.Go(func() {
			streams[i], _, _ = e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: users[i], Plan: "p"})
		})
	}
	wg.Wait()
	for _, s := range streams {
		if s == nil || !s.Degraded() {
			t.Fatal("a stream acquired while Redis is black-holed is not degraded")
		}
	}
	obs.mu.Lock()
	obs.armed = true
	obs.mu.Unlock()
	path.Restore()
	path.SetLatency(latency)
	deadline := time.Now().Add(8 * time.Second)
	for {
		if a, _ := obs.count(); a > 0 {
			break
		}
		if time.Now().After(deadline) {
			obs.callCounter.mu.Lock()
			t.Fatalf("no re-acquire answered 8s after Redis came back; calls %v; first stream degraded %v err %v", obs.callCounter.ops, streams[0].Degraded(), streams[0].Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return e, path, obs, streams, users
}

// TestARejoinWaitingForItsTurnSkipsAReleasedStream: 64 degraded streams,
// each its user's one slot, are acquired again once Redis answers (slowly,
// 80ms each way), 16 at a time; all are released by their holders as the
// first re-acquire is answered. Those still waiting for their turn are not
// acquired again: at most the 16 in flight when they were released are
// answered after, and no slot is left in Redis (before, every queued one
// was acquired again, some answered degraded and left their slots for a
// TTL).
func TestARejoinWaitingForItsTurnSkipsAReleasedStream(t *testing.T) {
	const n = 64
	e, path, obs, streams, users := degradedMany(t, n, 80*time.Millisecond)
	obs.mu.Lock()
	for _, s := range streams {
		obs.released[s.ID()] = true
	}
	obs.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Go(func() { s.Release(context.Background(), hold.EndComplete) })
	}
	wg.Wait()
	time.Sleep(3 * time.Second) // past the interval: every queued re-acquire started or given up
	answered, after := obs.count()
	t.Logf("re-acquires answered since Redis came back: %d, of streams already released: %d", answered, after)
	if after > 16 {
		t.Errorf("%d re-acquires of streams their holder had released were answered; at most 16 (in flight at the release) expected", after)
	}
	path.SetLatency(0)
	time.Sleep(500 * time.Millisecond)
	held := 0
	for i, u := range users {
		us, _ := e.Stack.Limiter.Slots(context.Background(), u)
		held += us.Used
		if us.Used > 0 {
			obs.mu.Lock()
			t.Logf("user %s stream %s: slots %+v; acquires %v", u, streams[i].ID(), us.Slots, obs.log[streams[i].ID()])
			obs.mu.Unlock()
		}
	}
	if held != 0 {
		t.Errorf("%d slots held after every stream was released (at %s)", held, time.Now().Format("05.000"))
	}
}

// A degraded stream whose pool is deleted (its LimitPool removed) before
// Redis answers again is counted once it does, as an acquire would be
// then: its user's slot, and no membership of the removed pool, which no
// acquire can name any more. Its user's next stream on a 1-stream plan
// is refused.
func TestADegradedStreamOfADeletedPoolIsCountedOnceRedisAnswers(t *testing.T) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	limit := 5
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", MaxConcurrentStreams: &limit}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, hold.Options{}, limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 200 * time.Millisecond},
		Limiter: limiter.Options{Pools: table}})
	user, key := newUser(), "m-"+newUser()
	path.BlackHole()
	st, res, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "short-one", Pools: map[string]string{"model": key}})
	if err != nil || st == nil || !st.Degraded() {
		t.Fatalf("Acquire while Redis is black-holed: %v, %+v, %v; want a degraded stream", st, res, err)
	}
	defer st.Release(context.Background(), hold.EndComplete)
	if err := table.Replace(nil); err != nil {
		t.Fatal(err)
	}
	path.Restore()
	waitCounted(t, e, st, user)
	st2, res2, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "short-one"})
	if st2 != nil {
		defer st2.Release(context.Background(), hold.EndComplete)
	}
	if err != nil || res2.Granted {
		t.Errorf("a second stream of the user's 1-stream plan: granted %v, degraded %v, err %v; want refused", res2.Granted, res2.Degraded, err)
	}
}

// A degraded stream whose plan is deleted before Redis answers again
// runs on, as every stream held under a deleted plan does until it is
// released (DESIGN §15), and is counted once Redis answers, under the
// plan's last definition, as its heartbeats are kept.
func TestADegradedStreamOfADeletedPlanRunsOnCounted(t *testing.T) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	e := newEnv(t, hold.Options{}, limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 200 * time.Millisecond}})
	user := newUser()
	path.BlackHole()
	st := e.acquire(t, user, "short-one")
	if !st.Degraded() {
		t.Fatal("Acquire while Redis is black-holed was not degraded")
	}
	defer st.Release(context.Background(), hold.EndComplete)
	var kept []tiers.Tier
	for _, tr := range limitertest.Tiers() {
		if tr.Plan != "short-one" {
			kept = append(kept, tr)
		}
	}
	if err := e.Stack.Table.Replace(kept); err != nil {
		t.Fatal(err)
	}
	path.Restore()
	waitCounted(t, e, st, user)
	time.Sleep(time.Second) // 10 heartbeat intervals of plan short-one
	select {
	case <-st.Lost():
		t.Fatalf("the stream of a deleted plan was cut after it was counted: %v", st.Err())
	default:
	}
	if n := e.Used(t, user); n != 1 || st.Degraded() {
		t.Errorf("1s after it was counted: its user holds %d slots, degraded %v; want 1, false", n, st.Degraded())
	}
}

// A stream an authenticated caller acquired while Redis did not answer
// is still that caller's once it is acquired again (DESIGN §19): the
// slot's record names the caller, and another caller's heartbeat is
// refused, as for a stream granted while Redis answered.
func TestARejoinedStreamIsStillItsCallers(t *testing.T) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	e := newEnv(t, hold.Options{}, limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 200 * time.Millisecond}})
	ctx := context.Background()
	user := newUser()
	st := degradedOf(t, e, path, user, "alice")
	path.Restore()
	waitCounted(t, e, st, user)

	us, err := e.Stack.Limiter.Slots(ctx, user)
	if err != nil || len(us.Slots) != 1 || us.Slots[0].Caller != "alice" {
		t.Fatalf("the user's slots once the stream is counted: %+v, %v; want one, of caller alice", us.Slots, err)
	}
	for _, caller := range []string{"mallory", "alicee", "Alice"} {
		if _, err := e.Stack.Limiter.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: st.ID(), Caller: caller}); !errors.Is(err, limiter.ErrNotSlotHolder) {
			t.Errorf("caller %s's heartbeat of alice's stream: %v, want ErrNotSlotHolder", caller, err)
		}
	}
	if _, err := e.Stack.Limiter.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: st.ID(), Caller: "alice"}); err != nil {
		t.Errorf("alice's heartbeat of her stream: %v, want it kept alive", err)
	}
}

// A degraded stream whose id another caller takes while Redis does not
// count the stream is that caller's slot once Redis answers: the
// stream's heartbeat (under its caller) and its re-acquire are refused
// not_slot_holder, and every later one would be. The stream is cut as
// lost, not counted by keeping the other caller's slot alive, nor left to
// run on uncounted past the outage, retried at every batch.
func TestARejoinOfAnIdAnotherCallerTookCutsTheStream(t *testing.T) {
	redis := testenv.Redis(t)
	path := testenv.StartProxy(t, redis)
	e := newEnv(t, hold.Options{}, limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 200 * time.Millisecond}})
	direct := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{redis}}, Limiter: limiter.Options{Keys: e.Stack.Keys}}).Limiter
	ctx := context.Background()
	user := newUser()
	st := degradedOf(t, e, path, user, "alice")
	if got, err := direct.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "short", StreamID: st.ID(), Caller: "mallory"}); err != nil || !got.Granted {
		t.Fatalf("mallory's acquire of the degraded stream's id: %+v, %v", got, err)
	}
	path.Restore()
	select {
	case <-st.Lost():
		if err := st.Err(); !errors.Is(err, limiter.ErrNotSlotHolder) {
			t.Errorf("the stream was cut with %v; want not_slot_holder: its id is another caller's", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("5s after Redis came back, the stream whose id mallory holds runs on (degraded %v)", st.Degraded())
	}
	us, err := direct.Slots(ctx, user)
	if err != nil || len(us.Slots) != 1 || us.Slots[0].Caller != "mallory" {
		t.Errorf("the user's slots: %+v, %v; want mallory's alone, untouched", us.Slots, err)
	}
}

// degradedOf black-holes path, Redis's to e, and acquires a stream of
// user in plan short for caller while it is: granted degraded, released
// when the test ends.
func degradedOf(t *testing.T, e *env, path *testenv.Proxy, user, caller string) *hold.Stream {
	t.Helper()
	path.BlackHole()
	st, res, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "short", Caller: caller})
	if err != nil || st == nil || !st.Degraded() {
		t.Fatalf("Acquire while Redis is black-holed: %v, %+v, %v; want a degraded stream", st, res, err)
	}
	t.Cleanup(func() { st.Release(context.Background(), hold.EndComplete) })
	return st
}

// waitCounted waits up to 5s for the degraded stream st of user to be
// counted again (not degraded, its user holding one slot); it fails the
// test if the stream is lost meanwhile, or is not counted by then.
func waitCounted(t *testing.T, e *env, st *hold.Stream, user string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		select {
		case <-st.Lost():
			t.Fatalf("the degraded stream was cut once Redis answered: %v", st.Err())
		default:
		}
		if !st.Degraded() && e.Used(t, user) == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s after Redis came back: degraded %v, its user holds %d slots; want it counted: false, 1", st.Degraded(), e.Used(t, user))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
