//go:build unix

package limiter_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// benchWaitTiers: one slot per user, waited for up to 30s.
var benchWaitTiers = []tiers.Tier{
	{Plan: "wait", MaxConcurrentStreams: 1, SlotTTL: time.Minute, HeartbeatInterval: 20 * time.Second, FailureMode: tiers.FailOpen, MaxWait: 30 * time.Second},
}

// benchReplicas returns two limiters on backend sharing one key prefix,
// as two replicas of the service share Redis, with benchWaitTiers.
func benchReplicas(b *testing.B, backend limitertest.Backend) [2]*limitertest.Stack {
	b.Helper()
	return benchReplicasWith(b, backend, benchWaitTiers, nil)
}

// benchReplicasWith is benchReplicas with the tiers given and the pools of
// table (nil: none).
func benchReplicasWith(b *testing.B, backend limitertest.Backend, plans []tiers.Tier, table *pools.Table) [2]*limitertest.Stack {
	b.Helper()
	prefix := keys.Schema{Prefix: "bench-wait:" + keys.NewStreamID()[:12] + ":"}
	var out [2]*limitertest.Stack
	var addrs []string
	for i := range out {
		out[i] = limitertest.New(b, limitertest.Options{Backend: backend, Tiers: plans,
			Redis:   cluster.Options{Addrs: addrs, Timeout: benchTimeout, Logger: slog.New(slog.DiscardHandler)},
			Limiter: limiter.Options{Keys: prefix, Logger: slog.New(slog.DiscardHandler), Pools: table}})
		addrs = out[i].Redis.Addrs()
	}
	return out
}

// BenchmarkWakeUp measures how soon the head of a user's queue is granted
// after a release: one op is a release by one replica of the slot a
// waiter on the other replica waits for, timed from the release's call to
// the waiter's grant (the wait script's call after the wake-up arrived
// through the user's shard). The waiter is queued before the timer runs.
// It reports the p50 and p99 of that latency, and both as ratios to the
// release's own round trip in the same run (the floor: the wake-up is sent
// after the release's script answers, and the grant is one more script
// call).
func BenchmarkWakeUp(b *testing.B) {
	for _, backend := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		b.Run(backend.String(), func(b *testing.B) {
			replicas := benchReplicas(b, backend)
			holder, waiter := replicas[0].Limiter, replicas[1].Limiter
			ctx := context.Background()
			user := newUser(b)
			held := "held-0"
			if res, err := holder.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: held}); err != nil || !res.Granted {
				b.Fatalf("first holder: %+v, %v", res, err)
			}
			wakes := make([]time.Duration, 0, b.N)
			releases := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				stream := fmt.Sprintf("w-%d", i)
				granted := make(chan time.Time, 1)
				go func() {
					res, err := waiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: stream, Wait: 10 * time.Second})
					if err != nil || !res.Granted || res.Waited == 0 {
						b.Errorf("waiter %s: %+v, %v; want granted after a wait", stream, res, err)
					}
					granted <- time.Now()
				}()
				for {
					got, err := holder.Slots(ctx, user)
					if err == nil && len(got.Queue) == 1 {
						break
					}
					time.Sleep(200 * time.Microsecond)
				}
				b.StartTimer()
				start := time.Now()
				if _, err := holder.Release(ctx, user, held); err != nil {
					b.Fatal(err)
				}
				released := time.Now()
				at := <-granted
				wakes = append(wakes, at.Sub(start))
				releases = append(releases, released.Sub(start))
				held = stream
			}
			b.StopTimer()
			slices.Sort(wakes)
			slices.Sort(releases)
			p50, p99 := wakes[len(wakes)/2], wakes[(len(wakes)-1)*99/100]
			rtt := releases[len(releases)/2]
			b.ReportMetric(float64(p50.Microseconds()), "p50-us")
			b.ReportMetric(float64(p99.Microseconds()), "p99-us")
			b.ReportMetric(float64(rtt.Microseconds()), "release-us")
			b.ReportMetric(float64(p50)/float64(rtt), "p50/release")
			b.ReportMetric(float64(p99)/float64(rtt), "p99/release")
		})
	}
}

// Sizes of BenchmarkWaitCost: 1,000 acquires waiting for 100 users' held
// slots, over two replicas.
const (
	costUsers   = 100
	costPerUser = 10
)

