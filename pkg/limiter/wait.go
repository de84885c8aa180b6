package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
)

// Waiting for a slot (DESIGN §14). An acquire that finds the user's slots
// held, and may wait (AcquireRequest.Wait, capped by the tier's MaxWait),
// takes a ticket in the user's queue: a second sorted set under the
// user's hash tag, ordered by arrival (Redis time). One script (wait.lua)
// decides, atomically, which tickets get the free slots: those at the
// head, in order, whichever server holds them. A ticket expires unless
// its server refreshes it, so a server that dies leaves no one stuck
// behind its waiters.
//
// Each server runs one loop per user (and plan) it has waiters of, not
// one per waiter: the loop's every call to the script refreshes, queues,
// grants and withdraws all of the server's tickets for that user at once,
// and one subscription per user and server carries the wake-ups. A
// release that frees a slot while tickets wait publishes the head's
// stream id on the user's shard (SPUBLISH); the server holding it calls
// the script at once, which grants the slot or, when the head's server is
// gone, names the tickets owed it next. Without a wake-up a loop looks
// for a free slot every WaitPoll when one of its tickets could be served
// next (two reads; the script only when one is free, see room), calls
// the script every TicketTTL/3 to refresh its tickets, and at the moment
// a slot or a ticket is due to expire. So the cost of waiting grows with the users
// that have waiters, not with the waiters.

// WaitOutcome says how a wait in the queue ended: the outcome label of the
// wait metrics.
type WaitOutcome string

// Outcomes of a wait.
const (
	// WaitGranted: a slot freed up and went to the acquire.
	WaitGranted WaitOutcome = "granted"
	// WaitTimeout: the wait ran out first; the acquire is denied.
	WaitTimeout WaitOutcome = "timeout"
	// WaitCancelled: the caller gave up (disconnected) while waiting; its
	// ticket is removed at once.
	WaitCancelled WaitOutcome = "cancelled"
	// WaitFull: the user's queue held Options.MaxQueue tickets, so the
	// acquire was denied without waiting.
	WaitFull WaitOutcome = "full"
	// WaitFailed: Redis stopped answering (the tier's failure mode
	// answered: degraded grants on Open plans, 503 on Closed ones), or
	// refused the call, or the plan went away; or, in the metrics, the
	// process shut down while the acquire waited (ErrShuttingDown).
	WaitFailed WaitOutcome = "failed"
	// WaitRevoked, in the metrics: the front end ended the wait because
	// the caller's credentials were revoked while it waited (ErrRevoked);
	// its ticket is removed at once, and a slot granted meanwhile given
	// back.
	WaitRevoked WaitOutcome = "revoked"
)

// observed is the outcome of a wait as the metrics count it: a wait whose
// context the process ended as it shut down (ErrShuttingDown) failed, as
// one Redis stopped answering did, since its caller did not leave; the
// front end answers it 503. One ended as its caller was revoked
// (ErrRevoked) is revoked: that caller did not leave either.
func observed(ctx context.Context, outcome WaitOutcome) WaitOutcome {
	if outcome != WaitCancelled {
		return outcome
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrShuttingDown):
		return WaitFailed
	case errors.Is(cause, ErrRevoked):
		return WaitRevoked
	}
	return outcome
}

// waiter is one acquire waiting in a scope's queue on this server: its
// user's, or a pool key's.
type waiter struct {
	// streamID is the ticket's member in the scope: the stream id in a
	// user's queue, poolMember's "<stream id> <user id>" in a pool key's;
	// stream the stream id alone.
	streamID, stream string
	record           lua.Record
	// slotTTL, of a pool key's waiter, is its stream's slot TTL, which
	// its membership is granted with: heartbeats keep the membership by
	// the slot's recorded TTL, not by the plan as it is when the
	// membership is granted. 0, a user's waiter: the plan's as the call
	// reads it (bounds), recorded with the slot.
	slotTTL  time.Duration
	ctx      context.Context
	deadline time.Time
	// done receives the outcome, once, from the user's loop.
	done chan waitResult
}

