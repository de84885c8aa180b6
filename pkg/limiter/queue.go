package limiter

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/keys"
)

// queueKey names one loop: the acquires waiting on this server for one
// scope's slots (a user's, or a pool key's: key) under one plan (the plan
// gives the slots' TTL, and a user's limit and failure mode).
type queueKey struct{ key, plan string }

// queueScope is the capped scope a loop's waiters wait for: a user's
// slots or a pool key's, the one mechanism of DESIGN §16. Only what
// limits them differs: the plan, or the pool.
type queueScope struct {
	key    string // the scope's slots: keys.Schema.UserKey or PoolKey
	userID string // whose acquires wait: the user of a user's queue
	// pool and poolKey name a pool key's queue; pool is "" for a user's.
	pool, poolKey string
}

// queues are the loops of a Limiter. A loop runs while it has waiters;
// the last to leave ends it, so no goroutine outlives the acquires it
// serves.
type queues struct {
	mu sync.Mutex
	m  map[queueKey]*scopeQueue
}

// scopeQueue is the loop of one scope's waiters on this server under one
// plan: it makes every call to the wait script for them.
type scopeQueue struct {
	l *Limiter
	queueScope
	plan string
	poke chan struct{} // something changed: look now

	mu       sync.Mutex
	incoming []*waiter // joined since the loop last looked
	woken    []string  // stream ids wake-ups named since then
	wokenAll bool      // a wake-up named no one: every waiter looks

	// The loop's own.
	waiters   []*waiter            // in the order they came
	places    map[string]int       // each stream id's latest place in the queue; 0: none yet
	refreshed map[string]time.Time // when each stream id's ticket was last refreshed
	named     map[string]bool      // stream ids wake-ups named, for the next call
	lastTTL   time.Duration        // of a pool key's: the slot TTL its latest call granted places with
	owedCall  map[string]bool      // stream ids a call needed and left out (see round), for the next
	// calledLimit is the scope's limit as the latest call was sent with it:
	// when bounds finds another, every ticket goes (see round).
	calledLimit int
	namedAll    bool      // a wake-up named no one: every ticket goes
	expiresAt   time.Time // when a slot or ticket may expire next, as last read
	override    int       // the scope's override as last read; -1: none
	limit       int       // the scope's limit as the latest round found it
	// shadowLimit, of a scope in shadow mode (limit unbounded), is the
	// limit it would enforce, by which the script judges its grants (see
	// lua.WaitArgs.Shadow); -1 otherwise.
	shadowLimit int

	// heldOff: stream ids whose latest call, made for a wake-up naming
	// them, found them still queued, and until when a wake-up for one
	// waits for the loop's next call rather than making one (see due).
	heldOff map[string]time.Time
}

// join adds w to the loop of scope and plan, starting it if none runs.
// stop releases what join set up to watch w, once w is answered.
func (l *Limiter) join(scope queueScope, plan string, w *waiter) (stop func()) {
	k := queueKey{scope.key, plan}
	l.queues.mu.Lock()
	q := l.queues.m[k]
	if q == nil {
		q = &scopeQueue{l: l, queueScope: scope, plan: plan, poke: make(chan struct{}, 1),
			places: map[string]int{}, refreshed: map[string]time.Time{}, named: map[string]bool{}, owedCall: map[string]bool{}, heldOff: map[string]time.Time{}, override: -1}
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

func (q *scopeQueue) nudge() {
	select {
	case q.poke <- struct{}{}:
	default:
	}
}

// woke takes a wake-up of the scope's channel: ids are the ticket ids it
// names, one a line (see wake), "" for any.
func (q *scopeQueue) woke(ids string) {
	q.mu.Lock()
	if ids == "" {
		q.wokenAll = true
	} else {
		q.woken = append(q.woken, strings.Split(ids, "\n")...)
	}
	q.mu.Unlock()
	q.nudge()
}

// run is the loop: a call to the wait script whenever something may have
// changed, until no waiter is left.
func (q *scopeQueue) run() {
	stop := q.l.bus.subscribe(keys.WakeChannel(q.key), q.woke)
	defer stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if !q.take() {
			return
		}
		// Taken before the round reads its bounds (see tiers.Catalog.Changed).
		tiersChanged, poolsChanged := q.l.tiers.Changed(), q.l.pools.Changed()
		next := q.round()
		if len(q.waiters) == 0 {
			continue
		}
		timer.Reset(time.Until(next))
		q.sleep(timer, next, tiersChanged, poolsChanged)
	}
}

// take moves the waiters that joined into the loop's; false when there
// are none at all, and the loop is removed (a waiter joining after that
// starts a new one).
func (q *scopeQueue) take() bool {
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

// sleep waits for timer, due at next, or for a change worth a call
// before it: a new waiter, one that leaves, a wake-up for one of the
// loop's tickets (a ticket held off, by the end of its hold); or a change
// of the plans or pools (tiersChanged, poolsChanged closed) after the
// last round read them, which the next round reads at once: a raised
// limit, or shadow mode turned on, lets waiters in then, not at the
// loop's next look, and a plan or pool removed answers them then.
func (q *scopeQueue) sleep(timer *time.Timer, next time.Time, tiersChanged, poolsChanged <-chan struct{}) {
	for {
		select {
		case <-timer.C:
			return
		case <-tiersChanged:
			timer.Stop()
			return
		case <-poolsChanged:
			timer.Stop()
			return
		case <-q.poke:
		}
		due, by := q.due(time.Now())
		if due {
			timer.Stop()
			return
		}
		if !by.IsZero() && by.Before(next) {
			next = by
			timer.Reset(time.Until(next))
		}
	}
}

// due reports whether a call should be made now: a waiter joined or is to
// leave, or a wake-up named one of the loop's tickets (or no one). The
// tickets named are kept for the call. A wake-up for a ticket held off
// (heldOff) makes none: by is when its hold ends, the latest the next call
// is then due (the zero time when no wake-up is held off). So replicas
// whose scripts each find the other's ticket owed a free place, and wake
// it (two releases' orders during a rolling update), call at most once a
// poll each, not in turn as fast as Redis answers; and a wake-up a ticket
// was not owed is served, at worst, as a lost one is, at that poll.
func (q *scopeQueue) due(now time.Time) (due bool, by time.Time) {
	q.mu.Lock()
	woken, all, joined := q.woken, q.wokenAll, len(q.incoming) > 0
	q.woken, q.wokenAll = nil, false
	q.mu.Unlock()
	named := false
	for _, id := range woken {
		if _, ok := q.places[id]; !ok {
			continue
		}
		q.named[id] = true
		if until := q.heldOff[id]; now.Before(until) {
			if by.IsZero() || until.Before(by) {
				by = until
			}
			continue
		}
		named = true
	}
	q.namedAll = q.namedAll || all
	if joined || all || named {
		return true, time.Time{}
	}
	for _, w := range q.waiters {
		if _, leaving := w.gone(now); leaving {
			return true, time.Time{}
		}
	}
	return false, by
}
