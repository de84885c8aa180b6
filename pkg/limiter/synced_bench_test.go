package limiter_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
)

// BenchmarkAcquireSynced is the cost of redis.syncReplicas on the Redis
// Cluster (each master has one replica): BenchmarkAcquire's op without it
// (/off) and with every acquire waiting for one replica (/replicas=1), each
// with one caller (latency) and with about 50 (throughput). Besides ops/s it
// reports the p50 and p99 of one acquire in microseconds, and
// unsynced/op, which must stay 0 (a WAIT that timed out would measure the
// timeout, not the replication). Read /replicas=1 as a ratio of /off in the
// same run.
func BenchmarkAcquireSynced(b *testing.B) {
	addrs := testenv.Cluster(b)
	opts := cluster.Options{Addrs: addrs, Timeout: benchTimeout, Logger: slog.New(slog.DiscardHandler)}
	e := newEnv(b, limitertest.Options{Redis: opts})
	for _, replicas := range []int{0, 1} {
		name := "off"
		if replicas > 0 {
			name = "replicas=1"
		}
		lim := limiter.New(e.redis, e.table, limiter.Options{Keys: e.keys, SyncReplicas: replicas})
		for _, callers := range []string{"serial", "parallel"} {
			b.Run(name+"/"+callers, func(b *testing.B) {
				run := newUser(b)
				var mu sync.Mutex
				var took []time.Duration
				var unsynced int
				op := func(ctx context.Context, local *[]time.Duration, u *int) bool {
					start := time.Now()
					res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: benchUser(run), Plan: benchPlan, StreamID: benchStream()})
					*local = append(*local, time.Since(start))
					if err != nil || res.Degraded {
						b.Errorf("Acquire: %+v, %v", res, err)
						return false
					}
					if res.Unsynced {
						*u++
					}
					return true
				}
				b.ResetTimer()
				if callers == "serial" {
					for range b.N {
						if !op(context.Background(), &took, &unsynced) {
							return
						}
					}
				} else {
					setBenchParallelism(b)
					b.RunParallel(func(pb *testing.PB) {
						var local []time.Duration
						var u int
						defer func() { mu.Lock(); took = append(took, local...); unsynced += u; mu.Unlock() }()
						for pb.Next() {
							if !op(context.Background(), &local, &u) {
								return
							}
						}
					})
				}
				b.StopTimer()
				reportOps(b)
				slices.Sort(took)
				if len(took) > 0 {
					b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-us")
					b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-us")
				}
				b.ReportMetric(float64(unsynced)/float64(b.N), "unsynced/op")
			})
		}
	}
}
