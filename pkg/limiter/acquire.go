package limiter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// AcquireRequest asks for one slot.
type AcquireRequest struct {
	UserID string
	Plan   string
	// StreamID identifies the slot. Empty: a random 128-bit id is made
	// (AcquireResult.StreamID, on errors too), known to no one else, so a
	// slot it may have taken with the answer lost (an error, the caller
	// gone) is released. Giving one makes retries idempotent, and leaves
	// such a slot to the caller, to retry under the id or release it.
	StreamID string
	// Caller names who asked: the API caller of the tokens file or client
	// certificate, recorded on the span and in the slot's record. Empty
	// when the API is open. A stream belongs to the caller that took it:
	// another caller's acquire of it is refused (ErrNotSlotHolder), as is
	// one of a stream id that waits in the queue under another caller.
	Caller string
	// Label is what the caller says the stream is (a pod, a model, a
	// request id), kept in the slot's record for support to see: at most
	// 128 bytes, no whitespace, control or invisible characters
	// (keys.ValidateLabel). Default "": none.
	Label string
	// Wait, when > 0, lets the acquire wait that long, capped by the
	// tier's MaxWait, for one of the user's slots when all are held:
	// it queues, and the user's slots go to the queue first come first
	// served, across every server (see wait.go); then, with what is left
	// of it, capped by each pool's MaxWait, for a place in each full pool
	// key, served by priority, then the user holding the fewest, then
	// waiting for the fewest, then arrival (see poolwait.go). Default 0: the acquire answers at once.
	Wait time.Duration
	// Pools name the pool keys the stream joins: pool → key ("model" →
	// "gpt-4o"), at most MaxPools. Each capped key must have room too, or
	// the acquire is refused (AcquireResult.RefusedBy) and takes nothing.
	// Default none.
	Pools map[string]string
	// OnWait, when set, is called once, when the acquire, denied at once,
	// is about to wait in a queue (its user's or a pool key's), with how
	// long it may yet wait in all, on the goroutine that called Acquire: a front end
	// whose own peer times the answer out (Envoy's ext_proc
	// message_timeout) can extend that deadline first. Not called when
	// the acquire answers at once.
	OnWait func(wait time.Duration)
	// Rejoin: the acquire counts again a stream granted degraded under
	// Plan (Redis did not answer), now that Redis answers (see package
	// hold). Plan is judged as its heartbeats are: by its definition in
	// force, or, for a plan deleted since the grant, by its last one, so
	// that the stream runs on counted as streams held under a deleted
	// plan do (DESIGN §15). Default false: a plan not in force is
	// ErrUnknownPlan.
	Rejoin bool

	// token names the request in what it takes (lua.Record.Token), for a
	// stream id its client chose; set by acquire.
	token string
	// waits, when set, is told as each wait in a queue (the user's, a pool
	// key's) begins (true) and ends (false): see EndWaitsWith.
	waits func(bool)
}

// waiting tells req.waits that a wait begins (on) or ends.
func (req AcquireRequest) waiting(on bool) {
	if req.waits != nil {
		req.waits(on)
	}
}

