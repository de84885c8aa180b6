package limiter_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
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

// answerWakes stands for another replica whose wait script finds w owed
// the free place its own ticket other is owed (two releases' orders
// during a rolling update): each wake-up of key's channel naming other is
// answered with one naming w, until the test ends. It returns how many it
// answered.
func answerWakes(t *testing.T, c rueidis.Client, key, other, w string) *atomic.Int64 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	answered := new(atomic.Int64)
	woken := make(chan struct{}, 1)
	subscribed := rueidis.WithOnSubscriptionHook(ctx, func(sub rueidis.PubSubSubscription) {
		if sub.Kind == "ssubscribe" {
			select {
			case woken <- struct{}{}:
			default:
			}
		}
	})
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		_ = c.Receive(subscribed, c.B().Ssubscribe().Channel(keys.WakeChannel(key)).Build(), func(m rueidis.PubSubMessage) {
			if slices.Contains(strings.Split(m.Message, "\n"), other) {
				answered.Add(1)
				// Not from the callback: it must not block on a command.
				go c.Do(ctx, c.B().Spublish().Channel(keys.WakeChannel(key)).Message(w).Build())
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("the other replica's subscription not confirmed within 5s")
	}
	return answered
}

// TestAWakeUpForATicketNotOwedCallsAtMostOnceAPoll: a waiter on a pool
// key of cap 1, behind another replica's ticket owed the free place,
// which that replica's script, serving another order, finds the waiter's
// and wakes. The waiter's call finds its ticket not owed and wakes the
// other's; each such wake-up is answered by one for the waiter. The loop
// calls at most once a poll (100ms) for those wake-ups, not as fast as
// Redis answers; and once the other ticket leaves, the wake-up its call
// publishes has the waiter granted within a poll or so. (The embedded
// store runs one replica: no other can wake its waiters.)
func TestAWakeUpForATicketNotOwedCallsAtMostOnceAPoll(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			const poll = 100 * time.Millisecond
			log := newCallLog()
			s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second}, Tiers: poolWaitTiers(),
				Limiter: limiter.Options{WaitPoll: poll, TicketTTL: 30 * time.Second, Observer: log, Pools: poolTable(t,
					pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2), Keys: map[string]int{"gpt-4o": 1}, MaxWait: 10 * time.Second})}})
			ctx := context.Background()
			c, err := s.Redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			key, err := s.Keys.PoolKey("model", "gpt-4o")
			if err != nil {
				t.Fatal(err)
			}
			holder := newUser(t)
			mustAcquire(t, s.Limiter, holder, "low", "gpt-4o")
			held, err := s.Limiter.Slots(ctx, holder)
			if err != nil || len(held.Slots) != 1 {
				t.Fatalf("%s's slots: %+v, %v", holder, held, err)
			}

			// The other replica's ticket, of a higher priority: owed first.
			other := "other " + newUser(t)
			_, otherUser, _ := strings.Cut(other, " ")
			otherTicket := lua.WaitArgs{Limit: 1, SlotTTL: 10 * time.Second, TicketTTL: 30 * time.Second, MaxQueue: 100,
				Tickets: []lua.TicketArgs{{StreamID: other, Record: lua.Record{User: otherUser, Priority: 9}}}}
			if got, err := lua.Wait(ctx, c, key, otherTicket); err != nil || got.Tickets[0].State != lua.TicketQueued {
				t.Fatalf("the other replica's ticket: %+v, %v", got, err)
			}
			user := newUser(t)
			q := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "w1", Pools: map[string]string{"model": "gpt-4o"}}, 10*time.Second)
			w := "w1 " + user
			freeByHand(t, s, key, held.Slots[0].StreamID+" "+holder)

			answered := answerWakes(t, c, key, other, w)
			log.take()
			if err := c.Do(ctx, c.B().Spublish().Channel(keys.WakeChannel(key)).Message(w).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
			calls, answers := log.take()["wait"], answered.Load()
			if answers < 2 {
				t.Fatalf("in a second the waiter's calls woke the other ticket %d times; want at least 2 (the wake-ups go round)", answers)
			}
			if most := int(time.Second/(poll*4/5)) + 2; calls > most {
				t.Errorf("in a second of wake-ups for a ticket not owed, %d calls to the wait script (%d wake-ups answered); want at most %d, one a poll", calls, answers, most)
			}
			if a, ok := q.answer(0); ok {
				t.Fatalf("the waiter was answered while the other ticket was owed the place: %+v, %v", a.res, a.err)
			}

			// The other ticket leaves; its call wakes the waiter.
			otherTicket.Tickets[0].Leave = true
			got, err := lua.Wait(ctx, c, key, otherTicket)
			if err != nil || !slices.Equal(got.Wake, []string{w}) {
				t.Fatalf("the other ticket leaves: %+v, %v; want it to wake %q", got, err, w)
			}
			if err := c.Do(ctx, c.B().Spublish().Channel(keys.WakeChannel(key)).Message(w).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			a, ok := q.answer(time.Second)
			if !ok || a.err != nil || !a.res.Granted {
				t.Fatalf("the waiter after the other ticket left and woke it: %+v, %v (answered %v); want granted within a second", a.res, a.err, ok)
			}
		})
	}
}
