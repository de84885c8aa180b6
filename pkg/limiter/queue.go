package limiter

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// queueKey names one loop: a user's waiting acquires on this server under
// one plan (the plan gives the limit and the failure mode).
type queueKey struct{ key, plan string }

// queues are the loops of a Limiter. A loop runs while it has waiters;
// the last to leave ends it, so no goroutine outlives the acquires it
// serves.
type queues struct {
	mu sync.Mutex
	m  map[queueKey]*userQueue
}

// userQueue is the loop of one user's waiters on this server under one
// plan: it makes every call to the wait script for them.
type userQueue struct {
	l      *Limiter
	key    string // the user key
	userID string
	plan   string
	poke   chan struct{} // something changed: look now

	mu       sync.Mutex
	incoming []*waiter // joined since the loop last looked
	woken    []string  // stream ids wake-ups named since then
	wokenAll bool      // a wake-up named no one: every waiter looks

	// The loop's own.
	waiters []*waiter      // in the order they came
	places  map[string]int // the latest place of each stream id in the queue
}

// join adds w to the loop of key and plan, starting it if none runs. stop
// releases what join set up to watch w, once w is answered.
func (l *Limiter) join(key, userID, plan string, w *waiter) (stop func()) {
	k := queueKey{key, plan}
	l.queues.mu.Lock()
	q := l.queues.m[k]
	if q == nil {
		q = &userQueue{l: l, key: key, userID: userID, plan: plan, poke: make(chan struct{}, 1), places: map[string]int{}}
		l.queues.m[k] = q
		go q.run()
	}
	q.mu.Lock()
	q.incoming = append(q.incoming, w)
	q.mu.Unlock()
	l.queues.mu.Unlock()
	q.nudge()
	// The loop looks again when the caller leaves or the wait runs out.
	stopCtx := context.AfterFunc(w.ctx, q.nudge)
	timer := time.AfterFunc(time.Until(w.deadline), q.nudge)
	return func() {
		stopCtx()
		timer.Stop()
	}
}

func (q *userQueue) nudge() {
	select {
	case q.poke <- struct{}{}:
	default:
	}
}

// woke takes a wake-up of the user's channel: ids are the stream ids it
// names, "" for any.
func (q *userQueue) woke(ids string) {
	q.mu.Lock()
	if ids == "" {
		q.wokenAll = true
	} else {
		q.woken = append(q.woken, strings.Fields(ids)...)
	}
	q.mu.Unlock()
	q.nudge()
}

// run is the loop: a call to the wait script whenever something may have
// changed, until no waiter is left.
func (q *userQueue) run() {
	stop := q.l.bus.subscribe(keys.WakeChannel(q.key), q.woke)
	defer stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if !q.take() {
			return
		}
		next := q.round()
		if len(q.waiters) == 0 {
			continue
		}
		timer.Reset(time.Until(next))
		q.sleep(timer)
	}
}

// take moves the waiters that joined into the loop's; false when there
// are none at all, and the loop is removed (a waiter joining after that
// starts a new one).
func (q *userQueue) take() bool {
	q.mu.Lock()
	q.waiters = append(q.waiters, q.incoming...)
	q.incoming = nil
	q.mu.Unlock()
	if len(q.waiters) > 0 {
		return true
	}
	qs := &q.l.queues
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.incoming) > 0 {
		q.waiters, q.incoming = q.incoming, nil
		return true
	}
	delete(qs.m, queueKey{q.key, q.plan})
	return false
}

// sleep waits for timer, or for a change worth a call before it: a new
// waiter, one that leaves, a wake-up for one of the loop's tickets.
func (q *userQueue) sleep(timer *time.Timer) {
	for {
		select {
		case <-timer.C:
			return
		case <-q.poke:
		}
		if q.due(time.Now()) {
			timer.Stop()
			return
		}
	}
}

// due reports whether a call should be made now: a waiter joined or is to
// leave, or a wake-up named one of the loop's tickets (or no one).
func (q *userQueue) due(now time.Time) bool {
	q.mu.Lock()
	woken, all, joined := q.woken, q.wokenAll, len(q.incoming) > 0
	q.woken, q.wokenAll = nil, false
	q.mu.Unlock()
	if joined || all {
		return true
	}
	for _, w := range q.waiters {
		if _, leaving := w.gone(now); leaving {
			return true
		}
	}
	for _, id := range woken {
		if _, ok := q.places[id]; ok {
			return true
		}
	}
	return false
}