// AcquireResult is the answer to an acquire. A denial is a result
// (Granted false), not an error.
type AcquireResult struct {
	Granted  bool
	StreamID string
	// Used is the number of the user's live slots after the call (0 when
	// degraded: unknown).
	Used int
	// Limit is the limit the request was judged by: the tier's
	// maxConcurrentStreams, or the user's override (Overridden).
	Limit int
	// Overridden: a support override in force replaced the tier's limit.
	Overridden bool
	// ExpiresAt is when the slot expires without a heartbeat (granted only).
	ExpiresAt time.Time
	// RetryAfter is, when denied, how long until the user's earliest slot
	// expires.
	RetryAfter time.Duration
	// Owed, on a denial by the user's own limit with slots free (Used
	// below Limit), is how many acquires waiting in the user's queue the
	// free slots are owed to (first come, first served), which refused
	// it; 0 else, and after a wait of its own ran out.
	Owed int
	// Pruned counts the user's slots that had expired unreleased and were
	// removed by this call: the crash and leak signal.
	Pruned int
	// Degraded: Redis did not answer and the scope fails open, so the
	// stream was granted without being counted there: the user's slot
	// (SlotDegraded), or the membership of a pool key (that PoolGrant's
	// Degraded), or both.
	Degraded bool
	// SlotDegraded: the user's own slot was granted degraded (its shard
	// did not answer and the tier fails open; Used is then 0, unknown).
	// False when only a pool's membership was: the plan's limit was
	// judged, and Used and WouldRefuse say how.
	SlotDegraded bool
	// Unsynced: fewer replicas than Options.SyncReplicas confirmed the
	// grant; it stands on Open plans and was refused on Closed ones.
	Unsynced bool
	// Tier is the tier the request was judged by.
	Tier tiers.Tier
	// Waited is how long the acquire waited in the user's queue (see
	// AcquireRequest.Wait): before it was granted, or, when it was not,
	// before its wait ran out. 0 when it did not wait.
	Waited time.Duration
	// QueueFull, on a denial that asked to wait: the queue it was to wait
	// in (its user's, or RefusedBy's key's) held its most waiters
	// (Options.MaxQueue), each served before it: it did not wait there
	// (Waited, or RefusedBy.Waited, 0), or a waiter served before it took
	// its place (they say how long it had waited).
	QueueFull bool
	// Pools are the capped pool keys the granted stream holds a
	// membership of, in the order of the pools' names.
	Pools []PoolGrant
	// RefusedBy, on a denial, is the pool key that refused the stream;
	// nil when the user's own limit did (Used, Limit, RetryAfter).
	RefusedBy *PoolRefusal
	// Extended, on a grant: the stream held its slot before this acquire
	// (another request of it took it: a retry, or a re-acquire), and the
	// acquire extended it, which no limit refuses.
	Extended bool
	// WouldRefuse, on a grant, is the refusal that a scope in shadow mode
	// (enforce: false) would have answered and did not (DESIGN §18):
	// CodeStreamLimitReached for the plan's limit (Used counts the slot,
	// above Limit), CodePoolLimitReached for a pool key's cap
	// (WouldRefuseBy names it). "" when none would have. Of an extension
	// (Extended), the verdict on the acquire that took the stream, as the
	// slot's and memberships' records keep it: a retry whose first answer
	// was lost is told what that answer said.
	WouldRefuse string
	// WouldRefuseBy is the pool key of a WouldRefuse
	// CodePoolLimitReached: its live memberships and cap.
	WouldRefuseBy *PoolRefusal
}

// Codes of the refusals a shadow scope would have answered
// (AcquireResult.WouldRefuse): those of the HTTP API's 429s.
const (
	CodeStreamLimitReached = "stream_limit_reached"
	CodePoolLimitReached   = "pool_limit_reached"
)

// Acquire takes a slot for req.UserID if the user holds fewer than the
// plan's limit, or the limit of the user's override in force (and no
// earlier acquire waits for the free ones). With req.Wait it may wait for
// one (see AcquireRequest.Wait); a wait that runs out is a denial (Granted
// false, Waited > 0). Errors: ErrInvalidUserID, ErrInvalidStreamID,
// ErrInvalidLabel, ErrUnknownPlan, ErrUnavailable (Redis down and the tier
// fails closed), ctx's error when the caller gave up while waiting.
func (l *Limiter) Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error) {
	ctx, span := l.startSpan(ctx, "limiter.acquire")
	if req.Caller != "" && span.IsRecording() {
		span.SetAttributes(attrCaller.String(req.Caller))
	}
	res, tier, err := l.acquire(ctx, req)
	if err == nil && res.Granted && !res.SlotDegraded {
		// What the stream holds now; nothing remembered of an earlier
		// stream of its id (see joinedGrants).
		if held := counted(res.Pools); len(held) > 0 {
			l.joined.remember(req.UserID, res.StreamID, req.Caller, held, time.Now())
		} else {
			l.joined.forget(req.UserID, res.StreamID)
		}
	}
	if span.IsRecording() {
		span.SetAttributes(tierAttrs(tier, attrGranted.Bool(res.Granted), attrUsed.Int(res.Used),
			attrPruned.Int(res.Pruned), attrDegraded.Bool(res.Degraded))...)
		if res.Waited > 0 {
			span.SetAttributes(attrWaitedMs.Int64(res.Waited.Milliseconds()))
		}
	}
	endSpan(span, err)
	l.observer.Acquired(ctx, tier, res, err)
	return res, err
}

