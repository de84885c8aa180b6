//go:build unix

package limiter_test

// Benchmarks of the slot engine on real Redis. They are read as ratios
// against a reference measured on the same server in the same run
// (hack/bench.sh, BENCHMARKS.md): redis-benchmark running the same acquire
// script, the same scripts sent through a bare rueidis client
// (bench_raw_test.go), or, for Redis' cost of a heartbeat refresh, a plain
// ZADD and PEXPIREAT (bench_refresh_test.go); never as absolute figures.
//
// Each benchmark runs on the standalone Redis (LIMITER_TEST_REDIS) and on the
// Redis Cluster (LIMITER_TEST_REDIS_CLUSTER) as sub-benchmarks; a backend
// whose variable is unset is skipped (or fails under LIMITER_TEST_REQUIRE=1).
// Besides ops/s, the acquire benchmarks report cpu-us/op: this process's CPU
// time (user and system, GC included) per op. Redis runs in other
// processes, so that is the client's own cost, and it moves far less than
// ops/s when other work shares the machine.

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
)

const (
	// benchClients is the number of goroutines calling the limiter at once,
	// as redis-benchmark's -c 50.
	benchClients = 50
	// benchUsers is the size of the user pool, as redis-benchmark's
	// -r 1000000: with far fewer acquires than users per run, almost every
	// acquire finds its user below the limit and is granted.
	benchUsers = 1_000_000
	// benchPlan: limit 3, as the redis-benchmark command line.
	benchPlan = "three"
	// benchBatch is the number of slots in one HeartbeatBatch.
	benchBatch = 1000
	// benchTimeout replaces the 250ms default per-call deadline: a
	// benchmark saturates two CPUs on purpose, and a call that times out
	// would be answered degraded without touching Redis.
	benchTimeout = 10 * time.Second
)

// eachBenchBackend runs fn as a sub-benchmark per Redis backend, on a
// connected limiter with the test tiers.
func eachBenchBackend(b *testing.B, fn func(b *testing.B, e *env)) {
	eachBenchBackendWith(b, limiter.Options{}, fn)
}

// eachBenchBackendWith is eachBenchBackend with a limiter of opts.
func eachBenchBackendWith(b *testing.B, opts limiter.Options, fn func(b *testing.B, e *env)) {
	for _, be := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		b.Run(be.String(), func(b *testing.B) {
			// No connection logs: they would split the benchmark's result line.
			// The dial timeout is serve's default, not benchTimeout: the
			// library runs calls in their callers' goroutines only once two
			// dial timeouts have passed since its latest dial (see
			// cluster.Client.HonorsDeadlines), and a benchmark would
			// otherwise measure only that first window after connecting.
			redis := cluster.Options{Timeout: benchTimeout, DialTimeout: cluster.DefaultTimeout, Logger: slog.New(slog.DiscardHandler)}
			e := newEnv(b, limitertest.Options{Backend: be, Redis: redis, Limiter: opts})
			// Users of many hash slots: rueidis dials each of a standalone
			// client's connections when a call first picks it (by slot).
			for range warmUpUsers {
				if _, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: newUser(b), Plan: benchPlan}); err != nil {
					b.Fatalf("warm-up acquire: %v", err)
				}
			}
			time.Sleep(2*cluster.DefaultTimeout + 100*time.Millisecond)
			fn(b, e)
		})
	}
}

// reportRedisCPU returns a func that reports Redis's own CPU per op since
// now, every server's (user + system, INFO cpu), as redis-cpu-us/op.
func reportRedisCPU(b *testing.B, e *env) func() {
	servers := scaleServers(b, e.raw(b))
	before := servers.cpu(b)
	return func() {
		after := servers.cpu(b)
		b.ReportMetric((after.masters+after.replicas-before.masters-before.replicas)/float64(b.N), "redis-cpu-us/op")
	}
}

// warmUpUsers are the users a benchmark acquires for before it starts.
const warmUpUsers = 32

