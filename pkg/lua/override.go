package lua

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/redis/rueidis"
)

// SetOverride runs the set_override script on key's override (key a
// keys.Schema.UserKey or PoolKey): limit replaces the plan's limit, or the
// pool key's cap, for d. It returns the override as stored.
func SetOverride(ctx context.Context, c rueidis.Client, key string, limit int, d time.Duration, actor, reason string) (Override, error) {
	return SetOverrideAs(ctx, c, key, limit, d, actor, reason, "")
}

// SetOverrideAs is SetOverride recording call, the call's id ("" for
// none), with the override (Override.Call): a caller whose reply was
// lost reads it back (ReadOverride) to tell its own set from another.
func SetOverrideAs(ctx context.Context, c rueidis.Client, key string, limit int, d time.Duration, actor, reason, call string) (Override, error) {
	vals, err := setOverrideScript.Exec(ctx, c, []string{keys.Override(key)}, []string{strconv.Itoa(limit), ms(d), actor, reason, call}).AsIntSlice()
	if err != nil {
		return Override{}, err
	}
	if len(vals) != 2 {
		return Override{}, fmt.Errorf("set_override script returned %d values, want 2", len(vals))
	}
	return Override{Limit: limit, ExpiresAtMs: vals[0], SetAtMs: vals[1], Actor: actor, Reason: reason, Call: call}, nil
}

// RemoveOverride runs the remove_override script on key's override. It
// reports whether one was in force.
func RemoveOverride(ctx context.Context, c rueidis.Client, key string) (bool, error) {
	n, err := removeOverrideScript.Exec(ctx, c, []string{keys.Override(key)}, nil).AsInt64()
	return n == 1, err
}

// ReadOverride reads key's override (key a keys.Schema.UserKey or
// PoolKey) as Redis holds it, whether in force or not (ExpiresAtMs says);
// found false when there is none.
func ReadOverride(ctx context.Context, c rueidis.Client, key string) (o Override, found bool, err error) {
	vals, err := c.Do(ctx, c.B().Hmget().Key(keys.Override(key)).Field("limit", "expires_at", "set_at", "actor", "reason", "call").Build()).ToArray()
	if err != nil {
		return Override{}, false, err
	}
	if len(vals) != 6 || vals[0].IsNil() || vals[1].IsNil() {
		return Override{}, false, nil
	}
	limit, err1 := vals[0].AsInt64()
	expires, err2 := vals[1].AsInt64()
	set, _ := vals[2].AsInt64()
	actor, _ := vals[3].ToString()
	reason, _ := vals[4].ToString()
	call, _ := vals[5].ToString()
	if err1 != nil || err2 != nil {
		return Override{}, false, fmt.Errorf("override of %q: limit %v, expires_at %v", key, err1, err2)
	}
	return Override{Limit: int(limit), ExpiresAtMs: expires, SetAtMs: set, Actor: actor, Reason: reason, Call: call}, true, nil
}