func (l *Limiter) acquire(ctx context.Context, req AcquireRequest) (AcquireResult, tiers.Tier, error) {
	key, err := l.keys.UserKey(req.UserID)
	if err != nil {
		return AcquireResult{}, tiers.Tier{}, err
	}
	// An id of our own making is known to no one else: when the answer is
	// lost, no one but this call can release the slot it may have taken.
	generated := req.StreamID == ""
	if generated {
		req.StreamID = keys.NewStreamID()
	} else if err := keys.ValidateStreamID(req.StreamID); err != nil {
		return AcquireResult{}, tiers.Tier{}, err
	}
	// Other requests of the stream (the client's retries) may hold it
	// too: this one's calls, asked again after a lost reply, are known for
	// the share they took, and answer as its first try did (a new slot, a
	// shadow scope's would_refuse), whoever chose the id.
	req.token = lua.NewToken()
	if err := keys.ValidateLabel(req.Label); err != nil {
		return AcquireResult{}, tiers.Tier{}, err
	}
	tier, err := l.tier(req.Plan)
	if req.Rejoin {
		tier, err = l.heldTier(req.Plan)
	}
	if err != nil {
		return AcquireResult{}, tiers.Tier{}, err
	}
	ms, err := l.memberships(req.Pools)
	if err != nil {
		return AcquireResult{}, tier, err
	}
	held := make([]lua.PoolKey, len(ms))
	for i, m := range ms {
		held[i] = lua.PoolKey{Pool: m.pool.Pool, Key: m.key}
	}

	// One decision, however many pools it joins (DESIGN §10 P4); and one
	// wait, across the user's queue and the pools' (DESIGN §17).
	var end, waitUntil time.Time
	wait := min(req.Wait, tier.MaxWait)
	if onWait := req.OnWait; onWait != nil {
		called := false
		req.OnWait = func(d time.Duration) {
			if !called {
				called = true
				onWait(d)
			}
		}
	}
	if len(ms) > 0 {
		end = l.decisionEnd()
		if wait > 0 {
			waitUntil = time.Now().Add(wait)
		}
	}
	// The pool keys' scripts go out beside the user's, so that a pooled
	// acquire that is granted takes one round trip, as one without pools
	// does; the user's answer is decided first, and when it does not
	// grant, the memberships taken meanwhile are removed before the
	// answer (or before its wait), as a pool's refusal removes the user's
	// slot.
	//
	// The pool keys' scripts go with the user's, one pipeline per node,
	// when no WAIT follows it, answered together. Each node's answers,
	// and its EVALs where it lacks a script, are its own, so one node's
	// hang is its own keys' outage, not the others' (see lua.AcquireAll
	// and deadlineClient.DoMulti).
	//
	// Not for a user its own limit lately refused (see atLimit): its
	// pools are joined once its slot is granted, by grantPools.
	var tries []poolTry
	triesDone := func() {}
	beside := len(ms) > 0 && !l.atLimit.has(req.UserID, time.Now())
	together := beside && l.syncReplicas == 0
	if beside && !together {
		tries, triesDone = l.tryPools(ctx, end, req, tier, ms)
	}
	var got lua.Acquired
	var replicas *replicaSync
	err = l.doBy(ctx, end, "acquire", func(ctx context.Context, c rueidis.Client) (err error) {
		rec := lua.Record{Caller: req.Caller, Plan: tier.Plan, Pools: lua.EncodePools(held), Label: req.Label, Token: req.token}
		user := lua.AcquireArgs{Key: key, StreamID: req.StreamID, Limit: tier.MaxConcurrentStreams, TTL: tier.SlotTTL, Rec: rec, Shadow: !tier.Enforced()}
		if together {
			got, tries, err = l.acquireTogether(ctx, c, user, req, tier, ms)
			return err
		}
		c, replicas = l.synced(c)
		got, err = lua.AcquireWith(ctx, c, user)
		return err
	})
	triesDone()
	if generated {
		// No one held a stream id the limiter chose before this call: an
		// answer that it is held (an extension) is this call's own first
		// attempt, its reply lost, and what that took is this call's.
		got.Extended = false
		for i := range tries {
			tries[i].got.Extended = false
		}
	}
	atFault("after-acquire-calls") // a crash here leaves the slot and the memberships, to expire
	// undoTries removes the memberships tries took, for an acquire that
	// answers without them.
	undoTries := func() {
		if taken := takenOf(tries, poolMember(req.UserID, req.StreamID), generated); len(taken) > 0 {
			l.undo(ctx, end, taken, false, lua.Member{})
		}
	}
	res := AcquireResult{StreamID: req.StreamID, Limit: tier.MaxConcurrentStreams, Tier: tier}
	if degrade(tier.OutageMode(), err) {
		undoTries() // a stream granted degraded is counted nowhere
		if err := l.degradedPools(ctx, ms, err, &res); err != nil {
			// Refused by a pool failing closed: the user's call may have
			// taken the slot with only its answer lost, under an id no
			// one else knows when the limiter made it.
			if generated {
				l.releaseUnanswered(ctx, req.UserID, req.StreamID)
			}
			return AcquireResult{StreamID: req.StreamID, Limit: tier.MaxConcurrentStreams, Tier: tier}, tier, err
		}
		l.warnDegraded(ctx, "redis unavailable; granting acquire degraded (failureMode Open)", "plan", tier.Plan, "err", err)
		res.Granted, res.Degraded, res.SlotDegraded = true, true, true
		res.ExpiresAt = degradedExpiry(tier.SlotTTL)
		return res, tier, nil
	}
	if err != nil {
		undoTries()
		if generated {
			l.releaseUnanswered(ctx, req.UserID, req.StreamID)
		}
		return AcquireResult{StreamID: req.StreamID, Limit: tier.MaxConcurrentStreams, Tier: tier}, tier, err
	}
	if got.Pruned > 0 {
		l.observer.Reclaimed(ctx, tier.Plan, got.Pruned)
	}
	if len(got.Wake) > 0 {
		l.wake(ctx, key, got.Wake...)
	}
	if got.NotHolder {
		undoTries()
		return AcquireResult{StreamID: req.StreamID, Limit: tier.MaxConcurrentStreams, Tier: tier}, tier, notHolder(got, req.StreamID, req.UserID, "")
	}
	if got.Extended {
		// An extension joins no pool key the stream does not hold: what it
		// took of others goes (those the stream holds were only extended).
		if err := poolsDiffer(req, lua.DecodePools(lua.ParseRecord(got.Record).Pools), held); err != nil {
			// What this acquire took goes: the memberships, and its share of
			// the slot it extended (the stream's other requests keep theirs).
			l.undo(ctx, end, takenOf(tries, poolMember(req.UserID, req.StreamID), generated), true,
				userSlot{share: got.Share(), back: got.Extension(), whole: generated}.member(key, req.StreamID))
			return AcquireResult{StreamID: req.StreamID, Limit: tier.MaxConcurrentStreams, Tier: tier}, tier, err
		}
		l.heldPlan(got.Record, tier, &res)
	}
	res.Granted = got.Granted
	res.Used = got.Used
	if got.Override >= 0 {
		res.Limit, res.Overridden = got.Override, true
	}
	res.Pruned = got.Pruned
	if got.Granted {
		res.ExpiresAt = msTime(got.ExpiresAtMs)
		res.Extended = got.Extended
		if got.WouldRefuse {
			res.WouldRefuse = CodeStreamLimitReached
		}
		slot := userSlot{added: !got.Extended, share: got.Share(), back: got.Extension(), whole: generated}
		if err := l.confirmGrant(ctx, replicas, tier, slot.member(key, req.StreamID), &res); err != nil {
			undoTries()
			return res, tier, err
		}
		err := l.grantPools(ctx, end, waitUntil, req, poolTier(res.Tier, tier), ms, slot, tries, &res)
		return res, tier, err
	}
	undoTries()
	if len(ms) > 0 {
		l.atLimit.mark(req.UserID, time.Now())
	}
	res.RetryAfter = time.Duration(got.RetryAfterMs) * time.Millisecond
	res.Owed = got.Owed
	if wait > 0 && res.Limit > 0 {
		if req.OnWait != nil {
			req.OnWait(wait)
		}
		var slot userSlot
		req.waiting(true)
		res, slot, err = l.await(ctx, key, req, tier, wait, res, generated, lua.EncodePools(held))
		req.waiting(false)
		switch {
		case err == nil && res.Granted && !res.Degraded:
			// The pools as they are now, not as they were before the wait.
			err = l.grantPools(ctx, l.decisionEnd(), waitUntil, req, poolTier(res.Tier, tier), l.current(ms), slot, nil, &res)
		case err == nil && res.Granted:
			// Redis stopped answering the wait, and the plan fails open:
			// the pools' own failure modes decide, as for an acquire that
			// did not wait.
			if err = l.degradedPools(ctx, l.current(ms), fmt.Errorf("its wait unanswered: %w", ErrUnavailable), &res); err != nil {
				res = AcquireResult{StreamID: req.StreamID, Limit: tier.MaxConcurrentStreams, Tier: tier}
				if generated {
					l.releaseUnanswered(ctx, req.UserID, req.StreamID) // the wait's grant may have landed
				}
			}
		}
	}
	return res, tier, err
}

