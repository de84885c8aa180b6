package limiter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
)

// callLog counts the limiter's Redis calls by op; the rest of Observer is
// reclaimLog's.
type callLog struct {
	*reclaimLog
	mu  sync.Mutex
	ops map[string]int
}

func newCallLog() *callLog {
	return &callLog{reclaimLog: &reclaimLog{plans: map[string]int{}}, ops: map[string]int{}}
}

func (c *callLog) RedisCall(_ context.Context, op string, _ time.Duration, _ error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[op]++
}

// count is op's count since the last take.
func (c *callLog) count(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops[op]
}

// take returns the counts since the last take.
func (c *callLog) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	got := c.ops
	c.ops = map[string]int{}
	return got
}

// pollStack is one limiter that polls every 20ms and refreshes its
// tickets only every 10s (a TicketTTL of 30s), so that in a second of
// waiting every call is a poll's; pools as waitPoolReplicas's.
func pollStack(t *testing.T, b limitertest.Backend) (*limitertest.Stack, *callLog) {
	t.Helper()
	log := newCallLog()
	table := poolTable(t,
		pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2), Keys: map[string]int{"gpt-4o": 1}, MaxWait: 10 * time.Second},
	)
	s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second}, Tiers: poolWaitTiers(),
		Limiter: limiter.Options{WaitPoll: 20 * time.Millisecond, TicketTTL: 30 * time.Second, Observer: log, Pools: table}})
	return s, log
}

// freeByHand removes member of the slots key (and its record) as no
// release does: nothing publishes a wake-up, as when a release's was
// lost.
func freeByHand(t *testing.T, s *limitertest.Stack, key, member string) {
	t.Helper()
	c, err := s.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range c.DoMulti(context.Background(),
		c.B().Zrem().Key(key).Member(member).Build(),
		c.B().Hdel().Key(keys.SlotRecords(key)).Field(member).Build()) {
		if err.Error() != nil {
			t.Fatal(err.Error())
		}
	}
}

// waitPolls lets a second pass while q waits with no slot free and
// checks that the loop polled (wait_poll) but called the wait script at
// most twice: once when its wake-up subscription is confirmed (a
// wake-up may have been missed before it), which on a loaded machine
// may come after the first poll, and once if its ticket's refresh falls
// due. A poll that ran the script would call it some 50 times.
func waitPolls(t *testing.T, log *callLog, q *queued) {
	t.Helper()
	// Count from the loop's first look: the call that queued q is seen in
	// Redis (startQueued) before its answer reaches the observer, and on a
	// loaded machine it may be logged only after a take here.
	for deadline := time.Now().Add(5 * time.Second); log.count("wait_poll") == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiting loop made no look within 5s")
		}
	}
	log.take()
	if a, ok := q.answer(time.Second); ok {
		t.Fatalf("answered while every slot was held: %+v, %v", a.res, a.err)
	}
	got := log.take()
	if got["wait_poll"] < 10 || got["wait"] > 2 {
		t.Errorf("a second of polls with no slot free made %d looks and %d script calls; want at least 10 looks (every 20ms) and at most 2 calls", got["wait_poll"], got["wait"])
	}
}

// served checks that q is granted within a second, by a poll: no wake-up
// was published, and no refresh is due for 10s.
func served(t *testing.T, q *queued, what string) {
	t.Helper()
	a, ok := q.answer(time.Second)
	if !ok {
		t.Fatalf("%s: not granted within a second of its polls", what)
	}
	if a.err != nil || !a.res.Granted || a.res.Degraded {
		t.Fatalf("%s: %+v, %v; want granted", what, a.res, a.err)
	}
}

