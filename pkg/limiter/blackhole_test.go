package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
)

// Black hole at concurrency (fault suite): P4 bounds every decision by
// redis.timeout + 100ms however many requests are in flight, while Redis
// is black-holed, down or being redialled.
const (
	burstCalls    = 200
	burstInFlight = 32
	// burstLimit ends a burst that never saw what it waits for.
	burstLimit = 20 * time.Second
)

// The tests run one at a time (no t.Parallel): they measure latency on a
// shared two-core machine.

func TestBlackHoleAtConcurrencyFromTheStart(t *testing.T) {
	for _, plan := range []string{"three", "closed"} {
		t.Run(plan, func(t *testing.T) {
			e := newEnv(t, limitertest.Options{NoWait: true, Redis: cluster.Options{Addrs: []string{testenv.BlackHole(t)}}})
			burst(t, e, plan, nil)
		})
	}
}

// TestBlackHoleAtConcurrencyDuringRedial: the connection is black-holed
// under load; calls time out on it until the client drops it and redials
// into the black hole, where every dial hangs until its own timeout. The
// burst goes on until it has run through redials.
func TestBlackHoleAtConcurrencyDuringRedial(t *testing.T) {
	// "release": releases, which are not retried, so they may run in the
	// caller's goroutine (see deadlineClient); acquires never do.
	for _, plan := range []string{"three", "closed", "release"} {
		t.Run(plan, func(t *testing.T) {
			proxy := testenv.StartProxy(t, testenv.Redis(t))
			e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}}})
			e.acquire(t, newUser(t), "closed", "")
			connections := proxy.Accepted()
			proxy.BlackHole()
			var redialledAt atomic.Int64 // unix ns of the first redial seen
			burst(t, e, plan, func() bool {
				if proxy.Accepted() > connections {
					redialledAt.CompareAndSwap(0, time.Now().UnixNano())
				}
				// Redials follow one another: cover a few of them.
				at := redialledAt.Load()
				return at != 0 && time.Since(time.Unix(0, at)) > 3*time.Second
			})
			t.Logf("%d connections opened through the black hole", proxy.Accepted()-connections)
		})
	}
}

func TestRedisDownAtConcurrencyDuringRedial(t *testing.T) {
	for _, plan := range []string{"three", "closed"} {
		t.Run(plan, func(t *testing.T) {
			srv := testenv.StartRedis(t)
			e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{srv.Addr()}}})
			e.acquire(t, newUser(t), "closed", "")
			srv.Kill()
			burst(t, e, plan, nil)
		})
	}
}

// burst makes burstCalls acquires of plan, burstInFlight at a time, on a
// limiter whose Redis is out, and more until enough (nil: none) reports
// true. Each must be answered by the plan's failure mode within
// outageBound; it logs the latencies. Plan "release" makes releases
// instead, which must be answered degraded.
func burst(t *testing.T, e *env, plan string, enough func() bool) {
	t.Helper()
	open := plan != "closed"
	var (
		mu        sync.Mutex
		latencies []time.Duration
		wrong     []string
		started   atomic.Int64
		stop      atomic.Bool
		wg        sync.WaitGroup
	)
	deadline := time.Now().Add(burstLimit)
	for range burstInFlight {
		wg.Go(func() {
			user := newUser(t)
			for !stop.Load() {
				if n := started.Add(1); n > burstCalls && (enough == nil || enough()) || time.Now().After(deadline) {
					stop.Store(true)
					return
				}
				start := time.Now()
				if plan == "release" {
					res, err := e.lim.Release(context.Background(), user, "s")
					took := time.Since(start)
					mu.Lock()
					latencies = append(latencies, took)
					if err != nil || !res.Degraded {
						wrong = append(wrong, fmt.Sprintf("release = %+v, %v; want degraded", res, err))
					}
					mu.Unlock()
					continue
				}
				res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: plan})
				took := time.Since(start)
				var bad string
				switch {
				case open && (err != nil || !res.Granted || !res.Degraded):
					bad = fmt.Sprintf("acquire = %+v, %v; want granted and degraded", res, err)
				case !open && !errors.Is(err, limiter.ErrUnavailable):
					bad = fmt.Sprintf("acquire = %v, want ErrUnavailable", err)
				}
				mu.Lock()
				latencies = append(latencies, took)
				if bad != "" {
					wrong = append(wrong, bad)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if enough != nil && !enough() {
		t.Errorf("the burst ended after %v without what it waited for", burstLimit)
	}

	slices.Sort(latencies)
	n := len(latencies)
	var over int
	for _, d := range latencies {
		if d > outageBound {
			over++
		}
	}
	t.Logf("%s: %d calls, %d in flight: p50 %v, p99 %v, max %v; %d over %v",
		plan, n, burstInFlight, latencies[n/2].Round(time.Millisecond), latencies[n*99/100].Round(time.Millisecond),
		latencies[n-1].Round(time.Millisecond), over, outageBound)
	if over > 0 {
		t.Errorf("%d of %d decisions took longer than %v (max %v)", over, n, outageBound, latencies[n-1])
	}
	if len(wrong) > 0 {
		t.Errorf("%d of %d decisions not answered by the failure mode; first: %s", len(wrong), n, wrong[0])
	}
}