// degradedPools answers the pools ms of an acquire granted degraded (its
// user's slot unanswered, err, on a plan that fails open): counted
// nowhere, nor can its memberships be, since without the user's slot no
// record names them for heartbeats to keep and a release to drop. Each
// pool's failureMode decides, as when its own key's shard fails: one that
// fails closed refuses the stream (a *PoolUnavailableError) rather than
// let it in uncounted; the others are granted degraded, in res.
func (l *Limiter) degradedPools(ctx context.Context, ms []membership, err error, res *AcquireResult) error {
	if err := l.goneFrom(ms); err != nil {
		return err
	}
	for _, m := range ms {
		if m.pool.OutageMode() == tiers.FailClosed {
			l.observer.Joined(ctx, m.pool.Pool, JoinUnavailable, 0, m.limit)
			return &PoolUnavailableError{Pool: m.pool.Pool, Key: m.key, Err: fmt.Errorf("the user's slot: %w", err)}
		}
	}
	for _, m := range ms {
		l.observer.Joined(ctx, m.pool.Pool, JoinDegraded, 0, m.limit)
		res.Pools = append(res.Pools, PoolGrant{Pool: m.pool.Pool, Key: m.key, Limit: m.limit, Degraded: true}.judged(m.uncapped))
	}
	return nil
}

