package limiter

import (
	"context"
	"fmt"
	"strings"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/pools"
)

// Who holds a pool key, and its overrides (DESIGN §16). A pool key's
// slots are a user's kind of scope: the slots script lists them and the
// override scripts set and remove its override, which the acquire script
// reads when a stream joins the key, as for a user.

// Holder is one live membership of a pool key: the user whose stream
// holds it, and the membership as a slot (its stream id, expiry and
// record: who took it, when, under which plan, for what).
type Holder struct {
	UserID string
	Slot
}

// Waiter is one acquire waiting in a pool key's queue: the user whose
// stream waits, and its ticket.
type Waiter struct {
	UserID string
	Ticket
}

// PoolKeySlots is one pool key's live memberships, earliest expiry first,
// its cap, the override of its cap in force, and the acquires waiting
// for it in the order they are served (by priority, then the user
// holding fewest, then the user waiting for fewest, then arrival).
type PoolKeySlots struct {
	Pool, Key string
	// Used counts the key's live memberships; Holders are the first
	// MaxListed of them to expire.
	Used int
	// Limit is the pool's cap of the key: its own, else the pool's
	// default. Capped is false when the pool caps neither (Limit 0): then
	// no stream joins the key and it has no holders.
	Limit  int
	Capped bool
	// Enforce is false when the pool is in shadow mode (enforce: false,
	// DESIGN §18): its caps refuse nothing, so Used may be above Limit.
	Enforce bool
	// Override is the key's support override in force, which replaces
	// Limit; nil when none.
	Override *Override
	Holders  []Holder
	Waiters  []Waiter
	// Deleted: the pool is no longer configured. Its holders run on by
	// its last definition, which Limit and Enforce give when this
	// replica saw it (one started since the pool was deleted knows none:
	// Capped false) until they end; no stream joins its keys.
	Deleted bool
}

// PoolSlots lists the holders of key of pool, its cap and override.
// Errors: ErrUnknownPool, ErrInvalidPoolKey, ErrUnavailable.
func (l *Limiter) PoolSlots(ctx context.Context, pool, key string) (PoolKeySlots, error) {
	ctx, span := l.startSpan(ctx, "limiter.pool_slots")
	out, err := l.poolSlots(ctx, pool, key)
	span.SetAttributes(attrUsed.Int(out.Used))
	endSpan(span, err)
	return out, err
}

func (l *Limiter) poolSlots(ctx context.Context, name, key string) (PoolKeySlots, error) {
	pool, _, scope, err := l.poolScope(name, key)
	if err != nil {
		return PoolKeySlots{}, err
	}
	listing, err := l.listing(ctx, scope.slots)
	if err != nil {
		return PoolKeySlots{}, err
	}
	// A pool not configured, under which the key holds nothing, is
	// unknown: a typo, most likely, or a deleted pool's key long empty.
	// Whether this replica saw the pool go does not matter, so that every
	// replica answers alike.
	_, configured := l.pools.Lookup(name)
	if !configured && listing.Used == 0 && len(listing.Queue) == 0 && listing.Override == nil {
		return PoolKeySlots{}, l.unknownPool(name)
	}
	out := PoolKeySlots{Pool: name, Key: key, Used: listing.Used, Holders: make([]Holder, len(listing.Slots)), Deleted: !configured}
	out.Limit, out.Capped = pool.Limit(key)
	out.Enforce = pool.Enforced()
	for i, s := range listing.Slots {
		// The member is poolMember's "<stream id> <user id>": a stream id
		// holds no space.
		stream, user, _ := strings.Cut(s.StreamID, " ")
		slot := slotOf(s, listing.NowMs)
		slot.StreamID = stream
		out.Holders[i] = Holder{UserID: user, Slot: slot}
	}
	if o := listing.Override; o != nil {
		out.Override = overrideOf(*o, listing.NowMs)
	}
	out.Waiters = make([]Waiter, len(listing.Queue))
	for i, t := range listing.Queue {
		ticket := ticketOf(t, i+1, listing.NowMs)
		ticket.StreamID, _, _ = strings.Cut(t.StreamID, " ")
		out.Waiters[i] = Waiter{UserID: t.Record.User, Ticket: ticket}
	}
	return out, nil
}

// SetPoolOverride replaces the cap of key of pool with req's limit until
// it expires, in place of any override before it: the next stream that
// joins the key is judged by it. Memberships already held are kept.
// Errors: ErrUnknownPool, ErrInvalidPoolKey, ErrInvalidOverride (also for
// a key the pool does not cap: no stream joins it, so none would read the
// override), then as SetOverride.
func (l *Limiter) SetPoolOverride(ctx context.Context, pool, key string, req OverrideRequest) (Override, error) {
	ctx, span := l.startSpan(ctx, "limiter.set_pool_override")
	out, err := l.setOverride(ctx, func() (overrideScope, error) { return l.cappedPoolScope(pool, key) }, req)
	endSpan(span, err)
	return out, err
}

// RemovePoolOverride ends the override of key of pool now; the pool's cap
// applies again from the next stream that joins the key. It reports
// whether one was in force. Errors: ErrUnknownPool, ErrInvalidPoolKey,
// then as RemoveOverride.
func (l *Limiter) RemovePoolOverride(ctx context.Context, pool, key string) (bool, error) {
	ctx, span := l.startSpan(ctx, "limiter.remove_pool_override")
	removed, err := l.removeOverride(ctx, func() (scope overrideScope, err error) {
		_, _, scope, err = l.poolScope(pool, key)
		return scope, err
	})
	if _, configured := l.pools.Lookup(pool); err == nil && !configured && !removed {
		err = l.unknownPool(pool) // no override under a pool not configured: a typo, most likely, as for PoolSlots
	}
	endSpan(span, err)
	return removed, err
}

// poolScope returns the pool named name and the override scope of its
// key: the pool in force or, for one since removed, its last definition,
// under which its keys' memberships are still held and beat, and which
// support must still see and whose overrides it must still be able to
// remove. A replica started since the pool was removed knows no
// definition of it: for a valid name, known is then false and the pool
// the zero Pool, which caps nothing, for a caller that finds something
// held under the name (see poolSlots). Errors: ErrUnknownPool (a name no
// pool can have), ErrInvalidPoolKey.
func (l *Limiter) poolScope(name, key string) (pool pools.Pool, known bool, scope overrideScope, err error) {
	pool, known = l.pools.LookupHeld(name)
	if err := keys.ValidatePoolName(name); err != nil {
		return pools.Pool{}, false, overrideScope{}, l.unknownPool(name)
	}
	slots, err := l.keys.PoolKey(name, key)
	return pool, known, overrideScope{slots: slots, index: slots, most: pools.MaxConcurrentStreams}, err
}

// cappedPoolScope is poolScope for a new override: of a key the pool in
// force caps.
func (l *Limiter) cappedPoolScope(name, key string) (overrideScope, error) {
	if _, ok := l.pools.Lookup(name); !ok {
		return overrideScope{}, l.unknownPool(name)
	}
	pool, _, scope, err := l.poolScope(name, key)
	if err != nil {
		return overrideScope{}, err
	}
	if _, capped := pool.Limit(key); !capped {
		return overrideScope{}, fmt.Errorf("%w: pool %s caps neither key %q nor its keys by default, so no stream joins the key and none would be judged by an override; give the pool a cap of the key first",
			ErrInvalidOverride, name, key)
	}
	return scope, nil
}
