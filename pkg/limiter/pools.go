package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// Pools (DESIGN §16). A pool key's slots are the same thing as a user's:
// a sorted set of expiring members with records, an override and a
// queue, under the key's own hash tag, run by the same scripts. An
// acquire that names pools asks for the user's slot and a membership of
// each capped pool key at once, each by one script on one key, so that
// pools cost no round trip of their own; it decides in order, the user's
// slot first, then the pools by name. A refusal removes what the acquire
// took before it answers, and a crash between steps leaves slots and
// memberships that expire by their own score. Heartbeat and release take
// the stream's memberships from its slot's record.

// MaxPools bounds the pools one acquire may name.
const MaxPools = 4

var (
	// ErrUnknownPool: an acquire names a pool the pool table does not
	// hold.
	ErrUnknownPool = errors.New("unknown pool")
	// ErrInvalidPoolKey: an acquire names a pool key outside 1-128 bytes
	// of [A-Za-z0-9._:/@-], or more than MaxPools pools.
	ErrInvalidPoolKey = keys.ErrInvalidPoolKey
	// ErrPoolsDiffer: an acquire of a held stream (an extension) names
	// other capped pool keys than the stream holds. A stream's
	// memberships are fixed when it is taken: its slot's record names
	// them, and heartbeat and release cover those.
	ErrPoolsDiffer = errors.New("a held stream's pools differ")
)

// poolsOf says which pool keys held names, for a message: "model=gpt-4o,
// org=acme", or "no pool".
func poolsOf(held []lua.PoolKey) string {
	if len(held) == 0 {
		return "no pool"
	}
	return strings.ReplaceAll(lua.EncodePools(held), ",", ", ")
}

// PoolGrant is one pool key a granted stream holds a membership of.
type PoolGrant struct {
	Pool, Key string
	// Used is the key's live memberships after the call (0 when degraded:
	// unknown); Limit the cap it was judged by, its override's when one
	// is in force (Overridden).
	Used, Limit int
	Overridden  bool
	// Degraded: the key's shard did not answer and the pool fails open,
	// so the membership was granted without being counted.
	Degraded bool
	// WouldRefuse: the key held its cap and the pool is in shadow mode
	// (enforce: false): the membership was granted all the same, and Used
	// counts it, above Limit. Of a membership the stream held before the
	// acquire (an extension), the verdict on the acquire that took it, as
	// its record keeps it.
	WouldRefuse bool
	// Uncapped: the key's cap was lifted while the acquire waited. It is
	// joined all the same, refusing no one (the stream's record names it,
	// and heartbeats keep what it names), judged by no cap: Limit is 0.
	// An answer to the caller lists it no more than a new acquire's grant,
	// which joins no uncapped key.
	Uncapped bool
}

// judged marks g a grant of a key no longer capped, when uncapped (see
// PoolGrant.Uncapped).
func (g PoolGrant) judged(uncapped bool) PoolGrant {
	if uncapped {
		g.Limit, g.Overridden, g.WouldRefuse, g.Uncapped = 0, false, false, true
	}
	return g
}

// PoolRefusal says which pool key refused an acquire, and why.
type PoolRefusal struct {
	Pool, Key   string
	Used, Limit int
	// Overridden: Limit is a support override of the key's cap.
	Overridden bool
	// RetryAfter is how long until a membership of the key frees up.
	RetryAfter time.Duration
	// Owed, when the key had places free (Used below Limit), is how many
	// acquires waiting in the key's queue they are owed to, which refused
	// this one; 0 else, and after a wait of its own ran out.
	Owed int
	// Waited is how long the acquire waited in the key's queue: the part
	// of AcquireResult.Waited after its wait for the user's own slot.
	Waited time.Duration
}

// membership is one capped pool key an acquire joins.
type membership struct {
	pool  pools.Pool
	key   string
	limit int
	slots string // the key's sorted set
	// uncapped: the key's cap was lifted while the acquire waited (see
	// current). It is joined all the same, refusing no one, as its own
	// waiters are served: the stream's record names it, and heartbeats
	// keep what it names.
	uncapped bool
	// gone: the pool was removed while the acquire waited (see
	// current): the acquire is answered ErrUnknownPool, as a new one is.
	gone bool
}