// poolTier is the tier a granted acquire joins its pools by: the
// stream's, answered (the held plan's for an extension, see heldPlan:
// its TTL, heartbeat interval and priority), with the request's own wait
// budget (its plan's MaxWait caps wait_ms across the user's queue and
// every pool's).
func poolTier(answered, requested tiers.Tier) tiers.Tier {
	answered.MaxWait = requested.MaxWait
	return answered
}

// poolsDiffer is the refusal of an extension of req's held stream whose
// record names other pool keys (recorded) than req does: an extension
// joins no pool key the stream does not hold. held are the keys req names
// that are capped now, those it joins: each must be recorded. Each
// recorded key must be named by req, capped now or not: a key whose cap
// was lifted since the stream joined it keeps its membership (limits are
// applied at acquire time), and a retry of the very acquire that took the
// stream is its extension. nil when they are the same.
func poolsDiffer(req AcquireRequest, recorded, held []lua.PoolKey) error {
	same := true
	for _, p := range held {
		same = same && slices.Contains(recorded, p)
	}
	for _, p := range recorded {
		same = same && req.Pools[p.Pool] == p.Key
	}
	if same {
		return nil
	}
	named := make([]lua.PoolKey, 0, len(req.Pools))
	for pool, key := range req.Pools {
		named = append(named, lua.PoolKey{Pool: pool, Key: key})
	}
	slices.SortFunc(named, func(a, b lua.PoolKey) int { return strings.Compare(a.Pool, b.Pool) })
	return fmt.Errorf("%w: stream %q of user %q holds %s, and this acquire names %s; "+
		"an acquire of a held stream extends it, naming the pools it holds (release it to take another)",
		ErrPoolsDiffer, req.StreamID, req.UserID, poolsOf(recorded), poolsOf(named))
}