// setBenchParallelism makes RunParallel start about benchClients goroutines.
func setBenchParallelism(b *testing.B) {
	b.SetParallelism((benchClients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
}

// benchUser returns a user of the pool: run (unique per benchmark run, so
// runs on a shared Redis do not meet) and a random number below benchUsers.
func benchUser(run string) string {
	return run + "-" + strconv.Itoa(rand.IntN(benchUsers))
}

// benchStream returns a random stream id, as redis-benchmark's s__rand_int__.
func benchStream() string {
	return "s" + strconv.Itoa(rand.IntN(benchUsers))
}

// reportOps reports b.N per second of timed run.
func reportOps(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// cpuTime is the CPU time this process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports this process's CPU time per op since start (a
// cpuTime reading taken when the timer was reset).
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "cpu-us/op")
}

// BenchmarkAcquire is what redis-benchmark's EVALSHA of the acquire script
// measures, through the limiter: about 50 concurrent callers, one acquire
// per op for a random user of a large pool. Slots are not released; they
// expire with the tier's TTL.
func BenchmarkAcquire(b *testing.B) {
	eachBenchBackend(b, func(b *testing.B, e *env) {
		run := newUser(b)
		var granted, degraded atomic.Int64
		setBenchParallelism(b)
		cpu := cpuTime()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			var g, d int64
			defer func() { granted.Add(g); degraded.Add(d) }()
			for pb.Next() {
				res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: benchUser(run), Plan: benchPlan, StreamID: benchStream()})
				if err != nil {
					b.Errorf("Acquire: %v", err)
					return
				}
				if res.Granted {
					g++
				}
				if res.Degraded {
					d++
				}
			}
		})
		b.StopTimer()
		reportOps(b)
		reportCPU(b, cpu)
		b.ReportMetric(float64(granted.Load())/float64(b.N), "granted/op")
		if n := degraded.Load(); n > 0 {
			b.Errorf("%d of %d acquires answered degraded: they did not reach Redis", n, b.N)
		}
	})
}

// BenchmarkAcquireRelease: about 50 concurrent callers; one op acquires a
// slot for a random user of a large pool and releases it again (two Redis
// calls per op).
func BenchmarkAcquireRelease(b *testing.B) {
	eachBenchBackend(b, func(b *testing.B, e *env) {
		run := newUser(b)
		var granted, degraded atomic.Int64
		setBenchParallelism(b)
		redisCPU := reportRedisCPU(b, e)
		wrapped := limiter.WrappedCalls(e.lim)
		cpu := cpuTime()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			var g, d int64
			defer func() { granted.Add(g); degraded.Add(d) }()
			for pb.Next() {
				user := benchUser(run)
				res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: benchPlan, StreamID: benchStream()})
				if err != nil {
					b.Errorf("Acquire: %v", err)
					return
				}
				if res.Degraded {
					d++
				}
				if !res.Granted {
					continue
				}
				g++
				rel, err := e.lim.Release(ctx, user, res.StreamID)
				if err != nil {
					b.Errorf("Release: %v", err)
					return
				}
				if rel.Degraded {
					d++
				}
			}
		})
		b.StopTimer()
		reportOps(b)
		reportCPU(b, cpu)
		redisCPU()
		// The share of the pairs' two calls that ran in a goroutine of
		// their own rather than in the caller's (see Limiter's deadline).
		b.ReportMetric(float64(limiter.WrappedCalls(e.lim)-wrapped)/float64(2*b.N), "wrapped/call")
		b.ReportMetric(float64(granted.Load())/float64(b.N), "granted/op")
		if n := degraded.Load(); n > 0 {
			b.Errorf("%d calls answered degraded: they did not reach Redis", n)
		}
	})
}

// BenchmarkHeartbeatBatch: one caller; one op is one HeartbeatBatch of
// benchBatch held slots, each of a different user (on a cluster they spread
// over all masters). Reports slots/s besides ops/s.
func BenchmarkHeartbeatBatch(b *testing.B) {
	eachBenchBackend(b, func(b *testing.B, e *env) {
		reqs := acquireBenchSlots(b, e, nil)
		ctx := context.Background()
		b.ResetTimer()
		for range b.N {
			results, errs := e.lim.HeartbeatBatch(ctx, reqs)
			for i, err := range errs {
				if err != nil {
					b.Fatalf("HeartbeatBatch: slot %d: %v", i, err)
				}
				if !results[i].Alive || results[i].Degraded {
					b.Fatalf("HeartbeatBatch: slot %d: %+v, want alive and not degraded", i, results[i])
				}
			}
		}
		b.StopTimer()
		reportOps(b)
		b.ReportMetric(float64(b.N)*benchBatch/b.Elapsed().Seconds(), "slots/s")
	})
}

// acquireBenchSlots acquires benchBatch slots, one per new user, each
// stream joining join's pools (nil: none), with benchClients callers, and
// returns the heartbeat requests for them.
func acquireBenchSlots(b *testing.B, e *env, join benchJoin) []limiter.HeartbeatRequest {
	b.Helper()
	run := newUser(b)
	reqs := make([]limiter.HeartbeatRequest, benchBatch)
	for i := range reqs {
		reqs[i] = limiter.HeartbeatRequest{UserID: run + "-" + strconv.Itoa(i), Plan: benchPlan, StreamID: "s" + strconv.Itoa(i)}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range benchClients {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < benchBatch; i = next.Add(1) - 1 {
				r := reqs[i]
				var pools map[string]string
				if join != nil {
					pools = join(int(i))
				}
				res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: r.UserID, Plan: r.Plan, StreamID: r.StreamID, Pools: pools})
				if err != nil || !res.Granted || res.Degraded {
					b.Errorf("Acquire(%s): %+v, %v; want granted, not degraded", r.UserID, res, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return reqs
}