// memberships resolves the pools an acquire names to the capped keys it
// joins, in the order of the pools' names. A key with no cap is joined by
// nothing.
func (l *Limiter) memberships(named map[string]string) ([]membership, error) {
	if len(named) == 0 {
		return nil, nil
	}
	if len(named) > MaxPools {
		return nil, fmt.Errorf("%w: %d pools named, the limit is %d", ErrInvalidPoolKey, len(named), MaxPools)
	}
	var buf [MaxPools]string
	names := buf[:0]
	for name := range named {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]membership, 0, len(names))
	for _, name := range names {
		pool, ok := l.pools.Lookup(name)
		if !ok {
			return nil, l.unknownPool(name)
		}
		key := named[name]
		slots, err := l.keys.PoolKey(name, key)
		if err != nil {
			return nil, err
		}
		if limit, capped := pool.Limit(key); capped {
			out = append(out, membership{pool: pool, key: key, limit: limit, slots: slots})
		}
	}
	return out, nil
}

// current returns ms as the pool table has them now, for an acquire that
// waited since it resolved them (in its user's queue, or a pool key's):
// each pool's definition (enforce, maxWait, failureMode) and its key's
// cap, as a new acquire would be judged. A key no longer capped refuses
// no one, as it would not a new acquire; it is joined all the same
// (uncapped), since the stream's record names it. A pool since removed
// is gone: the acquire is refused as unknown, as a new one would be.
func (l *Limiter) current(ms []membership) []membership {
	out := slices.Clone(ms)
	for i, m := range out {
		pool, ok := l.pools.Lookup(m.pool.Pool)
		if !ok {
			out[i].gone = true
			continue
		}
		if limit, capped := pool.Limit(m.key); capped {
			out[i].pool, out[i].limit, out[i].uncapped = pool, limit, false
		} else {
			out[i].pool, out[i].uncapped = pool, true
		}
	}
	return out
}

// goneFrom is ErrUnknownPool for the first of ms whose pool was removed
// (see current), nil when there is none.
func (l *Limiter) goneFrom(ms []membership) error {
	for _, m := range ms {
		if m.gone {
			return l.unknownPool(m.pool.Pool)
		}
	}
	return nil
}

// unknownPool is ErrUnknownPool for the pool name, which is not in
// force, naming those that are.
func (l *Limiter) unknownPool(name string) error {
	var known []string
	for _, p := range l.pools.List() {
		known = append(known, p.Pool)
	}
	if len(known) == 0 {
		return fmt.Errorf("%w: %q is not a pool: none is configured (pools.static, or LimitPool resources)", ErrUnknownPool, name)
	}
	return fmt.Errorf("%w: %q is not one of the pools configured (%s)", ErrUnknownPool, name, strings.Join(known, ", "))
}

// poolMember is a stream's member in a pool key's sorted set: the stream
// id and its user's id, so that two users' streams under one stream id
// are two members (neither id holds a space).
func poolMember(userID, streamID string) string { return streamID + " " + userID }

// joined is what joinPools did.
type joined struct {
	grants  []PoolGrant
	refusal *PoolRefusal
	// shadow is the first pool key in shadow mode that would have refused
	// the stream, which joined it all the same.
	shadow *PoolRefusal
	// waited is how long the acquire waited in pool keys' queues.
	waited time.Duration
	// full: the refusing key's queue held its most waiters, and the
	// acquire did not wait.
	full bool
	// taken and shared are the memberships the acquire took, and those a
	// wait granted to several of the stream's requests on this replica
	// (see ours): what it gives back if it answers without them after all
	// (heldAfterWaiting).
	taken  []lua.Member
	shared map[string]*atomic.Int32
}

