package limiter

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// ticketCall is one stream id's ticket in a call: whether to send it, and
// whether it leaves.
type ticketCall struct {
	send, leave bool
	// retry: a waiter of the ticket leaves, while another stays.
	retry bool
	// woken: a wake-up named it (see scopeQueue.heldOff).
	woken bool
	// need: it needs the call (it is new, leaves, was named, or its
	// refresh is due), not only a look for a free slot.
	need bool
	at   int // index in WaitArgs.Tickets when sent
}

// round makes one call to the wait script, for the tickets that need one,
// and answers the waiters it decides; it returns when the next call is
// due if nothing happens meanwhile.
//
// A call is made when a waiter is new or leaves, when a wake-up named one
// of the loop's tickets (or no one), when a ticket's refresh is due, when
// a slot or a ticket may have expired, and, for a ticket that could be
// served next (its place is within the limit), when a slot is free
// (room). The tickets it carries are those, and every ticket whose
// refresh is half due (so the refreshes of tickets that joined at
// different times fall into the same calls); every ticket when a slot or
// a ticket may have expired. So a user with a thousand waiters on this
// server costs two reads per poll for the head of the queue and one call
// with all its tickets per TicketTTL/3.
func (q *scopeQueue) round() time.Time {
	l := q.l
	now := time.Now()
	tier, mode, err := q.bounds()
	if err != nil {
		q.withdraw(tier)
		q.fail(mode, err, now)
		return now
	}
	refreshBy := l.ticketTTL / 3
	// Every ticket goes when a slot or a ticket may have expired, and when
	// the scope's limit changed since the latest call: the call writes the
	// limit in force into the tickets' records (see wait.lua), by which
	// release and the other plans' calls serve the queue.
	all := q.namedAll || !now.Before(q.expiresAt) || q.limit != q.calledLimit
	q.refuseForeign()

	// Whether a waiter leaves is decided once, here: a caller that leaves
	// during the call is withdrawn at the next. A stream id's ticket
	// leaves when all of its waiters do.
	calls := map[string]*ticketCall{}
	leaves := make([]WaitOutcome, len(q.waiters))
	// needed: a ticket of the loop needs the call; polled: one could be
	// served next, so the loop looks for a free slot.
	needed, polled := false, false
	for j, w := range q.waiters {
		outcome, leaving := w.gone(now)
		leaves[j] = outcome
		c := calls[w.streamID]
		if c == nil {
			c = &ticketCall{leave: true}
			calls[w.streamID] = c
		}
		c.leave = c.leave && leaving
		c.retry = c.retry || leaving
		c.woken = c.woken || q.named[w.streamID]
		place := q.places[w.streamID]
		since := now.Sub(q.refreshed[w.streamID])
		need := all || leaving || q.named[w.streamID] || q.owedCall[w.streamID] || place == 0 || since >= refreshBy
		poll := place <= q.served()
		c.send = c.send || need || poll || since >= refreshBy/2
		c.need = c.need || need
		needed, polled = needed || need, polled || poll
	}
	args := lua.WaitArgs{Limit: q.limit, SlotTTL: tier.SlotTTL, TicketTTL: l.ticketTTL, MaxQueue: l.maxQueue}
	if q.shadowLimit >= 0 {
		args.Limit, args.Shadow = q.shadowLimit, true
	}
	// A pool key's memberships are kept by their streams' slot TTLs (see
	// waiter.slotTTL), and a call grants its places with one (slotTTL);
	// the tickets of streams of another (their plan's TTL changed between
	// the streams' grants) wait for a later call: at once when one needs
	// it, else the next look, which takes the other TTL (q.lastTTL).
	slotTTL := q.callTTL(calls)
	deferNeeded := false
	var stillNamed, stillDue []string // deferred tickets a wake-up named, or a call needed
	for _, w := range q.waiters {
		c := calls[w.streamID]
		if c.send && c.at == 0 && w.slotTTL > 0 && w.slotTTL != slotTTL {
			c.send = false
			if c.need {
				deferNeeded, stillDue = true, append(stillDue, w.streamID)
			}
			if q.named[w.streamID] {
				stillNamed = append(stillNamed, w.streamID)
			}
			continue
		}
		if c.send && c.at == 0 {
			args.Tickets = append(args.Tickets, lua.TicketArgs{StreamID: w.streamID, Leave: c.leave, Retry: c.retry, Record: w.record})
			c.at = len(args.Tickets) // 1-based, 0: not yet
		} else if c.send && args.Tickets[c.at-1].Record.Caller == "" && w.record.Caller != "" {
			// The ticket goes with the record of its first waiter that names
			// a caller (refuseForeign left one at most), so that the script
			// checks that caller against the stream's ticket and slot, as
			// it would were that waiter alone: an open request waiting
			// first (caller "", nobody's) takes no named caller past it.
			args.Tickets[c.at-1].Record = w.record
		}
	}
	clear(q.named)
	clear(q.owedCall)
	q.namedAll = false
	for _, id := range stillNamed {
		q.named[id] = true
	}
	for _, id := range stillDue {
		q.owedCall[id] = true
	}
	if slotTTL > 0 {
		// Granted with the plan's TTL as it is now, a membership could
		// lapse before its stream's first heartbeat, or outlive its slot.
		args.SlotTTL, q.lastTTL = slotTTL, slotTTL
	}
	if !needed && !polled {
		return q.next(now)
	}
	if !needed {
		switch room, err := q.room(now); {
		case err != nil:
			q.fail(mode, err, now)
			return now.Add(refreshBy)
		case !room:
			return q.next(now)
		}
	}

	var got lua.Waited
	var replicas *replicaSync
	ctx := context.Background()
	err = l.do(ctx, "wait", func(ctx context.Context, c rueidis.Client) (err error) {
		c, replicas = l.synced(c)
		got, err = lua.Wait(ctx, c, q.key, args)
		return err
	})
	if err != nil {
		q.fail(mode, err, now)
		return now.Add(refreshBy)
	}
	q.calledLimit = q.limit
	q.reclaimed(ctx, tier, got.Pruned)
	// Of the tickets owed a slot, those of this loop left out of the call
	// are served by the next one, at once; the others' servers are woken.
	again := false
	wake := got.Wake[:0:0]
	for _, id := range got.Wake {
		if _, mine := calls[id]; mine {
			q.named[id], again = true, true
		} else {
			wake = append(wake, id)
		}
	}
	if len(wake) > 0 {
		l.wake(ctx, q.key, wake...)
	}
	if got.Next >= 0 {
		q.expiresAt = now.Add(got.Next)
	}
	q.override = got.Override

	// A granted stream id's slot goes to those of its waiters that stay:
	// one that leaves is answered as it leaves (a sibling that stays holds
	// the slot, and must not see it released under it).
	holders := map[string]*atomic.Int32{}
	for j, w := range q.waiters {
		if c := calls[w.streamID]; c.send && got.Tickets[c.at-1].State == lua.TicketGranted && leaves[j] == "" {
			if holders[w.streamID] == nil {
				holders[w.streamID] = new(atomic.Int32)
			}
			holders[w.streamID].Add(1)
		}
	}
	kept := q.waiters[:0]
	for j, w := range q.waiters {
		c := calls[w.streamID]
		if !c.send {
			kept = append(kept, w)
			continue
		}
		t := got.Tickets[c.at-1]
		// The pools the granted slot's record names: the held one's for an
		// extension, else those of the ticket the call sent for the stream
		// (the first of its waiters here).
		pools := args.Tickets[c.at-1].Record.Pools
		if t.Extended {
			pools = lua.ParseRecord(t.Record).Pools
		}
		outcome, leaving := leaves[j], leaves[j] != ""
		switch {
		case t.State == lua.TicketGranted && !leaving:
			// Judged by the script by the count as its ticket was granted
			// (t.OverLimit), not the call's last: in shadow mode, of waiters
			// granted together, only those granted past the limit were over
			// it, and their slots' records say so.
			w.answer(waitResult{outcome: WaitGranted, expiresAtMs: t.ExpiresAtMs, tier: tier, replicas: replicas, used: t.Used, override: got.Override, holders: holders[w.streamID], extended: t.Extended, share: t.Share, record: t.Record, overLimit: t.OverLimit, pools: pools})
		case t.State == lua.TicketNotHolder && w.record.Caller != "":
			// The ticket went with this waiter's caller (see above), whom
			// the stream's ticket or slot refuses. A waiter of no caller is
			// nobody's: it stays, and its next call sends its own record.
			w.answer(waitResult{outcome: WaitFailed, err: fmt.Errorf("%w: stream %q of user %q", ErrNotSlotHolder, w.stream, q.userID)})
		case leaving:
			w.answer(waitResult{outcome: outcome, used: got.Used, override: got.Override, retry: got.RetryAfter})
		case t.State == lua.TicketFull:
			// One that had a place was displaced by a waiter served
			// before it (see lib_tickets.lua's displace).
			w.answer(waitResult{outcome: WaitFull, used: got.Used, override: got.Override, retry: got.RetryAfter, displaced: q.places[w.streamID] > 0})
		default:
			// Queued; or, withdrawn while another waiter of its stream id
			// left, queued again at the next call (place 0). Woken, yet
			// not owed a slot: the next wake-up for it waits for a poll.
			kept = append(kept, w)
			q.places[w.streamID] = t.Place
			q.refreshed[w.streamID] = now
			if c.woken {
				q.heldOff[w.streamID] = now.Add(q.pollEvery())
			}
		}
	}
	clear(q.waiters[len(kept):])
	q.waiters = kept
	waiting := make(map[string]bool, len(kept))
	for _, w := range kept {
		waiting[w.streamID] = true
	}
	for id := range q.places {
		if !waiting[id] {
			delete(q.places, id)
			delete(q.refreshed, id)
			delete(q.heldOff, id)
		}
	}
	if again || deferNeeded {
		return now
	}
	return q.next(now)
}