// heldPlan answers, in res, an extension of a held stream whose record
// is record by the slot as it is kept. The plan it was taken under, when
// that is another than tier's (a retry naming another plan, its user's
// plan changed meanwhile, is not told a limit the slot was not judged
// by), in force or since removed. And the TTL its record keeps, which
// the extension leaves as it is and the slot's heartbeats go by whatever
// its plan says now (DESIGN §15), with a heartbeat interval within a
// third of it: a caller heartbeating as told keeps the slot.
func (l *Limiter) heldPlan(record string, tier tiers.Tier, res *AcquireResult) {
	kept := lua.ParseRecord(record)
	if kept.Plan != "" && kept.Plan != tier.Plan {
		if t, ok := l.tiers.LookupHeld(kept.Plan); ok {
			res.Limit, res.Tier = t.MaxConcurrentStreams, t
		}
	}
	if kept.TTL > 0 && kept.TTL != res.Tier.SlotTTL {
		res.Tier.SlotTTL = kept.TTL
		res.Tier.HeartbeatInterval = min(res.Tier.HeartbeatInterval, kept.TTL/3)
	}
}

// grantPools joins the pool keys ms of a stream whose user's slot res
// grants (added: this acquire took it), by end, with the answers of the
// scripts already sent for them when tries holds them (see joinPools),
// and turns res into the
// pool's refusal when one refuses. A membership granted degraded makes
// the grant degraded.
func (l *Limiter) grantPools(ctx context.Context, end, waitUntil time.Time, req AcquireRequest, tier tiers.Tier, ms []membership, slot userSlot, tries []poolTry, res *AcquireResult) error {
	if len(ms) == 0 {
		return nil
	}
	j, err := l.joinPools(ctx, end, waitUntil, req, tier, ms, slot, tries)
	res.Waited += j.waited
	if err == nil && j.refusal == nil && j.waited > 0 {
		err = l.heldAfterWaiting(ctx, req, slot, j)
	}
	if err != nil {
		res.Granted, res.ExpiresAt, res.WouldRefuse = false, time.Time{}, ""
		return err
	}
	if r := j.refusal; r != nil {
		r.Waited = j.waited
		res.Granted, res.ExpiresAt, res.RefusedBy, res.RetryAfter, res.QueueFull = false, time.Time{}, r, r.RetryAfter, j.full
		res.WouldRefuse = "" // said of grants only
		if slot.added {
			res.Used-- // the undo left it: the last share, unless a retry shares it
		}
		return nil
	}
	res.Pools = j.grants
	for _, g := range j.grants {
		res.Degraded = res.Degraded || g.Degraded
	}
	if j.shadow != nil && res.WouldRefuse == "" {
		res.WouldRefuse, res.WouldRefuseBy = CodePoolLimitReached, j.shadow
	}
	return nil
}