// joinPools takes a membership of each of ms for the stream req names, in
// order, each decided by end. A full key's queue is waited in until
// waitUntil at the most (see poolWait), and the next step is decided by
// a new end. A refusal, or an outage of a pool that fails closed, removes
// the memberships this call added and the user's slot (see own, below),
// before it answers (see undo).
//
// tries, when not nil, are the answers of the scripts already sent for
// ms, all at once beside the user's (tryPools). At the first key that
// refuses or fails, the later keys they took are left before anything
// else, so that an acquire waiting in a key's queue holds only the keys
// before it, as one joining them in turn would; the keys after it are
// then asked for in turn.
func (l *Limiter) joinPools(ctx context.Context, end, waitUntil time.Time, req AcquireRequest, tier tiers.Tier, ms []membership, slot userSlot, tries []poolTry) (joined, error) {
	member := poolMember(req.UserID, req.StreamID)
	out := joined{grants: make([]PoolGrant, 0, len(ms))}
	taken := make([]lua.Member, 0, len(ms)) // this call's shares of the memberships it holds
	var shared map[string]*atomic.Int32     // of taken, those a wait granted to others too
	holding := make([]string, 0, len(ms))   // the pool keys held so far, added or extended
	// The user's slot, as this acquire holds it. A refusal, an outage of
	// a pool failing closed, or a wait that ends without a place leaves
	// the acquire's share of it (lua.Member.Owned), as it leaves its
	// shares of the memberships: what it took goes, unless another
	// request of the stream (a retry, or the running grant it extended)
	// holds a share too.
	var own lua.Member
	if key, err := l.keys.UserKey(req.UserID); err == nil {
		own = slot.member(key, req.StreamID)
	}
	if err := l.goneFrom(ms); err != nil {
		l.undo(ctx, end, nil, slot.owns(), own)
		return joined{}, err
	}
	for i := 0; i < len(ms); i++ {
		m := ms[i] // as current last resolved it
		var got lua.Acquired
		var err error
		if tries != nil {
			got, err = tries[i].got, tries[i].err
			if stops := err != nil && !degrade(m.pool.OutageMode(), err) || err == nil && !got.Granted; stops {
				l.leaveLater(ctx, l.leaveAll(ctx, end, takenOf(tries[i+1:], member, slot.whole)))
				tries = nil
			}
		} else {
			got, err = l.joinPool(ctx, end, req, tier, m)
		}
		if err == nil && len(got.Wake) > 0 {
			l.wake(ctx, m.slots, got.Wake...) // members expired: those owed their places look
		}
		if err == nil && got.Pruned > 0 {
			l.observer.PoolReclaimed(ctx, m.pool.Pool, got.Pruned)
		}
		switch {
		case err != nil && degrade(m.pool.OutageMode(), err):
			l.warnDegraded(ctx, "redis unavailable; granting a pool's membership degraded (failureMode Open)", "pool", m.pool.Pool, "err", err)
			l.observer.Joined(ctx, m.pool.Pool, JoinDegraded, 0, m.limit)
			out.grants = append(out.grants, PoolGrant{Pool: m.pool.Pool, Key: m.key, Limit: m.limit, Degraded: true}.judged(m.uncapped))
			continue
		case err != nil:
			if errors.Is(err, ErrUnavailable) { // not the caller leaving, nor a refusing Redis
				l.observer.Joined(ctx, m.pool.Pool, JoinUnavailable, 0, m.limit)
			}
			l.undo(ctx, end, ours(taken, shared), slot.owns(), own)
			if errors.Is(err, ErrUnavailable) {
				return joined{}, &PoolUnavailableError{Pool: m.pool.Pool, Key: m.key, Err: err}
			}
			return joined{}, fmt.Errorf("pool %s=%s: %w", m.pool.Pool, m.key, err)
		}
		if got.NotHolder {
			// The key holds the stream as another caller's (a membership its
			// slot left behind, which expires by its score), or its queue
			// does: not this call's to extend or take, and no sign that the
			// key is full.
			l.undo(ctx, end, ours(taken, shared), slot.owns(), own)
			return joined{}, notHolder(got, req.StreamID, req.UserID, m.pool.Pool+"="+m.key)
		}
		limit := m.limit
		if got.Override >= 0 {
			limit = got.Override
		}
		if !got.Granted {
			refusal := &PoolRefusal{Pool: m.pool.Pool, Key: m.key, Used: got.Used, Limit: limit, Overridden: got.Override >= 0,
				RetryAfter: time.Duration(got.RetryAfterMs) * time.Millisecond, Owed: got.Owed}
			// A key capped at 0 admits no one, however long one waits.
			if wait := poolWait(waitUntil, tier, m.pool); wait > 0 && limit > 0 {
				w := l.awaitPool(ctx, req, tier, m, wait, time.Until(waitUntil), holding)
				out.waited += w.waited
				end = l.decisionEnd() // the next step is a decision of its own
				ms = l.current(ms)    // and of the pools as they are now
				if w.unsure || w.grant != nil {
					holding = append(holding, m.slots)
				}
				if left := leaving(m.slots, member, w.share, lua.Extension{}, slot.whole); left.Key != "" && (w.unsure || w.grant != nil) {
					// The undo's to leave, whatever happens next.
					taken = append(taken, left)
					if w.holders != nil {
						if shared == nil {
							shared = map[string]*atomic.Int32{}
						}
						shared[m.slots] = w.holders
					}
				}
				if err := l.goneFrom(ms); err != nil {
					// A pool removed as it waited: refused as a new acquire
					// naming it is, and what it was granted meanwhile, this
					// key's place too, is given back.
					l.undo(ctx, end, ours(taken, shared), slot.owns(), own)
					return joined{waited: out.waited}, err
				}
				switch {
				case w.grant != nil && w.err == nil:
					g := *w.grant
					l.observer.Joined(ctx, m.pool.Pool, out.outcome(g, w.extended), g.Used, g.Limit)
					out.grants = append(out.grants, g)
					continue
				case w.err != nil:
					l.undo(ctx, end, ours(taken, shared), slot.owns(), own)
					return joined{waited: out.waited}, fmt.Errorf("pool %s=%s: %w", m.pool.Pool, m.key, w.err)
				}
				if !m.uncapped && ms[i].uncapped {
					// Its wait ran out as the key's cap was lifted: no cap
					// refuses it now, as none would a new acquire. It joins
					// the key again, uncapped, as a key lifted before its
					// turn is joined.
					i--
					continue
				}
				refusal, out.full = w.refusal, w.full
			}
			l.observer.Joined(ctx, m.pool.Pool, JoinLimited, refusal.Used, refusal.Limit)
			l.undo(ctx, end, ours(taken, shared), slot.owns(), own)
			return joined{refusal: refusal, waited: out.waited, full: out.full}, nil
		}
		if left := leaving(m.slots, member, got.Share(), got.Extension(), slot.whole); left.Key != "" {
			taken = append(taken, left)
		}
		holding = append(holding, m.slots)
		g := PoolGrant{Pool: m.pool.Pool, Key: m.key, Used: got.Used, Limit: limit, Overridden: got.Override >= 0, WouldRefuse: got.WouldRefuse}.judged(m.uncapped)
		l.observer.Joined(ctx, m.pool.Pool, out.outcome(g, got.Extended), got.Used, g.Limit)
		out.grants = append(out.grants, g)
	}
	out.taken, out.shared = taken, shared
	return out, nil
}