// reclaimed reports the pruned slots of a call: a pool key's members, or
// the user's slots.
func (q *scopeQueue) reclaimed(ctx context.Context, tier tiers.Tier, pruned int) {
	switch {
	case pruned == 0:
	case q.pool != "":
		q.l.observer.PoolReclaimed(ctx, q.pool, pruned)
	default:
		q.l.observer.Reclaimed(ctx, tier.Plan, pruned)
	}
}

// withdraw takes the loop's queued tickets out of the scope's queue, in
// one call, and wakes those then owed a free slot: their plan or pool was
// removed (bounds), and their waiters are answered next. Left in the
// queue, a ticket would stay owed the next free slot until it expired,
// and those behind it would wait for it. A call that fails leaves them to
// expire, as before. The call sends the scope's limit as the latest round
// found it: the one the tickets still queued are served by.
func (q *scopeQueue) withdraw(tier tiers.Tier) {
	l := q.l
	// (No ticket of the call is granted: the slot TTL goes unused.)
	args := lua.WaitArgs{Limit: q.limit, SlotTTL: max(tier.SlotTTL, time.Millisecond), TicketTTL: l.ticketTTL, MaxQueue: l.maxQueue}
	at := map[string]int{}
	for _, w := range q.waiters {
		if q.places[w.streamID] == 0 {
			continue // not queued as the latest call found it
		}
		if i, ok := at[w.streamID]; ok {
			if args.Tickets[i].Record.Caller == "" {
				args.Tickets[i].Record = w.record // the caller whose ticket it is, as round sends it
			}
			continue
		}
		at[w.streamID] = len(args.Tickets)
		args.Tickets = append(args.Tickets, lua.TicketArgs{StreamID: w.streamID, Leave: true, Record: w.record})
	}
	if len(args.Tickets) == 0 {
		return
	}
	ctx := context.Background()
	var got lua.Waited
	err := l.do(ctx, "wait", func(ctx context.Context, c rueidis.Client) (err error) {
		got, err = lua.Wait(ctx, c, q.key, args)
		return err
	})
	if err != nil {
		return
	}
	q.reclaimed(ctx, tier, got.Pruned)
	if len(got.Wake) > 0 {
		l.wake(ctx, q.key, got.Wake...)
	}
}

