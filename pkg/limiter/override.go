package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// Bounds of an override.
const (
	// MinOverrideDuration and MaxOverrideDuration bound how long an
	// override stays in force: it is a stopgap while a plan is fixed, so a
	// month is already generous, and one that outlives its ticket lapses
	// by itself.
	MinOverrideDuration = time.Minute
	MaxOverrideDuration = 30 * 24 * time.Hour
	// MaxOverrideReasonBytes bounds the reason stored with an override.
	MaxOverrideReasonBytes = 4 << 10
	// MaxOverrideActorBytes bounds the actor stored with an override.
	MaxOverrideActorBytes = 256
)

// Override replaces one user's limit, whatever the plan, or one pool
// key's cap, until it expires.
type Override struct {
	// MaxConcurrentStreams is the limit in force: 0 to
	// tiers.MaxConcurrentStreams; 0 lets the user hold none.
	MaxConcurrentStreams int
	// SetAt and ExpiresAt are by Redis time; TTL is what is left, as seen
	// by Redis.
	SetAt     time.Time
	ExpiresAt time.Time
	TTL       time.Duration
	// Actor is who set it (the admin token's name); Reason why.
	Actor  string
	Reason string
}

// OverrideRequest sets an override (SetOverride, SetPoolOverride).
type OverrideRequest struct {
	// MaxConcurrentStreams is the user's limit (or the pool key's cap)
	// while it is in force, bounded as the scope's own limit is: 0 to
	// tiers.MaxConcurrentStreams for a user, 0 to
	// pools.MaxConcurrentStreams for a pool key.
	MaxConcurrentStreams int
	// For is how long it stays in force: MinOverrideDuration to
	// MaxOverrideDuration, whole milliseconds.
	For time.Duration
	// Actor and Reason are stored with it: 1 to MaxOverrideActorBytes and
	// 1 to MaxOverrideReasonBytes.
	Actor  string
	Reason string
}

// check reports the first field of r out of bounds, on a scope whose
// limit is at most most.
func (r OverrideRequest) check(most int) error {
	switch {
	case r.MaxConcurrentStreams < 0 || r.MaxConcurrentStreams > most:
		return fmt.Errorf("%w: the limit must be 0 to %d, got %d", ErrInvalidOverride, most, r.MaxConcurrentStreams)
	case r.For < MinOverrideDuration || r.For > MaxOverrideDuration:
		return fmt.Errorf("%w: the duration must be %s to %s, got %s", ErrInvalidOverride, MinOverrideDuration, MaxOverrideDuration, r.For)
	case r.Actor == "" || len(r.Actor) > MaxOverrideActorBytes:
		return fmt.Errorf("%w: the actor must be 1 to %d bytes, got %d", ErrInvalidOverride, MaxOverrideActorBytes, len(r.Actor))
	case r.Reason == "" || len(r.Reason) > MaxOverrideReasonBytes:
		return fmt.Errorf("%w: the reason must be 1 to %d bytes, got %d", ErrInvalidOverride, MaxOverrideReasonBytes, len(r.Reason))
	}
	return nil
}

// overrideScope is whose limit an override replaces: a user's or a pool
// key's. The two are one kind of scope (DESIGN §16), a capped set of
// slots under one hash tag whose override, keys.Override(slots), the
// acquire script reads in the call that counts them; only their keys
// differ.
type overrideScope struct {
	slots string // keys.Schema.UserKey or PoolKey
	// index is the scope's member in the index of overrides in force
	// (keys.Schema.Overrides): the user id, or a pool key's slots key,
	// whose braces no user id holds.
	index string
	// most bounds its override's limit as its own limit is bounded.
	most int
}

// userScope is userID's override scope, its key made by userKey (the
// keys.Schema's UserKey to set one, HeldUserKey to remove one). Errors:
// ErrInvalidUserID.
func (l *Limiter) userScope(userID string, userKey func(string) (string, error)) (overrideScope, error) {
	key, err := userKey(userID)
	return overrideScope{slots: key, index: userID, most: tiers.MaxConcurrentStreams}, err
}

// SetOverride replaces userID's limit with req's until it expires, in
// place of any override before it; the user's next acquire is judged by
// it, on every plan. Slots already held are kept. Errors:
// ErrInvalidUserID, ErrInvalidOverride, ErrUnavailable (the call did not
// run), ErrOutcomeUnknown (it was sent, its answer lost, and what Redis
// holds now is not this call's override: it may or may not have been
// set; setting it again is safe), ErrRedisRefused.
//
// The override is also counted in the index of overrides in force
// (ActiveOverrides), a separate key: when that write fails the override
// stands, uncounted until it expires, and the failure is logged.
func (l *Limiter) SetOverride(ctx context.Context, userID string, req OverrideRequest) (Override, error) {
	ctx, span := l.startSpan(ctx, "limiter.set_override")
	out, err := l.setOverride(ctx, func() (overrideScope, error) { return l.userScope(userID, l.keys.UserKey) }, req)
	endSpan(span, err)
	return out, err
}