// outcome is how g joined its key: granted, or let in over its cap by
// shadow mode, which the first such key then says of the acquire. A
// membership extended (held before the call) is granted, whatever its
// cap: the verdict its record keeps (g.WouldRefuse) is said again, and
// was counted when the stream joined.
func (j *joined) outcome(g PoolGrant, extended bool) JoinOutcome {
	if !g.WouldRefuse {
		return JoinGranted
	}
	if j.shadow == nil {
		j.shadow = &PoolRefusal{Pool: g.Pool, Key: g.Key, Used: g.Used, Limit: g.Limit}
	}
	if extended {
		return JoinGranted
	}
	return JoinShadowRefused
}

// joinPool asks for a membership of m's key for the stream req names, by
// end: one script call.
func (l *Limiter) joinPool(ctx context.Context, end time.Time, req AcquireRequest, tier tiers.Tier, m membership) (got lua.Acquired, err error) {
	err = l.doBy(ctx, end, "acquire_pool", func(ctx context.Context, c rueidis.Client) (err error) {
		got, err = lua.AcquireWith(ctx, c, l.joinArgs(req, tier, m))
		return err
	})
	return got, err
}

// joinArgs are the acquire of a membership of m's key for the stream req
// names.
func (l *Limiter) joinArgs(req AcquireRequest, tier tiers.Tier, m membership) lua.AcquireArgs {
	limit := m.limit
	if m.uncapped {
		limit = unbounded
	}
	return lua.AcquireArgs{Key: m.slots, StreamID: poolMember(req.UserID, req.StreamID), Limit: limit, TTL: tier.SlotTTL,
		Rec: lua.Record{Caller: req.Caller, Plan: tier.Plan, User: req.UserID, Label: req.Label, Token: req.token}, Shadow: !m.pool.Enforced()}
}

// userSlot is the user's slot of a pooled acquire: the acquire's share
// of it, which it leaves if it gives up (lua.Member.Owned).
type userSlot struct {
	// added: the acquire took the slot rather than extending it.
	added bool
	share lua.Share
	// back: how the acquire moved the slot's expiry, if it extended it,
	// which it gives back if it gives up.
	back lua.Extension
	// whole: the slot is this acquire's alone, whatever its shares say:
	// its stream id was made for it, and a share of its own counted twice
	// (a reply lost and the call asked again) is still its own.
	whole bool
	// shared counts the requests of the stream on this replica that a
	// wait granted the slot to at once, one share for them all: only the
	// last of them to give up leaves it.
	shared *atomic.Int32
}

// owns reports whether an acquire that gives up leaves its share of the
// slot: the last of those sharing it on this replica to go. Asked once,
// as it gives up.
func (s userSlot) owns() bool {
	return s.shared == nil || s.shared.Add(-1) == 0
}

// member is the release of the slot (key's stream id) the acquire sends
// if it gives up (see leaving).
func (s userSlot) member(key, streamID string) lua.Member {
	return leaving(key, streamID, s.share, s.back, s.whole)
}

