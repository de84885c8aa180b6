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
	"github.com/joishi/limiter/pkg/tiers"
)

// benchWaitTiers: one slot per user, waited for up to 30s.
var benchWaitTiers = []tiers.Tier{
	{Plan: "wait", MaxConcurrentStreams: 1, SlotTTL: time.Minute, HeartbeatInterval: 20 * time.Second, FailureMode: tiers.FailOpen, MaxWait: 30 * time.Second},
}

// benchReplicas returns two limiters on backend sharing one key prefix,
// as two replicas of the service share Redis.
func benchReplicas(b *testing.B, backend limitertest.Backend) [2]*limitertest.Stack {
	b.Helper()
	prefix := keys.Schema{Prefix: "bench-wait:" + keys.NewStreamID()[:12] + ":"}
	var out [2]*limitertest.Stack
	var addrs []string
	for i := range out {
		out[i] = limitertest.New(b, limitertest.Options{Backend: backend, Tiers: benchWaitTiers,
			Redis:   cluster.Options{Addrs: addrs, Timeout: benchTimeout, Logger: slog.New(slog.DiscardHandler)},
			Limiter: limiter.Options{Keys: prefix, Logger: slog.New(slog.DiscardHandler)}})
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
	raw, err := replicas[0].Redis.Redis()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	run := newUser(b)
	users := make([]string, costUsers)
	for i := range users {
		users[i] = fmt.Sprintf("%s-%d", run, i)
		if res, err := replicas[0].Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: users[i], Plan: "wait", StreamID: "holder"}); err != nil || !res.Granted {
			b.Fatalf("holder of %s: %+v, %v", users[i], res, err)
		}
	}
	waiters := costUsers * costPerUser
	measure := func(seconds int) (commands, cpuUs float64) {
		before := readRedisStats(b, raw)
		start := time.Now()
		time.Sleep(time.Duration(seconds) * time.Second)
		after := readRedisStats(b, raw)
		elapsed := time.Since(start).Seconds()
		for name, s := range after.commands {
			if name != "info" {
				commands += float64(s.calls - before.commands[name].calls)
			}
		}
		return commands / elapsed, (after.cpuUsec - before.cpuUsec) / elapsed
	}

	waitCtx, leave := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			_, _ = replicas[i%2].Limiter.Acquire(waitCtx, limiter.AcquireRequest{UserID: users[i%costUsers], Plan: "wait", Wait: 30 * time.Second})
		})
	}
	for _, user := range users {
		for {
			got, err := replicas[0].Limiter.Slots(ctx, user)
			if err == nil && len(got.Queue) == costPerUser {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	b.ResetTimer()
	waitCmds, waitCPU := measure(b.N)
	b.StopTimer()
	leave()
	wg.Wait()

	pollCtx, stop := context.WithCancel(ctx)
	for i := range waiters {
		wg.Go(func() {
			timer := time.NewTimer(time.Duration(i) * time.Second / time.Duration(waiters))
			defer timer.Stop()
			for {
				select {
				case <-pollCtx.Done():
					return
				case <-timer.C:
				}
				_, _ = replicas[i%2].Limiter.Acquire(pollCtx, limiter.AcquireRequest{UserID: users[i%costUsers], Plan: "wait"})
				timer.Reset(time.Second)
			}
		})
	}
	time.Sleep(time.Second) // every poller has started
	pollCmds, pollCPU := measure(b.N)
	stop()
	wg.Wait()

	n := float64(waiters)
	b.ReportMetric(waitCmds/n, "cmds/waiter-s")
	b.ReportMetric(waitCPU/n, "redis-cpu-us/waiter-s")
	b.ReportMetric(pollCmds/n, "poll-cmds/client-s")
	b.ReportMetric(pollCPU/n, "poll-redis-cpu-us/client-s")
	b.ReportMetric(waitCPU/pollCPU, "wait/poll-redis-cpu")
}