// setOverride sets req on the scope resolve names.
func (l *Limiter) setOverride(ctx context.Context, resolve func() (overrideScope, error), req OverrideRequest) (Override, error) {
	scope, err := resolve()
	if err != nil {
		return Override{}, err
	}
	if err := req.check(scope.most); err != nil {
		return Override{}, err
	}
	var stored lua.Override
	sent := false
	call := lua.NewToken() // tells this call's set from another's, read back
	err = l.do(ctx, "set_override", func(ctx context.Context, c rueidis.Client) (err error) {
		sent = true
		stored, err = lua.SetOverrideAs(ctx, c, scope.slots, req.MaxConcurrentStreams, req.For, req.Actor, req.Reason, call)
		return err
	})
	if sent && err != nil && !errors.Is(err, ErrRedisRefused) {
		// Its answer was lost: what Redis holds now says whether it is in
		// force, so that the answer, its audit record and the count of
		// overrides in force say so too.
		stored, err = l.setAfterAll(ctx, scope, call, err)
	}
	if err != nil {
		return Override{}, err
	}
	index := l.keys.Overrides()
	err = l.do(ctx, "index_override", func(ctx context.Context, c rueidis.Client) error {
		for _, resp := range c.DoMulti(ctx,
			c.B().Zremrangebyscore().Key(index).Min("-inf").Max(strconv.FormatInt(stored.SetAtMs, 10)).Build(),
			c.B().Zadd().Key(index).ScoreMember().ScoreMember(float64(stored.ExpiresAtMs), scope.index).Build()) {
			if err := resp.Error(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		l.log.WarnContext(ctx, "override set, but not counted in limiter_overrides_active until it expires", "err", err)
	}
	return *overrideOf(stored, stored.SetAtMs), nil
}

// setAfterAll answers a set on scope whose answer was lost (lost, its
// error) from the scope's override as Redis holds it now: this call's
// (call, its id), in force, is set; anything else (none, an earlier one,
// one set since by another call, or no answer) may or may not have
// followed this call's, which is ErrOutcomeUnknown.
func (l *Limiter) setAfterAll(ctx context.Context, scope overrideScope, call string, lost error) (lua.Override, error) {
	var now lua.Override
	var found bool
	err := l.do(ctx, "read_override", func(ctx context.Context, c rueidis.Client) (err error) {
		now, found, err = lua.ReadOverride(ctx, c, scope.slots)
		return err
	})
	if err == nil && found && now.Call == call && now.ExpiresAtMs > time.Now().UnixMilli() {
		return now, nil
	}
	return lua.Override{}, fmt.Errorf("%w: %w", ErrOutcomeUnknown, lost)
}

// RemoveOverride ends userID's override now; the plan's limit applies
// from the next acquire. It reports whether one was in force. Errors:
// ErrInvalidUserID, ErrUnavailable (nothing was removed),
// ErrOutcomeUnknown (the call was sent but no answer came back: it may
// have removed the override), ErrRedisRefused.
func (l *Limiter) RemoveOverride(ctx context.Context, userID string) (bool, error) {
	ctx, span := l.startSpan(ctx, "limiter.remove_override")
	removed, err := l.removeOverride(ctx, func() (overrideScope, error) { return l.userScope(userID, l.keys.HeldUserKey) })
	endSpan(span, err)
	return removed, err
}

// removeOverride removes the override of the scope resolve names.
func (l *Limiter) removeOverride(ctx context.Context, resolve func() (overrideScope, error)) (bool, error) {
	scope, err := resolve()
	if err != nil {
		return false, err
	}
	var removed bool
	sent := false
	err = l.do(ctx, "remove_override", func(ctx context.Context, c rueidis.Client) (err error) {
		sent = true
		removed, err = lua.RemoveOverride(ctx, c, scope.slots)
		return err
	})
	if sent && err != nil && !errors.Is(err, ErrRedisRefused) {
		// Its answer was lost: an override gone now is no longer counted
		// (whether this call removed it or not).
		var found bool
		if l.do(ctx, "read_override", func(ctx context.Context, c rueidis.Client) (err error) {
			_, found, err = lua.ReadOverride(ctx, c, scope.slots)
			return err
		}) == nil && !found {
			l.unindex(ctx, scope)
		}
		return false, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	if err != nil {
		return false, err
	}
	l.unindex(ctx, scope)
	return removed, nil
}

// unindex takes scope out of the index of overrides in force.
func (l *Limiter) unindex(ctx context.Context, scope overrideScope) {
	index := l.keys.Overrides()
	if err := l.do(ctx, "index_override", func(ctx context.Context, c rueidis.Client) error {
		return c.Do(ctx, c.B().Zrem().Key(index).Member(scope.index).Build()).Error()
	}); err != nil {
		l.log.WarnContext(ctx, "override removed, but still counted in limiter_overrides_active until it would have expired", "err", err)
	}
}

// ActiveOverrides counts the overrides in force, users' and pool keys',
// from their index: one cheap read, for the metric. Errors: ErrUnavailable, ErrRedisRefused.
func (l *Limiter) ActiveOverrides(ctx context.Context) (int, error) {
	index := l.keys.Overrides()
	var n int64
	err := l.do(ctx, "count_overrides", func(ctx context.Context, c rueidis.Client) (err error) {
		now := strconv.FormatInt(time.Now().UnixMilli(), 10)
		n, err = c.Do(ctx, c.B().Zcount().Key(index).Min("("+now).Max("+inf").Build()).AsInt64()
		return err
	})
	return int(n), err
}

// overrideOf is o as read at nowMs (Redis ms).
func overrideOf(o lua.Override, nowMs int64) *Override {
	return &Override{
		MaxConcurrentStreams: o.Limit,
		SetAt:                msTime(o.SetAtMs),
		ExpiresAt:            msTime(o.ExpiresAtMs),
		TTL:                  msDuration(max(0, o.ExpiresAtMs-nowMs)),
		Actor:                o.Actor,
		Reason:               o.Reason,
	}
}