// leaving is the release a request that gives up sends for its part of
// key's member id: its share (lua.Member.Owned), with the time its
// extension added (back), or the whole member when whole (a stream id
// made for the request: no one else holds it). A share
// whose slot's start is not known (a grant whose answer was lost, or one
// granted degraded, with nothing in Redis) may be another request's: the
// zero Member then, which leaves nothing; a place the request did take
// expires by its score.
func leaving(key, id string, share lua.Share, back lua.Extension, whole bool) lua.Member {
	switch {
	case whole:
		return lua.Member{Key: key, ID: id}
	case share.StartedAtMs > 0:
		return lua.Member{Key: key, ID: id, Owned: true, Share: share, Back: back}
	}
	return lua.Member{}
}

// ours returns the memberships of taken that an acquire that gives up
// removes: all but those a wait granted to several requests of the
// stream on this replica at once (shared, by key: their count), which the
// last of them to go removes. Asked once, as it gives up.
func ours(taken []lua.Member, shared map[string]*atomic.Int32) []lua.Member {
	var out []lua.Member
	for _, m := range taken {
		if n := shared[m.Key]; n == nil || n.Add(-1) == 0 {
			out = append(out, m)
		}
	}
	return out
}

// poolTry is the answer of a pool key's script sent beside the user's.
type poolTry struct {
	slots string
	got   lua.Acquired
	err   error
}

// tryPools sends the script of each of ms at once, by end, in the
// background, each on a goroutine of its own: for an acquire whose
// user's call a WAIT follows (see acquire). Their answers are in the
// slice it returns, one for each of ms, once wait returns.
func (l *Limiter) tryPools(ctx context.Context, end time.Time, req AcquireRequest, tier tiers.Tier, ms []membership) (tries []poolTry, wait func()) {
	tries = make([]poolTry, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		tries[i].slots = m.slots
		wg.Go(func() { tries[i].got, tries[i].err = l.joinPool(ctx, end, req, tier, m) })
	}
	return tries, wg.Wait
}

// acquireTogether runs the user's acquire and the memberships of ms in
// one pipeline per node on c (see acquire), and returns the user's answer and
// error, and the memberships' as tryPools would. A script whose
// connection failed, the reply lost, is asked again alone, as a call of
// its own would be (see deadlineClient): the acquire is idempotent on
// the stream id.
func (l *Limiter) acquireTogether(ctx context.Context, c rueidis.Client, user lua.AcquireArgs, req AcquireRequest, tier tiers.Tier, ms []membership) (lua.Acquired, []poolTry, error) {
	acqs := make([]lua.AcquireArgs, 1, 1+len(ms))
	acqs[0] = user
	for _, m := range ms {
		acqs = append(acqs, l.joinArgs(req, tier, m))
	}
	start := time.Now()
	gots, errs := lua.AcquireAll(ctx, c, acqs, l.redis.NodeOf)
	took := time.Since(start)
	for i, err := range errs {
		if _, replied := rueidis.IsRedisErr(err); err != nil && !replied && ctx.Err() == nil {
			gots[i], errs[i] = lua.AcquireWith(ctx, c, acqs[i])
		}
	}
	tries := make([]poolTry, len(ms))
	for i, m := range ms {
		l.observer.RedisCall(ctx, "acquire_pool", took, errs[i+1])
		tries[i] = poolTry{slots: m.slots, got: gots[i+1], err: classify(callerOf(ctx), "acquire_pool", errs[i+1])}
	}
	return gots[0], tries, errs[0]
}

// takenOf returns the shares of the memberships (member of their keys)
// tries granted, added or extended: what undoing them leaves. whole: the
// stream id was made for the acquire, and what they hold is its alone.
func takenOf(tries []poolTry, member string, whole bool) []lua.Member {
	var out []lua.Member
	for _, t := range tries {
		if left := leaving(t.slots, member, t.got.Share(), t.got.Extension(), whole); t.err == nil && t.got.Granted && left.Key != "" {
			out = append(out, left)
		}
	}
	return out
}

// leaveAll removes members (of pool keys' sorted sets) at once, by end,
// and returns those whose removal Redis did not confirm. The removals go
// in one pipeline per node, as an acquire's scripts do (see
// acquireTogether): each answer is its own node's, so that one node's
// hang is its own keys' outage.
func (l *Limiter) leaveAll(ctx context.Context, end time.Time, members []lua.Member) []lua.Member {
	if len(members) == 0 {
		return nil
	}
	var left []lua.Member
	for i, err := range l.leaveMembers(ctx, end, members) {
		if err != nil {
			left = append(left, members[i])
		}
	}
	return left
}