// heldAfterWaiting checks, for an acquire that waited for a place in a
// pool key and joined j, that the stream still holds its user's slot, the
// one it took or extended (slot). A stream released meanwhile (by its
// holder, or by support's release of all its user's slots) is gone, and
// its release dropped the memberships its record names before the wait
// took its place: the wait must not leave a membership that nothing
// heartbeats or releases. So is one whose id was taken again since, by
// another caller or by its own, as another stream (DESIGN §19: nor is
// another caller's slot this acquire's to answer). It gives back its own
// part of each membership it took, as a refused acquire's undo does: a
// membership is the user's and the stream id's, and the stream now under
// the id may hold a part of it too, which stays. It answers ErrSlotLost.
// When Redis does not answer the look, the grant stands: its memberships
// expire by their own score if the slot went.
func (l *Limiter) heldAfterWaiting(ctx context.Context, req AcquireRequest, slot userSlot, j joined) error {
	key, err := l.keys.UserKey(req.UserID)
	if err != nil {
		return err
	}
	// Held while its user's key has it: the score is a Redis time, which
	// this host's clock, off Redis's by some skew, cannot judge (DESIGN
	// §2). The wait kept the slot alive; one that lapsed all the same is
	// found lost by its next heartbeat.
	held, retaken := true, ""
	lookErr := l.doBy(ctx, l.decisionEnd(), "wait_check", func(ctx context.Context, c rueidis.Client) error {
		resps := c.DoMulti(ctx, c.B().Zscore().Key(key).Member(req.StreamID).Build(),
			c.B().Hget().Key(keys.SlotRecords(key)).Field(req.StreamID).Build())
		if err := resps[0].Error(); rueidis.IsRedisNil(err) {
			held = false
			return nil
		} else if err != nil {
			return err
		}
		s, err := resps[1].ToString()
		if rueidis.IsRedisNil(err) {
			return nil // no record: a slot of a version that kept none, taken by no one since
		}
		if err != nil {
			return err
		}
		rec := lua.ParseRecord(s)
		switch {
		case req.Caller != "" && rec.Caller != "" && rec.Caller != req.Caller: // as the scripts' foreign: a call naming none is no one's other
			retaken = fmt.Sprintf("caller %q", rec.Caller)
		case slot.share.StartedAtMs > 0 && rec.StartedAtMs > 0 && rec.StartedAtMs != slot.share.StartedAtMs:
			retaken = "another acquire"
		}
		held = retaken == ""
		return nil
	})
	if lookErr != nil || held {
		return nil
	}
	l.undo(ctx, l.decisionEnd(), ours(j.taken, j.shared), false, lua.Member{})
	var waited []lua.PoolKey
	for _, g := range j.grants {
		if !g.Degraded {
			waited = append(waited, lua.PoolKey{Pool: g.Pool, Key: g.Key})
		}
	}
	if retaken != "" {
		return fmt.Errorf("%w: stream %q was released while it waited for a place in %s, and its id taken since by %s; it holds none",
			ErrSlotLost, req.StreamID, poolsOf(waited), retaken)
	}
	return fmt.Errorf("%w: stream %q was released while it waited for a place in %s; it holds none",
		ErrSlotLost, req.StreamID, poolsOf(waited))
}

// releaseUnanswered releases a slot that an acquire may have taken without
// its answer reaching anyone (the call timed out, its connection dropped,
// its caller left): the stream id was made here, so no one else could
// ever release it, and it would count against the user for a whole TTL.
// It runs beside the answer, which must not wait for it (every decision
// within the per-call deadline), and ends within two per-call deadlines:
// it releases at once, and once more a deadline later, after a retry of
// the acquire that was already on its way to Redis (the client retries a
// call whose reply was lost) has run. When Redis does not answer either,
// the slot expires by itself.
func (l *Limiter) releaseUnanswered(ctx context.Context, userID, streamID string) {
	ctx = context.WithoutCancel(ctx)
	later := time.Second
	if l.redis != nil {
		later = l.redis.Timeout()
	}
	go func() {
		_, _ = l.release(ctx, "", userID, streamID)
		time.Sleep(later)
		_, _ = l.release(ctx, "", userID, streamID)
	}()
}

// notHolder is the ErrNotSlotHolder of an acquire the script refused as
// another caller's (got.NotHolder) on the user's key (pool "") or on a
// pool key (pool "<pool>=<key>"): its stream held under another caller,
// or, held by none, waiting in the queue under another caller.
func notHolder(got lua.Acquired, streamID, userID, pool string) error {
	switch {
	case got.Waiting && pool != "":
		return fmt.Errorf("%w: stream %q of user %q waits in the queue of pool %s under another caller", ErrNotSlotHolder, streamID, userID, pool)
	case got.Waiting:
		return fmt.Errorf("%w: stream %q of user %q waits in the queue under another caller", ErrNotSlotHolder, streamID, userID)
	case pool != "":
		return fmt.Errorf("%w: stream %q of user %q, a member of pool %s", ErrNotSlotHolder, streamID, userID, pool)
	}
	return fmt.Errorf("%w: stream %q of user %q", ErrNotSlotHolder, streamID, userID)
}
