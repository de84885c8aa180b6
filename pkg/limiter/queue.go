package limiter

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/keys"
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
	waiters   []*waiter            // in the order they came
	places    map[string]int       // each stream id's latest place in the queue; 0: none yet
	refreshed map[string]time.Time // when each stream id's ticket was last refreshed
	named     map[string]bool      // stream ids wake-ups named, for the next call
	namedAll  bool                 // a wake-up named no one: every ticket goes
	expiresAt time.Time            // when a slot or ticket may expire next, as last read
	override  int                  // the user's override as last read; -1: none
}

// join adds w to the loop of key and plan, starting it if none runs. stop
// releases what join set up to watch w, once w is answered.
func (l *Limiter) join(key, userID, plan string, w *waiter) (stop func()) {
	k := queueKey{key, plan}
	l.queues.mu.Lock()
	q := l.queues.m[k]
	if q == nil {
		q = &userQueue{l: l, key: key, userID: userID, plan: plan, poke: make(chan struct{}, 1),
			places: map[string]int{}, refreshed: map[string]time.Time{}, named: map[string]bool{}, override: -1}
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
// leave, or a wake-up named one of the loop's tickets (or no one). The
// tickets named are kept for the call.
func (q *userQueue) due(now time.Time) bool {
	q.mu.Lock()
	woken, all, joined := q.woken, q.wokenAll, len(q.incoming) > 0
	q.woken, q.wokenAll = nil, false
	q.mu.Unlock()
	named := false
	for _, id := range woken {
		if _, ok := q.places[id]; ok {
			q.named[id], named = true, true
		}
	}
	q.namedAll = q.namedAll || all
	if joined || all || named {
		return true
	}
	for _, w := range q.waiters {
		if _, leaving := w.gone(now); leaving {
			return true
		}
	}
	return false
}