// lateStep is how long past a decision's end a step may take that must
// follow one that took all of the decision's time, waiting for a hung
// node: the undo of a refused acquire, whose pool on a hung node refused
// it, and the memberships of a heartbeat whose users' call waited for a
// hung node that holds other streams' slots (see beatPools). Such a step
// is one round trip to the nodes that answer, and P4's bound (DESIGN
// §10) leaves 100ms past the per-call deadline.
const lateStep = 50 * time.Millisecond

// lateEnd is when a step that follows others in a decision ending at end
// ends: end, or lateStep from now when less of it is left, never more
// than lateStep past end.
func lateEnd(end time.Time) time.Time {
	least := time.Now().Add(lateStep)
	switch {
	case !least.After(end):
		return end
	case least.After(end.Add(lateStep)):
		return end.Add(lateStep)
	}
	return least
}

// undo removes what a refused acquire took: the memberships taken and,
// when drop says so, the user's slot, each only as the acquire left it
// (lua.Member.Owned). It does so before the answer, by end +
// lateStep; what Redis did not confirm removed by then is removed once
// more beside the answer, which does not wait for it, and otherwise
// expires by its own score.
func (l *Limiter) undo(ctx context.Context, end time.Time, taken []lua.Member, drop bool, slot lua.Member) {
	end = end.Add(lateStep)
	var left []lua.Member
	var wg sync.WaitGroup
	wg.Go(func() { left = l.leaveAll(ctx, end, taken) })
	drop = drop && slot.Key != "" && l.dropSlot(ctx, end, "release", slot) != nil // still to drop
	wg.Wait()
	if len(left) == 0 && !drop {
		return
	}
	l.leaveLater(ctx, left)
	if drop {
		go l.dropSlot(context.WithoutCancel(ctx), time.Time{}, "release", slot)
	}
}

// dropSlot removes m, a user's slot (or a pool key's member), by end, in
// a Redis call of op, and wakes the acquire its release lets in, if one
// waits. It leaves the stream's memberships alone: for a slot whose
// acquire is being undone.
func (l *Limiter) dropSlot(ctx context.Context, end time.Time, op string, m lua.Member) error {
	return l.doBy(ctx, end, op, func(ctx context.Context, c rueidis.Client) error {
		got, err := lua.ReleaseMember(ctx, c, "", m)
		if got.Head != "" {
			l.wake(ctx, m.Key, got.Head)
		}
		l.reclaimedAt(ctx, m.Key, got.Pruned)
		return err
	})
}

// reclaimedAt counts n members of key (a user's slots, or a pool key's)
// that a release found expired and removed: the leak signal, by pool for
// a pool key (the plan of a user's is not known here).
func (l *Limiter) reclaimedAt(ctx context.Context, key string, n int) {
	if n == 0 {
		return
	}
	if pool, ok := l.keys.PoolOf(key); ok {
		l.observer.PoolReclaimed(ctx, pool, n)
		return
	}
	l.observer.Reclaimed(ctx, "", n)
}

