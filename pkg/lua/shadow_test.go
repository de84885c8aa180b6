package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// Shadow mode grants what the limit would refuse, says so, and counts
// it: used goes above the limit, and the slots expire and prune as any.
func TestShadowGrantsWhatTheLimitWouldRefuse(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := "shadow:" + keys.NewStreamID()[:12] + ":{user}"
		acquire := func(id string, ttl time.Duration, shadow bool) lua.Acquired {
			t.Helper()
			got, err := lua.Acquire(ctx, c, key, id, 1, ttl, lua.Record{}, shadow)
			if err != nil {
				t.Fatalf("acquire %s: %v", id, err)
			}
			return got
		}
		if got := acquire("a", time.Minute, true); !got.Granted || got.WouldRefuse || got.Used != 1 {
			t.Fatalf("the first, under the limit of 1: %+v; want granted, not would-refuse, used 1", got)
		}
		if got := acquire("b", 300*time.Millisecond, true); !got.Granted || !got.WouldRefuse || got.Used != 2 || got.ExpiresAtMs == 0 {
			t.Fatalf("the second, over the limit, in shadow: %+v; want granted, would-refuse, used 2", got)
		}
		if got := acquire("b", 300*time.Millisecond, true); !got.Granted || !got.Extended || got.WouldRefuse || got.Used != 2 {
			t.Errorf("b again (an extension): %+v; want extended, not would-refuse, used 2", got)
		}
		if got := acquire("c", time.Minute, false); got.Granted || got.WouldRefuse || got.Used != 2 || got.RetryAfterMs <= 0 {
			t.Errorf("an enforced acquire over the limit: %+v; want refused with a retry, used 2", got)
		}
		// b expires unreleased and is pruned by the next call, as any slot.
		time.Sleep(400 * time.Millisecond)
		if got := acquire("d", time.Minute, true); !got.Granted || !got.WouldRefuse || got.Pruned != 1 || got.Used != 2 {
			t.Errorf("after b expired: %+v; want b pruned, d granted over the limit (a still held), used 2", got)
		}
	})
}