// waitResult is how a waiter's wait ended.
type waitResult struct {
	outcome WaitOutcome
	// granted
	expiresAtMs int64
	// tier is the plan as the call that granted the slot read it: a new
	// slot's record keeps its SlotTTL (see bounds), which the slot's
	// heartbeats go by, whatever the plan was when the acquire queued.
	tier     tiers.Tier
	degraded bool
	replicas *replicaSync
	// holders counts the waiters of this server answered granted for the
	// same stream id in the same call (a client's retries of one acquire
	// share its slot): one that finds its caller gone releases the slot
	// only when it is the last of them to go.
	holders *atomic.Int32
	// extended, of a grant: the stream held its slot already, taken by
	// another request of it (lua.TicketResult.Extended); share is the
	// grant's share of the slot, which a waiter that gives up leaves.
	extended bool
	share    lua.Share
	record   string // of an extension: the held slot's record, as kept
	// overLimit, of a grant: shadow mode let its slot in over the limit
	// (lua.TicketResult.OverLimit: the script's verdict, which the slot's
	// record keeps for its retries and extensions).
	overLimit bool
	// pools, of a grant: the pool keys the slot's record names
	// (lua.EncodePools), which its waiters must name too.
	pools string
	// granted, timeout: the scope's slots (of a grant, as the call
	// granted it: lua.TicketResult.Used), and the limit of the scope's
	// override when one applied (-1: the plan's or the key's)
	used     int
	override int
	retry    time.Duration
	// failed
	err error
	// unsure: the call that answered never got Redis's answer, so it may
	// have granted the ticket a slot that nobody holds.
	unsure bool
	// displaced, of WaitFull: the ticket had a place in the queue, and
	// a waiter served before it took it (the queue holds its most).
	displaced bool
}

// await waits for a slot for req, denied at once with res, for up to
// wait. It returns the grant, or res with Waited set when the wait ran
// out, or an error: the caller's context error when it gave up, the
// failure mode's when Redis stopped answering.
//
// generated says the stream id was made for this acquire: a slot that a
// call whose answer was lost may have granted it is released, as no one
// else could. pools are the pool keys the stream joins once its slot is
// granted (lua.EncodePools), recorded with the slot as an acquire that
// does not wait records them, so that heartbeat and release cover them.
func (l *Limiter) await(ctx context.Context, key string, req AcquireRequest, tier tiers.Tier, wait time.Duration, res AcquireResult, generated bool, pools string) (AcquireResult, userSlot, error) {
	res, r, err := l.awaitSlot(ctx, key, req, tier, wait, res, generated, pools)
	return res, userSlot{added: !r.extended, share: r.share, whole: generated, shared: r.holders}, err
}