// TestAPollThatFindsNoFreeSlotRunsNoScript: a waiter that could be served
// next looks for a free slot every WaitPoll with two reads, and calls the
// wait script only once one is free: a slot freed with no wake-up, as
// when a release's is lost, or an override that raises the limit. For a
// user's queue and a pool key's, at its cap and at one less.
func TestAPollThatFindsNoFreeSlotRunsNoScript(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		s, log := pollStack(t, b)
		ctx := context.Background()

		t.Run("user", func(t *testing.T) {
			user := newUser(t)
			key, err := s.Keys.UserKey(user)
			if err != nil {
				t.Fatal(err)
			}
			for _, stream := range []string{"a", "b", "c"} { // low's limit, 3
				mustAcquireUser(t, s.Limiter, user, "low", stream)
			}
			q := queueUser(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "waiter"}, key)
			waitPolls(t, log, q)
			freeByHand(t, s, key, "b")
			served(t, q, "the user's waiter once a slot was freed with no wake-up")

			// At the limit again (a, c, waiter): an override to 4 lets the
			// next waiter in, with no wake-up either.
			q = queueUser(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "second"}, key)
			waitPolls(t, log, q)
			c, err := s.Redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := lua.SetOverride(ctx, c, key, 4, time.Minute, "test", "a raise that publishes nothing"); err != nil {
				t.Fatal(err)
			}
			served(t, q, "the user's waiter once an override raised the limit")
		})

		t.Run("pool key", func(t *testing.T) {
			key, err := s.Keys.PoolKey("model", "claude") // capped at 2
			if err != nil {
				t.Fatal(err)
			}
			holders := []string{newUser(t), newUser(t)}
			for _, u := range holders {
				mustAcquire(t, s.Limiter, u, "low", "claude")
			}
			slots, err := s.Limiter.Slots(ctx, holders[0])
			if err != nil || len(slots.Slots) != 1 {
				t.Fatalf("%s's slots: %+v, %v", holders[0], slots, err)
			}
			q := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "claude"}}, 10*time.Second)
			waitPolls(t, log, q)
			freeByHand(t, s, key, slots.Slots[0].StreamID+" "+holders[0])
			served(t, q, "the pool key's waiter once a member was freed with no wake-up")
		})
	})
}

func mustAcquireUser(t *testing.T, lim *limiter.Limiter, user, plan, stream string) {
	t.Helper()
	res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: plan, StreamID: stream})
	if err != nil || !res.Granted || res.Degraded {
		t.Fatalf("%s's acquire of %s: %+v, %v; want granted", user, stream, res, err)
	}
}

// queueUser starts req on lim, waiting up to 10s, and returns once its
// ticket is in the user's queue (key, on s's Redis).
func queueUser(t *testing.T, ctx context.Context, s *limitertest.Stack, lim *limiter.Limiter, req limiter.AcquireRequest, key string) *queued {
	t.Helper()
	return startQueued(t, ctx, lim, req, 10*time.Second, func() int64 { return zcard(t, s, keys.Queue(key)) })
}

// TestATicketThatOnlyPollsIsStillRefreshed: the head's loop, whose looks
// find no slot free, still refreshes its ticket when the refresh is due:
// over five ticket TTLs of polling it keeps its place ahead of a ticket
// another replica refreshes, and is served first when the slot frees.
// (A TTL of 600ms: a refresh every 200ms, and 400ms of margin for a
// loaded machine.)
func TestATicketThatOnlyPollsIsStillRefreshed(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			prefix := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
			var stacks []*limitertest.Stack
			var addrs []string
			for range 2 {
				s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Addrs: addrs, Timeout: 5 * time.Second}, Tiers: poolWaitTiers(),
					Limiter: limiter.Options{Keys: prefix, WaitPoll: 20 * time.Millisecond, TicketTTL: 600 * time.Millisecond}})
				addrs = s.Redis.Addrs()
				stacks = append(stacks, s)
			}
			ctx := context.Background()
			user := newUser(t)
			key, err := prefix.UserKey(user)
			if err != nil {
				t.Fatal(err)
			}
			for _, stream := range []string{"a", "b", "c"} {
				mustAcquireUser(t, stacks[0].Limiter, user, "low", stream)
			}
			head := queueUser(t, ctx, stacks[0], stacks[0].Limiter, limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "head"}, key)
			second := queueUser(t, ctx, stacks[0], stacks[1].Limiter, limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "second"}, key)
			time.Sleep(3 * time.Second)
			listing, err := stacks[0].Limiter.Slots(ctx, user)
			if err != nil {
				t.Fatal(err)
			}
			if len(listing.Queue) != 2 || listing.Queue[0].StreamID != "head" {
				t.Fatalf("queue after five ticket TTLs of polling: %+v; want the head's ticket first, then the second's", listing.Queue)
			}
			if _, err := stacks[0].Limiter.Release(ctx, user, "b"); err != nil {
				t.Fatal(err)
			}
			served(t, head, "the head after five ticket TTLs")
			if a, ok := second.answer(200 * time.Millisecond); ok {
				t.Fatalf("the second waiter answered while every slot was held: %+v, %v", a.res, a.err)
			}
		})
	}
}