// callTTL is the slot TTL of the pool key's memberships a call grants
// (see round): that of the first sent ticket that needs the call, else
// of the first sent whose TTL the latest call did not take (q.lastTTL),
// else of the first sent; 0 for a user's queue, whose waiters carry none.
func (q *scopeQueue) callTTL(calls map[string]*ticketCall) time.Duration {
	var first, other time.Duration
	for _, w := range q.waiters {
		c := calls[w.streamID]
		if !c.send || w.slotTTL == 0 {
			continue
		}
		if c.need {
			return w.slotTTL
		}
		first = cmp.Or(first, w.slotTTL)
		if w.slotTTL != q.lastTTL {
			other = cmp.Or(other, w.slotTTL)
		}
	}
	return cmp.Or(other, first)
}

// refuseForeign answers ErrNotSlotHolder to each waiter whose stream id
// another caller waits for here already: the call sends one ticket per
// stream id, the first waiter's, and grants all of its waiters from it,
// so a second caller's acquire of the id would be granted a slot whose
// record names the first (which it could neither beat nor release) where
// another server's script refuses it (wait.lua's foreign). Callers ""
// (an open API) are nobody's, as there: never refused, nor refusing.
func (q *scopeQueue) refuseForeign() {
	var owner map[string]string // the first caller named waiting for each stream id
	kept := q.waiters[:0]
	for _, w := range q.waiters {
		caller := w.record.Caller
		if caller == "" {
			kept = append(kept, w)
			continue
		}
		if owner == nil {
			owner = map[string]string{}
		}
		switch first, seen := owner[w.streamID]; {
		case !seen:
			owner[w.streamID] = caller
		case first != caller:
			w.answer(waitResult{outcome: WaitFailed, err: fmt.Errorf("%w: stream %q of user %q", ErrNotSlotHolder, w.stream, q.userID)})
			continue
		}
		kept = append(kept, w)
	}
	clear(q.waiters[len(kept):])
	q.waiters = kept
}

