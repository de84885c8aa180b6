package lua

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/redis/rueidis"
)

// Unbounded is the limit of a scope that refuses no acquire (a plan or a
// pool in shadow mode, a pool key no longer capped): the wait script
// grants its tickets whatever override is in force.
const Unbounded = math.MaxInt32

// Room reports whether key (a user's slots, or a pool key's) has a slot
// free under limit, or under the override in force, which replaces it
// unless limit is Unbounded (shadow mode, which refuses none):
// the wait script's own test before it grants anything (used < limit),
// made with two reads (ZCOUNT of the live slots, HMGET of the override)
// in one round trip instead of a script run. now is the caller's clock,
// not Redis's: a slot or an override that expired by one clock but not
// the other reads as live or as expired for as long as the clocks differ,
// so Room answers the question of a poll that may be early or late, never
// the decision itself, which the script makes.
func Room(ctx context.Context, c rueidis.Client, key string, limit int, now time.Time) (bool, error) {
	at := "(" + strconv.FormatInt(now.UnixMilli(), 10)
	res := c.DoMulti(ctx,
		c.B().Zcount().Key(key).Min(at).Max("+inf").Build(),
		c.B().Hmget().Key(keys.Override(key)).Field("limit", "expires_at").Build())
	live, err := res[0].AsInt64()
	if err != nil {
		return false, err
	}
	o, err := res[1].ToArray()
	if err != nil {
		return false, err
	}
	if len(o) == 2 && !o[0].IsNil() && !o[1].IsNil() {
		override, oerr := o[0].AsInt64()
		until, uerr := o[1].AsInt64()
		if oerr != nil || uerr != nil {
			return false, fmt.Errorf("override of %q: limit %v, expires_at %v", key, oerr, uerr)
		}
		if until > now.UnixMilli() && limit < Unbounded {
			limit = int(override)
		}
	}
	return live < int64(limit), nil
}
