package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// TestARefusedPoolScriptIsNotAnOutage (classify's contract; DESIGN §4:
// degraded is for a Redis that is unreachable or slow; api/openapi.yaml,
// HeartbeatResult: `internal` is a key of another type under the prefix):
// a pooled stream whose pool key was replaced by a string is answered
// ErrRedisRefused by its heartbeat, alone and in a batch, as an acquire
// joining the key is, not kept alive degraded as if the pool's shard did
// not answer.
func TestARefusedPoolScriptIsNotAnOutage(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(5)})
			st := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 30 * time.Second},
				Limiter: limiter.Options{Pools: table}})
			lim := st.Limiter
			ctx := context.Background()
			user := newUser(t)
			res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: map[string]string{"model": "m"}})
			if err != nil || !res.Granted || res.Degraded {
				t.Fatalf("acquire: %+v, %v", res, err)
			}
			pk, err := st.Keys.PoolKey("model", "m")
			if err != nil {
				t.Fatal(err)
			}
			c, err := st.Redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Do(ctx, c.B().Del().Key(pk).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if err := c.Do(ctx, c.B().Set().Key(pk).Value("not a sorted set").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if got, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "three", Pools: map[string]string{"model": "m"}}); !errors.Is(err, limiter.ErrRedisRefused) || got.Degraded {
				t.Fatalf("acquire joining the key of another type: %+v, %v; want ErrRedisRefused, as the heartbeat below", got, err)
			}

			req := limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: res.StreamID}
			beat, err := lim.Heartbeat(ctx, req)
			if !errors.Is(err, limiter.ErrRedisRefused) || errors.Is(err, limiter.ErrUnavailable) || beat.Alive || beat.Degraded {
				t.Errorf("heartbeat of a stream whose pool key is of another type: %+v, %v; want ErrRedisRefused, not alive, not degraded", beat, err)
			}
			beats, errs := lim.HeartbeatBatch(ctx, []limiter.HeartbeatRequest{req})
			if !errors.Is(errs[0], limiter.ErrRedisRefused) || errors.Is(errs[0], limiter.ErrUnavailable) || beats[0].Alive || beats[0].Degraded {
				t.Errorf("batch heartbeat of the same stream: %+v, %v; want ErrRedisRefused, not alive, not degraded", beats[0], errs[0])
			}
		})
	}
}
