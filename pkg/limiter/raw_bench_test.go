package limiter_test

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// rawRound is how long each side runs in one round of
// BenchmarkAcquireReleaseVsRaw.
const rawRound = time.Second

// BenchmarkAcquireReleaseVsRaw is what the library adds to the scripts it
// runs: about 50 goroutines acquire a slot for a random user of a large pool
// and release it, through Limiter.Acquire and Limiter.Release (lib), and
// through a bare rueidis client running the same two scripts with no
// deadline, no validation, no tier and no observer (raw). One op is one
// round: each side runs for a second, back to back, in an order that
// alternates between rounds. Reported per side: pairs/s and cpu-µs/pair
// (this process's CPU time, user and system, per acquire+release: Redis
// runs in other processes, so this is the client's own cost); and the
// medians of the rounds' ratios lib/raw of both.
//
//	LIMITER_TEST_REDIS=host:port go test -run '^$' -bench AcquireReleaseVsRaw -benchtime 5x ./pkg/limiter
//
// The limiter's dial timeout is the default one (the call timeout, 250ms),
// not benchTimeout: the library runs calls in their callers' goroutines
// only once two dial timeouts have passed since its latest dial (see
// cluster.Client.HonorsDeadlines), and the warm-up waits for that.
func BenchmarkAcquireReleaseVsRaw(b *testing.B) {
	for _, be := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		b.Run(be.String(), func(b *testing.B) {
			redis := cluster.Options{Timeout: benchTimeout, DialTimeout: cluster.DefaultTimeout, Logger: slog.New(slog.DiscardHandler)}
			benchVsRaw(b, newEnv(b, limitertest.Options{Backend: be, Redis: redis}))
		})
	}
}

func benchVsRaw(b *testing.B, e *env) {
	{
		raw, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: e.redis.Addrs(), DisableCache: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(raw.Close)
		tier, _ := e.table.Lookup(benchPlan)
		run := newUser(b)
		lib := func(ctx context.Context, user, stream string) error {
			res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: benchPlan, StreamID: stream})
			if err != nil || res.Degraded {
				return errDegraded(err)
			}
			if !res.Granted {
				return nil
			}
			rel, err := e.lim.Release(ctx, user, res.StreamID)
			if err != nil || rel.Degraded {
				return errDegraded(err)
			}
			return nil
		}
		acquire := rueidis.NewLuaScriptRetryable(lua.Sources()["acquire"])
		release := rueidis.NewLuaScript(lua.Sources()["release"])
		limit, ttl := strconv.Itoa(tier.MaxConcurrentStreams), strconv.FormatInt(tier.SlotTTL.Milliseconds(), 10)
		bare := func(ctx context.Context, user, stream string) error {
			key, _ := e.keys.UserKey(user)
			userKeys := []string{key, keys.SlotRecords(key)}
			got, err := acquire.Exec(ctx, raw, append(userKeys, keys.Override(key)), []string{stream, limit, ttl}).AsIntSlice()
			if err != nil || got[0] != 1 {
				return err
			}
			return release.Exec(ctx, raw, append(userKeys, keys.Queue(key), keys.QueueExpiry(key)), []string{stream}).Error()
		}
		for _, side := range []func(context.Context, string, string) error{lib, bare} { // loads the scripts
			// Users of many hash slots: rueidis dials each of a standalone
			// client's connections when a call first picks it (by slot).
			for i := range warmUpUsers {
				if err := side(context.Background(), run+"-warm-up-"+strconv.Itoa(i), "s"); err != nil {
					b.Fatal(err)
				}
			}
		}
		time.Sleep(2*cluster.DefaultTimeout + 100*time.Millisecond)

		sides := []struct {
			name string
			pair func(context.Context, string, string) error
		}{{"lib", lib}, {"raw", bare}}
		rate := map[string][]float64{}
		cpu := map[string][]float64{}
		round := 0
		for b.Loop() {
			order := slices.Clone(sides)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			round++
			for _, side := range order {
				pairs, took, used := runPairs(b, run, side.pair)
				rate[side.name] = append(rate[side.name], float64(pairs)/took.Seconds())
				cpu[side.name] = append(cpu[side.name], float64(used.Microseconds())/float64(pairs))
			}
		}
		ratio := func(m map[string][]float64) float64 {
			r := make([]float64, len(m["lib"]))
			for i := range r {
				r[i] = m["lib"][i] / m["raw"][i]
			}
			return median(r)
		}
		for _, side := range sides {
			b.ReportMetric(median(rate[side.name]), side.name+"-pairs/s")
			b.ReportMetric(median(cpu[side.name]), side.name+"-cpu-µs/pair")
		}
		b.ReportMetric(ratio(rate), "lib/raw-pairs/s")
		b.ReportMetric(ratio(cpu), "lib/raw-cpu/pair")
		b.Logf("%d rounds; pairs/s lib %.0f raw %.0f; cpu-µs/pair lib %.1f raw %.1f", round, rate["lib"], rate["raw"], cpu["lib"], cpu["raw"])
	}
}

func errDegraded(err error) error {
	if err != nil {
		return err
	}
	return limiter.ErrUnavailable // answered degraded: it did not reach Redis
}

// runPairs runs pair with benchClients goroutines for rawRound and returns
// how many ran, the wall time and this process's CPU time meanwhile.
func runPairs(b *testing.B, run string, pair func(context.Context, string, string) error) (int64, time.Duration, time.Duration) {
	b.Helper()
	var n atomic.Int64
	var stop atomic.Bool
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	cpu0, start := processCPU(), time.Now()
	for range benchClients {
		wg.Go(func() {
			ctx := context.Background()
			for !stop.Load() {
				if err := pair(ctx, benchUser(run), benchStream()); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				n.Add(1)
			}
		})
	}
	time.Sleep(rawRound)
	stop.Store(true)
	wg.Wait()
	took, used := time.Since(start), processCPU()-cpu0
	if err := failed.Load(); err != nil {
		b.Fatalf("acquire+release: %v", *err)
	}
	return n.Load(), took, used
}

// processCPU is this process's CPU time so far, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