// BenchmarkWaitCost measures what acquires waiting in their users' queues
// cost Redis, on the standalone server: costUsers users each hold their
// one slot, and costUsers*costPerUser acquires, spread over two replicas,
// wait for them while nothing frees up. One op is a second of that. It
// reports Redis's commands (INFO commandstats, the scripts' own included)
// and CPU per waiter and second, and the same for as many clients polling
// a non-waiting acquire once a second (the shortest Retry-After a 429
// gives), measured after the waiters leave, and the ratio of the two.
func BenchmarkWaitCost(b *testing.B) {
	replicas := benchReplicas(b, limitertest.Standalone)
	ctx := context.Background()
	run := newUser(b)
	users := make([]string, costUsers)
	for i := range users {
		users[i] = fmt.Sprintf("%s-%d", run, i)
		if res, err := replicas[0].Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: users[i], Plan: "wait", StreamID: "holder"}); err != nil || !res.Granted {
			b.Fatalf("holder of %s: %+v, %v", users[i], res, err)
		}
	}
	cost := newWaitCost(b, replicas[0], costUsers*costPerUser)
	waiting := cost.waiting(b, func(ctx context.Context, i int) {
		_, _ = replicas[i%2].Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: users[i%costUsers], Plan: "wait", Wait: 30 * time.Second})
	}, func() {
		for _, user := range users {
			for {
				got, err := replicas[0].Limiter.Slots(ctx, user)
				if err == nil && len(got.Queue) == costPerUser {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	})
	polling := cost.polling(b, func(ctx context.Context, i int) {
		_, _ = replicas[i%2].Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: users[i%costUsers], Plan: "wait"})
	})
	cost.report(b, waiting, polling)
}

// waitCost measures what acquires waiting for a slot cost a standalone
// Redis against as many clients polling for one instead: the two halves
// of BenchmarkWaitCost and BenchmarkPoolWaitCost.
type waitCost struct {
	raw     rueidis.Client // the standalone server's
	clients int            // waiters, then pollers
}

// newWaitCost measures clients waiters, then pollers, on s's server.
func newWaitCost(b *testing.B, s *limitertest.Stack, clients int) waitCost {
	b.Helper()
	raw, err := s.Redis.Redis()
	if err != nil {
		b.Fatal(err)
	}
	return waitCost{raw: raw, clients: clients}
}

// redisRate is what the server spent per second: commands (INFO
// commandstats, the scripts' own included, INFO's not) and CPU (µs).
type redisRate struct{ commands, cpuUs float64 }

// measure sleeps seconds and returns what the server spent meanwhile.
func (c waitCost) measure(b *testing.B, seconds int) redisRate {
	b.Helper()
	before := readRedisStats(b, c.raw)
	start := time.Now()
	time.Sleep(time.Duration(seconds) * time.Second)
	after := readRedisStats(b, c.raw)
	elapsed := time.Since(start).Seconds()
	var commands float64
	for name, s := range after.commands {
		if name != "info" {
			commands += float64(s.calls - before.commands[name].calls)
		}
	}
	return redisRate{commands: commands / elapsed, cpuUs: (after.cpuUsec - before.cpuUsec) / elapsed}
}

// waiting runs acquire(ctx, i) for each of the clients at once, acquires
// that wait until ctx ends, and measures b.N seconds of them, the
// benchmark's timed part, once queued returns (when every one waits in
// its queue); then they leave.
func (c waitCost) waiting(b *testing.B, acquire func(ctx context.Context, i int), queued func()) redisRate {
	b.Helper()
	ctx, leave := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range c.clients {
		wg.Go(func() { acquire(ctx, i) })
	}
	queued()
	b.ResetTimer()
	got := c.measure(b, b.N)
	b.StopTimer()
	leave()
	wg.Wait()
	return got
}

// polling has each of the clients call poll(ctx, i), a non-waiting
// acquire, once a second, the clients spread evenly over the second, and
// measures b.N seconds of them once every one has started.
func (c waitCost) polling(b *testing.B, poll func(ctx context.Context, i int)) redisRate {
	b.Helper()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range c.clients {
		wg.Go(func() {
			timer := time.NewTimer(time.Duration(i) * time.Second / time.Duration(c.clients))
			defer timer.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-timer.C:
				}
				poll(ctx, i)
				timer.Reset(time.Second)
			}
		})
	}
	time.Sleep(time.Second) // every poller has started
	got := c.measure(b, b.N)
	stop()
	wg.Wait()
	return got
}

// report reports both halves per waiter (or client) and second, and the
// ratio of their Redis CPU.
func (c waitCost) report(b *testing.B, waiting, polling redisRate) {
	n := float64(c.clients)
	b.ReportMetric(waiting.commands/n, "cmds/waiter-s")
	b.ReportMetric(waiting.cpuUs/n, "redis-cpu-us/waiter-s")
	b.ReportMetric(polling.commands/n, "poll-cmds/client-s")
	b.ReportMetric(polling.cpuUs/n, "poll-redis-cpu-us/client-s")
	b.ReportMetric(waiting.cpuUs/polling.cpuUs, "wait/poll-redis-cpu")
}