// awaitSlot is await, and how its wait ended.
func (l *Limiter) awaitSlot(ctx context.Context, key string, req AcquireRequest, tier tiers.Tier, wait time.Duration, res AcquireResult, generated bool, pools string) (AcquireResult, waitResult, error) {
	start := time.Now()
	w := &waiter{
		streamID: req.StreamID, stream: req.StreamID, record: lua.Record{Caller: req.Caller, Plan: tier.Plan, Pools: pools, Label: req.Label, Priority: tier.Priority, Token: req.token},
		ctx: ctx, deadline: start.Add(wait), done: make(chan waitResult, 1),
	}
	r := l.waitIn(ctx, queueScope{key: key, userID: req.UserID}, tier, w)
	took := time.Since(start)
	res.Waited, res.Owed = took, 0 // owed as the wait began; not known as it ends
	outcome := r.outcome
	defer func() { l.observer.Waited(ctx, tier, observed(ctx, outcome), took) }()

	if (r.outcome == WaitGranted || r.outcome == WaitTimeout) && !r.degraded {
		res.Limit, res.Overridden = tier.MaxConcurrentStreams, r.override >= 0
		if now, ok := l.tiers.Lookup(tier.Plan); ok {
			// The plan as the queue served it, if it changed while the
			// acquire waited.
			res.Limit = now.MaxConcurrentStreams
		}
		if r.override >= 0 {
			res.Limit = r.override
		}
	}
	switch r.outcome {
	case WaitGranted:
		res.Granted, res.RetryAfter, res.Used, res.Extended = true, 0, r.used, r.extended
		if r.overLimit {
			// Let in by shadow mode, over the limit; or an extension, never
			// refused, which answers the verdict on the acquire that took
			// the stream, as the slot's record keeps it (as acquire's
			// extensions do).
			res.WouldRefuse = CodeStreamLimitReached
		}
		res.ExpiresAt = msTime(r.expiresAtMs)
		if r.degraded {
			res.Degraded, res.SlotDegraded, res.Used = true, true, 0
			res.ExpiresAt = degradedExpiry(tier.SlotTTL)
		} else {
			// The TTL the slot was granted with, and its heartbeat interval:
			// the plan's when the grant was made, not when the acquire queued
			// (an extension's are its record's: see heldPlan below).
			res.Tier = r.tier
		}
		if err := l.confirmGrant(ctx, r.replicas, tier, leaving(key, req.StreamID, r.share, lua.Extension{}, generated), &res); err != nil {
			if ctx.Err() != nil {
				// Its caller left during the WAIT: given back all the same,
				// and answered as a request whose caller left, not as the
				// limiter failing; still counted unconfirmed (Unsynced), a
				// sign of the replicas, not of the caller.
				outcome = WaitCancelled
				return AcquireResult{StreamID: req.StreamID, Limit: res.Limit, Tier: tier, Waited: took, Unsynced: true}, r, ctx.Err()
			}
			outcome = WaitFailed
			return res, r, err
		}
		if !r.degraded {
			// The slot's record names the pools its heartbeats and release
			// cover: another request of the stream took it (an extension),
			// or a waiter of the stream here sent the ticket. One naming
			// others is refused, as an acquire of a held stream is.
			if err := poolsDiffer(req, lua.DecodePools(r.pools), lua.DecodePools(pools)); err != nil {
				if own := leaving(key, req.StreamID, r.share, lua.Extension{}, generated); own.Key != "" && (r.holders == nil || r.holders.Add(-1) == 0) {
					_ = l.dropSlot(context.WithoutCancel(ctx), time.Time{}, "release", own)
				}
				outcome = WaitFailed
				return AcquireResult{StreamID: req.StreamID, Limit: res.Limit, Tier: tier, Waited: took}, r, err
			}
		}
		if r.extended && !r.degraded {
			// The answer is the plan the stream was taken under.
			l.heldPlan(r.record, tier, &res)
			if r.override >= 0 {
				res.Limit = r.override
			}
		}
		if ctx.Err() != nil {
			// Granted as the caller left: its share goes, unless another
			// waiter of the stream id got it too and stays (the slot goes
			// with the last share, another request's kept).
			if own := leaving(key, req.StreamID, r.share, lua.Extension{}, generated); own.Key != "" && !r.degraded && (r.holders == nil || r.holders.Add(-1) == 0) {
				_ = l.dropSlot(context.WithoutCancel(ctx), time.Time{}, "release", own)
			}
			outcome = WaitCancelled
			return AcquireResult{StreamID: req.StreamID, Limit: res.Limit, Tier: tier, Waited: took}, r, ctx.Err()
		}
		return res, r, nil
	case WaitTimeout:
		res.Used, res.RetryAfter = r.used, r.retry
		return res, r, nil
	case WaitFull:
		res.QueueFull = true
		if !r.displaced {
			res.Waited = 0 // refused at once: it did not wait
		}
		return res, r, nil
	}
	if r.unsure && generated {
		l.releaseUnanswered(ctx, req.UserID, req.StreamID)
	}
	if r.outcome == WaitCancelled {
		return AcquireResult{StreamID: req.StreamID, Limit: res.Limit, Tier: tier, Waited: took}, r, ctx.Err()
	}
	return AcquireResult{StreamID: req.StreamID, Limit: res.Limit, Tier: tier, Waited: took}, r, r.err
}

// waitIn queues w for scope's slots under tier, and returns how its wait
// ended. A wait in a pool key's queue is reported by pool and priority,
// not as a wait in the user's queue.
func (l *Limiter) waitIn(ctx context.Context, scope queueScope, tier tiers.Tier, w *waiter) waitResult {
	if scope.pool != "" {
		l.observer.PoolWaiting(ctx, scope.pool, tier.Priority, 1)
		defer l.observer.PoolWaiting(ctx, scope.pool, tier.Priority, -1)
	} else {
		l.observer.Waiting(ctx, tier, 1)
		defer l.observer.Waiting(ctx, tier, -1)
	}
	stop := l.join(scope, tier.Plan, w)
	r := <-w.done
	stop()
	return r
}

// answer sends w its outcome; the loop calls it once per waiter.
func (w *waiter) answer(r waitResult) { w.done <- r }

// gone reports whether w's caller left, or its wait ran out, at now:
// its ticket is to leave the queue.
func (w *waiter) gone(now time.Time) (WaitOutcome, bool) {
	switch {
	case w.ctx.Err() != nil:
		return WaitCancelled, true
	case !now.Before(w.deadline):
		return WaitTimeout, true
	}
	return "", false
}

// errPlanGone answers the waiters of a plan removed while they waited.
func errPlanGone(plan string) error {
	return fmt.Errorf("%w: %q was removed while acquires waited for it", ErrUnknownPlan, plan)
}