// leaveMembers removes each of members (a pool key's sorted set and a
// stream's member of it) in one pipeline per node (see lua.ReleaseAt),
// by end, wakes the acquire each key's removal lets in, if one waits,
// and returns each removal's error. A script whose connection failed,
// the reply lost, is asked again alone, as a call of its own would be: a
// release is idempotent.
func (l *Limiter) leaveMembers(ctx context.Context, end time.Time, members []lua.Member) []error {
	errs := make([]error, len(members))
	var got []lua.Released
	err := l.doBy(ctx, end, "release_pool", func(ctx context.Context, c rueidis.Client) error {
		got, errs = lua.ReleaseAt(ctx, c, "", members, l.redis.NodeOf)
		for i, err := range errs {
			if _, replied := rueidis.IsRedisErr(err); err != nil && !replied && ctx.Err() == nil {
				got[i], errs[i] = lua.ReleaseMember(ctx, c, "", members[i])
			}
		}
		return errors.Join(errs...)
	})
	if got == nil { // the call was not made
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for i, left := range got {
		if errs[i] == nil && left.Head != "" {
			l.wake(ctx, members[i].Key, left.Head)
		}
		if errs[i] == nil {
			l.reclaimedAt(ctx, members[i].Key, left.Pruned)
		}
	}
	return errs
}

// leaveLater removes members once more, beside an answer that does not
// wait for it: the memberships of released streams that Redis did not
// confirm removed by the decision's end. What fails again expires by its
// own score.
func (l *Limiter) leaveLater(ctx context.Context, members []lua.Member) {
	if len(members) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go l.leaveMembers(ctx, time.Time{}, members)
}

// leavePool removes member from the pool key whose sorted set is slots,
// by end, and wakes the acquire waiting for the key that its leaving lets
// in, if one waits.
func (l *Limiter) leavePool(ctx context.Context, end time.Time, slots, member string) error {
	return l.dropSlot(ctx, end, "release_pool", lua.Member{Key: slots, ID: member})
}

// heldMembers are the memberships of userID's stream streamID in the
// pool keys held, as its slot's record names them.
func (l *Limiter) heldMembers(userID, streamID string, held []lua.PoolKey) []lua.Member {
	var out []lua.Member
	member := poolMember(userID, streamID)
	for _, p := range held {
		if s, err := l.keys.PoolKey(p.Pool, p.Key); err == nil {
			out = append(out, lua.Member{Key: s, ID: member})
		}
	}
	return out
}

// dropLost removes the slots of the streams reqs[lost], which a lost
// membership ended, and their memberships pooled names, in one round trip
// per node, by end, the heartbeat's: what Redis did not confirm by then
// (a hung node's, or all of them when the memberships' step took all of
// the time) is asked again beside the answer (see leaveLater), which is
// slot_lost either way. Nobody's behalf: the heartbeat's caller holds
// them (the heartbeat script checked).
func (l *Limiter) dropLost(ctx context.Context, end time.Time, reqs []HeartbeatRequest, pooled [][]lua.PoolKey, lost []int) {
	if len(lost) == 0 {
		return
	}
	var members []lua.Member
	for _, i := range lost {
		if key, err := l.keys.HeldUserKey(reqs[i].UserID); err == nil { // held: what heartbeat takes
			members = append(members, lua.Member{Key: key, ID: reqs[i].StreamID})
		}
		members = append(members, l.heldMembers(reqs[i].UserID, reqs[i].StreamID, pooled[i])...)
	}
	l.leaveLater(ctx, l.leaveAll(ctx, end, members))
}

// poolBeat is one membership a heartbeat keeps alive: of reqs[at].
type poolBeat struct {
	at   int
	pool lua.PoolKey
}

// memberTTL is what keeps a stream's memberships alive: its slot's own
// TTL, as the slot's record holds it (own), so that the memberships' own
// records need not be read; else the plan's, a fallback for memberships
// without a record of their own TTL.
//
// unchecked: the user's slot did not answer (degraded), so no script
// checked who holds the stream: the memberships' own records give their
// TTL and are checked against the heartbeat's caller, and a lost one is
// not dropped beside the slot (see beatPools).
type memberTTL struct {
	ttl       time.Duration
	own       bool
	unchecked bool
}

// degradedTTL is the memberTTL of a stream whose heartbeat its user's
// slot did not answer, of tier.
func degradedTTL(tier tiers.Tier) memberTTL {
	return memberTTL{ttl: tier.SlotTTL, unchecked: true}
}

// membersTTL is the memberTTL of the stream whose slot beat kept alive,
// of tier.
func membersTTL(beat lua.Beat, tier tiers.Tier) memberTTL {
	if beat.TTL > 0 {
		return memberTTL{ttl: beat.TTL, own: true}
	}
	return memberTTL{ttl: tier.SlotTTL}
}

// beatPools keeps alive the memberships of the slots beats found alive,
// in one call per pool key and node, and turns the results of the slots
// whose membership is lost into ErrSlotLost naming the pool key, by end.
// Such a stream is over: its slot, just kept alive, and its other
// memberships are dropped too (dropLost), not left to hold the user's
// and the pools' places for a TTL: by the same end, the answer waiting
// for no second deadline (DESIGN §10 P4). A pool whose shard does not
// answer applies its failure mode: Open keeps the slot alive (degraded),
// Closed answers ErrUnavailable. A pool key Redis refuses the script of (one of
// another type) answers ErrRedisRefused, whatever the mode: no outage.
//
// The memberships are beaten by end, or, when the users' call left
// less, within lateStep of it (see lateEnd): a batch's call waits for
// every node, a hung one until end, and the streams whose slots did
// answer keep their memberships on the nodes that answer all the same
// (DESIGN §10: a hung node never stops heartbeats to slots on healthy
// nodes), not answered degraded, or unavailable, for a node that holds
// none of their scopes.
//
// A stream whose user's slot did not answer (ttls[i].unchecked: the
// heartbeat is degraded, and its pool keys are those this Limiter
// remembers) keeps its memberships all the same, on the shards that
// answer, for the caller their records name (ErrNotSlotHolder for
// another); one found lost ends it (ErrSlotLost), but is not dropped
// beside its slot: no script checked who holds that, and it frees
// itself by its TTL.
func (l *Limiter) beatPools(ctx context.Context, end time.Time, reqs []HeartbeatRequest, ttls []memberTTL, pooled [][]lua.PoolKey, results []HeartbeatResult, errs []error) {
	var beats []poolBeat
	var args []lua.HeartbeatArgs
	for i, held := range pooled {
		for _, p := range held {
			slots, err := l.keys.PoolKey(p.Pool, p.Key)
			if err != nil {
				continue
			}
			beats = append(beats, poolBeat{at: i, pool: p})
			arg := lua.HeartbeatArgs{Key: slots, StreamID: poolMember(reqs[i].UserID, reqs[i].StreamID), TTL: ttls[i].ttl, Own: ttls[i].own}
			if ttls[i].unchecked {
				arg.Caller = reqs[i].Caller
			}
			args = append(args, arg)
		}
	}
	if len(args) == 0 {
		return
	}
	end = lateEnd(end)
	var got []lua.Beat
	var gotErrs []error
	callErr := l.doBy(ctx, end, "heartbeat_pools", func(ctx context.Context, c rueidis.Client) error {
		got, gotErrs = lua.HeartbeatMulti(ctx, c, args, l.redis.NodeOf)
		return errors.Join(gotErrs...)
	})
	var lost []int // the requests whose stream a lost membership ended
	defer func() { l.dropLost(ctx, end, reqs, pooled, lost) }()
	for j, b := range beats {
		i := b.at
		err := callErr
		var beat lua.Beat
		if got != nil {
			beat, err = got[j], classify(ctx, "heartbeat_pools", gotErrs[j])
		}
		if err == nil && beat.Pruned > 0 {
			// Members expired: whoever waits for them looks. (Counted
			// whatever became of this stream: the call's pruning is of
			// its key, on its first member.)
			l.wake(ctx, args[j].Key)
			l.observer.PoolReclaimed(ctx, b.pool.Pool, beat.Pruned)
		}
		if errs[i] != nil || !results[i].Alive {
			continue // already lost or failed: one reason is enough
		}
		scope := b.pool.Pool + "=" + b.pool.Key
		switch {
		case err == nil && (beat.Alive || beat.NoTTL):
			// Alive; or held, with no TTL of its own (a stream's own
			// records always have one): left as it is.
		case err == nil && beat.NotHolder:
			// Another caller's stream (its user's slot did not answer,
			// so this is the first script to check): nothing changed.
			results[i].Alive, results[i].ExpiresAt, results[i].Degraded = false, time.Time{}, false
			errs[i] = fmt.Errorf("%w: stream %q of user %q, a member of pool %s", ErrNotSlotHolder, reqs[i].StreamID, reqs[i].UserID, scope)
		case err == nil:
			// Lost, whatever the user's slot answered (degraded: not
			// "assumed alive" any more).
			results[i].Alive, results[i].ExpiresAt, results[i].Degraded = false, time.Time{}, false
			errs[i] = fmt.Errorf("%w: stream %q: its membership of pool %s", ErrSlotLost, reqs[i].StreamID, scope)
			if !ttls[i].unchecked {
				lost = append(lost, i)
			}
		case degrade(l.poolOutageMode(b.pool.Pool), err):
			l.warnDegraded(ctx, "redis unavailable; pool membership answered degraded (failureMode Open)", "pool", b.pool.Pool, "err", err)
			results[i].Degraded = true
		default:
			// An outage of a pool failing closed (ErrUnavailable), a Redis
			// refusing the script (ErrRedisRefused: a misconfiguration,
			// not an outage, as an acquire joining the key answers) or the
			// caller gone: answered as it is.
			results[i].Alive, results[i].ExpiresAt, results[i].Degraded = false, time.Time{}, false
			if errors.Is(err, ErrUnavailable) { // named as an acquire joining the key names it
				errs[i] = &PoolUnavailableError{Pool: b.pool.Pool, Key: b.pool.Key, Err: err}
			} else {
				errs[i] = fmt.Errorf("pool %s: %w", scope, err)
			}
		}
	}
}

// poolOutageMode is the failure mode of the pool named pool when its key's
// shard does not answer a heartbeat: the pool's, or Open for a pool this
// replica never held, as for a plan (see heartbeatTarget).
func (l *Limiter) poolOutageMode(pool string) tiers.FailureMode {
	if p, ok := l.pools.LookupHeld(pool); ok {
		return p.OutageMode()
	}
	return tiers.FailOpen
}
