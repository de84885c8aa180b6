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
	vals, err := setOverrideScript.Exec(ctx, c, []string{keys.Override(key)}, []string{strconv.Itoa(limit), ms(d), actor, reason}).AsIntSlice()
	if err != nil {
		return Override{}, err
	}
	if len(vals) != 2 {
		return Override{}, fmt.Errorf("set_override script returned %d values, want 2", len(vals))
	}
	return Override{Limit: limit, ExpiresAtMs: vals[0], SetAtMs: vals[1], Actor: actor, Reason: reason}, nil
}

// RemoveOverride runs the remove_override script on key's override. It
// reports whether one was in force.
func RemoveOverride(ctx context.Context, c rueidis.Client, key string) (bool, error) {
	n, err := removeOverrideScript.Exec(ctx, c, []string{keys.Override(key)}, nil).AsInt64()
	return n == 1, err
}