// round makes one call to the wait script for every waiter of the loop
// and answers those it decides; it returns when the next call is due if
// nothing happens meanwhile.
func (q *userQueue) round() time.Time {
	l := q.l
	now := time.Now()
	tier, ok := l.tiers.Lookup(q.plan)
	if !ok {
		q.fail(tiers.Tier{Plan: q.plan}, errPlanGone(q.plan), now)
		return now
	}

	// One ticket per stream id: it waits on while one of its waiters does.
	// Whether a waiter leaves is decided once, here: a caller that leaves
	// during the call is withdrawn at the next.
	args := lua.WaitArgs{Limit: tier.MaxConcurrentStreams, SlotTTL: tier.SlotTTL, TicketTTL: l.ticketTTL, MaxQueue: l.maxQueue}
	index := map[string]int{} // stream id → its ticket in args
	leaves := make([]WaitOutcome, len(q.waiters))
	for j, w := range q.waiters {
		outcome, leaving := w.gone(now)
		leaves[j] = outcome
		i, seen := index[w.streamID]
		if !seen {
			index[w.streamID] = len(args.Tickets)
			args.Tickets = append(args.Tickets, lua.TicketArgs{StreamID: w.streamID, Leave: leaving, Record: w.record})
		} else if !leaving {
			args.Tickets[i].Leave = false
		}
	}

	var got lua.Waited
	var replicas *replicaSync
	ctx := context.Background()
	err := l.do(ctx, "wait", func(ctx context.Context, c rueidis.Client) (err error) {
		c, replicas = l.synced(c)
		got, err = lua.Wait(ctx, c, q.key, args)
		return err
	})
	if err != nil {
		q.fail(tier, err, now)
		return now.Add(q.pollEvery(false))
	}
	if got.Pruned > 0 {
		l.observer.Reclaimed(ctx, tier.Plan, got.Pruned)
	}
	if len(got.Wake) > 0 {
		l.wake(ctx, q.key, got.Wake...)
	}

	headZone := false
	kept := q.waiters[:0]
	clear(q.places)
	for j, w := range q.waiters {
		t := got.Tickets[index[w.streamID]]
		outcome, leaving := leaves[j], leaves[j] != ""
		switch {
		case t.State == lua.TicketGranted:
			w.answer(waitResult{outcome: WaitGranted, expiresAtMs: t.ExpiresAtMs, replicas: replicas, used: got.Used})
		case leaving:
			w.answer(waitResult{outcome: outcome, used: got.Used, retry: got.RetryAfter})
		case t.State == lua.TicketFull:
			w.answer(waitResult{outcome: WaitFull, used: got.Used, retry: got.RetryAfter})
		default:
			// Queued; or, withdrawn while another waiter of its stream id
			// left, queued again at the next call.
			kept = append(kept, w)
			q.places[w.streamID] = t.Place
			headZone = headZone || (t.State == lua.TicketQueued && t.Place <= tier.MaxConcurrentStreams)
		}
	}
	clear(q.waiters[len(kept):])
	q.waiters = kept

	wait := q.pollEvery(headZone)
	if got.Next >= 0 {
		wait = min(wait, got.Next)
	}
	next := now.Add(wait)
	for _, w := range q.waiters {
		if w.deadline.Before(next) {
			next = w.deadline
		}
	}
	return next
}

// pollEvery is how long until the loop calls the script again unasked:
// soon, jittered, when a ticket could be served next (a wake-up may have
// been lost), else in time to refresh the tickets.
func (q *userQueue) pollEvery(headZone bool) time.Duration {
	if !headZone {
		return q.l.ticketTTL / 3
	}
	p := q.l.waitPoll
	return p*4/5 + rand.N(p*2/5+1)
}

// fail answers the waiters of a call that failed with err: the tier's
// failure mode decides for an outage, as for any acquire; a caller that
// left is answered as cancelled. The tickets not withdrawn expire.
func (q *userQueue) fail(tier tiers.Tier, err error, now time.Time) {
	open := degrade(tier.FailureMode, err)
	if open {
		q.l.warnDegraded(context.Background(), "redis unavailable; granting waiting acquires degraded (failureMode Open)", "plan", tier.Plan, "err", err)
	}
	for _, w := range q.waiters {
		switch outcome, _ := w.gone(now); {
		case outcome == WaitCancelled:
			w.answer(waitResult{outcome: WaitCancelled})
		case open:
			w.answer(waitResult{outcome: WaitGranted, degraded: true})
		default:
			w.answer(waitResult{outcome: WaitFailed, err: err})
		}
	}
	clear(q.waiters)
	q.waiters = q.waiters[:0]
	clear(q.places)
}