// room is a poll's look before its call: whether the scope has a slot
// free under the limit of the loop's plan (lua.Room). Without one the
// script could grant none of the loop's tickets, wake no one and queue
// nothing, and the tickets' refreshes are not due, so the call is not
// made: a poll that finds no wake-up was lost costs two reads, not a run
// of the script.
func (q *scopeQueue) room(now time.Time) (room bool, err error) {
	err = q.l.do(context.Background(), "wait_poll", func(ctx context.Context, c rueidis.Client) (err error) {
		room, err = lua.Room(ctx, c, q.key, q.limit, now)
		return err
	})
	return room, err
}

// next is when the loop's next call is due unasked: a poll while one of
// its tickets could be served next, each ticket's refresh, the next
// expiry of a slot or ticket, the end of a wait.
func (q *scopeQueue) next(now time.Time) time.Time {
	refreshBy := q.l.ticketTTL / 3
	next := q.expiresAt
	for _, w := range q.waiters {
		place := q.places[w.streamID]
		if place > 0 && place <= q.served() {
			next = minTime(next, now.Add(q.pollEvery()))
		}
		next = minTime(next, q.refreshed[w.streamID].Add(refreshBy), w.deadline)
	}
	return next
}

func minTime(t time.Time, others ...time.Time) time.Time {
	for _, o := range others {
		if o.Before(t) {
			t = o
		}
	}
	return t
}

// unbounded is the limit of a scope that refuses no acquire: a plan or a
// pool in shadow mode, or a pool key no longer capped. Its waiters are
// granted at the loop's next call, whatever override is in force (the
// scripts take it for their plan's or key's tickets, see wait.lua and
// lib_tickets.lua's owed).
const unbounded = lua.Unbounded

// bounds reads what limits the loop's scope now: the waiters' tier (their
// slots' TTL) and the scope's limit (into q.limit, and q.shadowLimit) and
// failure mode: the tier's for a user, the pool's for a pool key. Errors:
// the plan or the pool went away while acquires waited for them.
func (q *scopeQueue) bounds() (tiers.Tier, tiers.FailureMode, error) {
	tier, ok := q.l.tiers.Lookup(q.plan)
	if !ok {
		return tiers.Tier{Plan: q.plan}, tiers.DefaultFailureMode, errPlanGone(q.plan)
	}
	q.shadowLimit = -1
	if q.pool == "" {
		q.limit = tier.MaxConcurrentStreams
		if !tier.Enforced() {
			q.limit = unbounded // shadow mode refuses none: nothing to wait for
			q.shadowLimit = tier.MaxConcurrentStreams
		}
		return tier, tier.OutageMode(), nil
	}
	pool, ok := q.l.pools.Lookup(q.pool)
	if !ok {
		return tier, tiers.DefaultFailureMode, fmt.Errorf("%w: %q was removed while acquires waited for it", ErrUnknownPool, q.pool)
	}
	limit, capped := pool.Limit(q.poolKey)
	if capped && !pool.Enforced() {
		q.shadowLimit = limit
	}
	if !capped || !pool.Enforced() {
		limit = unbounded // no longer capped, or in shadow mode, which refuses none: nothing to wait for
	}
	q.limit = limit
	return tier, pool.OutageMode(), nil
}

// served is how many of the queue's tickets the scope's limit serves at
// once: its override as the latest call found it, else its limit (shadow
// mode's, unbounded, whatever the override).
func (q *scopeQueue) served() int {
	if q.override >= 0 && q.limit < unbounded {
		return q.override
	}
	return q.limit
}

// pollEvery is how long after a call one for a ticket that could be
// served next is due (a wake-up may have been lost): WaitPoll, jittered by
// up to a fifth either way.
func (q *scopeQueue) pollEvery() time.Duration {
	p := q.l.waitPoll
	return p*4/5 + rand.N(p*2/5+1)
}

// fail answers the waiters of a call that failed with err: the tier's
// failure mode decides for an outage, as for any acquire; a caller that
// left is answered as cancelled. The tickets not withdrawn expire.
func (q *scopeQueue) fail(mode tiers.FailureMode, err error, now time.Time) {
	open := degrade(mode, err)
	if open {
		q.l.warnDegraded(context.Background(), "redis unavailable; granting waiting acquires degraded (failureMode Open)", "plan", q.plan, "pool", q.pool, "err", err)
	}
	for _, w := range q.waiters {
		switch outcome, _ := w.gone(now); {
		case outcome == WaitCancelled:
			w.answer(waitResult{outcome: WaitCancelled, unsure: true})
		case open:
			w.answer(waitResult{outcome: WaitGranted, degraded: true})
		default:
			w.answer(waitResult{outcome: WaitFailed, err: err, unsure: true})
		}
	}
	clear(q.waiters)
	q.waiters = q.waiters[:0]
	clear(q.places)
	clear(q.refreshed)
	clear(q.heldOff)
	clear(q.owedCall)
}
