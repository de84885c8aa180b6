package telemetry

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// poolWaitTiers: gold waits at priority 5, silver at 2; free may not wait
// (maxWait 0), so its priority 0 has no series until an acquire waits at
// it.
func poolWaitTiers() []tiers.Tier {
	return []tiers.Tier{
		tiers.Tier{Plan: "gold", MaxConcurrentStreams: 3, Priority: 5, MaxWait: 10 * time.Second}.WithDefaults(),
		tiers.Tier{Plan: "silver", MaxConcurrentStreams: 3, Priority: 2, MaxWait: 10 * time.Second}.WithDefaults(),
		tiers.Tier{Plan: "free", MaxConcurrentStreams: 3}.WithDefaults(),
	}
}

// poolWaitLines are the series of pool at priority: of
// limiter_pool_acquire_waiting (waiting now), and of
// limiter_pool_acquire_wait_total (the counts by outcome, in
// waitOutcomes' order; those left out are 0).
func poolWaitLines(pool, priority string, waiting int, byOutcome ...int) (gauge string, totals []string) {
	labels := `pool="` + pool + `",priority="` + priority + `"`
	for i, outcome := range waitOutcomes {
		n := 0
		if i < len(byOutcome) {
			n = byOutcome[i]
		}
		totals = append(totals, `limiter_pool_acquire_wait_total{outcome="`+string(outcome)+`",`+labels+`} `+strconv.Itoa(n))
	}
	return `limiter_pool_acquire_waiting{` + labels + `} ` + strconv.Itoa(waiting), totals
}

// awaitLine waits up to 10s for tel's /metrics to show line.
func awaitLine(t *testing.T, tel *Telemetry, line string) {
	t.Helper()
	name, _, _ := strings.Cut(line, "{")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := scrapeLines(t, tel, name)
		if slices.Contains(got, line) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line %s on /metrics within 10s; got\n  %s", line, strings.Join(got, "\n  "))
		}
	}
}

// A pool key of cap 1 held, and three acquires of gold (priority 5) that
// wait for it in turn: one runs out of time, one is given up by its
// caller, one is granted when the holder releases. Each is counted once
// under its outcome, by pool and priority; none counts as a wait in a
// user's queue; the waiting gauge is back at 0. silver's priority starts
// at 0, free's (which may not wait) has no series.
func TestPoolWaitMetrics(t *testing.T) {
	s := newPoolStackOf(t, poolWaitTiers(), true, pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1}, MaxWait: 10 * time.Second}.WithDefaults())
	ctx := context.Background()
	model := map[string]string{"model": "gpt-4o"}
	acquire := func(ctx context.Context, wait time.Duration) (limiter.AcquireResult, error) {
		return s.lim.Acquire(ctx, limiter.AcquireRequest{UserID: "poolwait-" + keys.NewStreamID()[:12], Plan: "gold", Pools: model, Wait: wait})
	}
	holderUser := "poolwait-holder-" + keys.NewStreamID()[:12]
	holder, err := s.lim.Acquire(ctx, limiter.AcquireRequest{UserID: holderUser, Plan: "gold", Pools: model})
	if err != nil || !holder.Granted {
		t.Fatalf("holder's acquire: %+v, %v; want granted", holder, err)
	}

	// Runs out of time.
	if res, err := acquire(ctx, 150*time.Millisecond); err != nil || res.Granted || res.RefusedBy == nil {
		t.Fatalf("acquire that waits 150ms: %+v, %v; want refused by the pool once its wait ran out", res, err)
	}

	// Given up by its caller while it waits.
	cancelCtx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := acquire(cancelCtx, 10*time.Second)
		gaveUp <- err
	}()
	awaitLine(t, s.tel, `limiter_pool_acquire_waiting{pool="model",priority="5"} 1`)
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire given up while waiting: %v; want context.Canceled", err)
	}

	// Granted when the holder releases.
	granted := make(chan error, 1)
	go func() {
		res, err := acquire(ctx, 10*time.Second)
		if err == nil && !res.Granted {
			err = errors.New("refused")
		}
		granted <- err
	}()
	awaitLine(t, s.tel, `limiter_pool_acquire_waiting{pool="model",priority="5"} 1`)
	expectLines(t, s.tel, `limiter_acquire_waiting{plan="gold"}`, `limiter_acquire_waiting{plan="gold"} 0`)
	if _, err := s.lim.Release(ctx, holderUser, holder.StreamID); err != nil {
		t.Fatalf("holder's release: %v", err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("acquire waiting for the released membership: %v; want granted", err)
	}

	gold, goldTotals := poolWaitLines("model", "5", 0, 1, 1, 1) // granted, timeout, cancelled
	silver, silverTotals := poolWaitLines("model", "2", 0)
	expectLines(t, s.tel, "limiter_pool_acquire_waiting", gold, silver)
	expectLines(t, s.tel, "limiter_pool_acquire_wait_total", slices.Concat(goldTotals, silverTotals)...)
	expectLines(t, s.tel, "limiter_pool_acquire_wait_duration_seconds_count",
		`limiter_pool_acquire_wait_duration_seconds_count{outcome="granted",pool="model",priority="5"} 1`,
		`limiter_pool_acquire_wait_duration_seconds_count{outcome="timeout",pool="model",priority="5"} 1`,
		`limiter_pool_acquire_wait_duration_seconds_count{outcome="cancelled",pool="model",priority="5"} 1`,
	)
	if got := scrapeLines(t, s.tel, `limiter_pool_acquire_wait_duration_seconds_bucket{outcome="timeout",pool="model",priority="5",le="0.1"}`); !slices.Equal(got, []string{`limiter_pool_acquire_wait_duration_seconds_bucket{outcome="timeout",pool="model",priority="5",le="0.1"} 0`}) {
		t.Errorf("timeout waits of 150ms or more under 0.1s: got %q, want 0", got)
	}
	// Not waits in a user's queue.
	for _, outcome := range waitOutcomes {
		line := `limiter_acquire_wait_total{outcome="` + string(outcome) + `",plan="gold"}`
		expectLines(t, s.tel, line, line+" 0")
	}
	// The pool steps: the holder's and the waiter's grants, the refusal
	// of the one that ran out; the one given up is not a step that ended.
	expectLines(t, s.tel, `limiter_pool_acquire_total{outcome="granted"`, `limiter_pool_acquire_total{outcome="granted",pool="model"} 2`)
	expectLines(t, s.tel, `limiter_pool_acquire_total{outcome="limited"`, `limiter_pool_acquire_total{outcome="limited",pool="model"} 1`)
	for name, kind := range map[string]string{"limiter_pool_acquire_waiting": "gauge", "limiter_pool_acquire_wait_total": "counter", "limiter_pool_acquire_wait_duration_seconds": "histogram"} {
		expectLines(t, s.tel, "# TYPE "+name+" ", "# TYPE "+name+" "+kind)
		if help := scrapeLines(t, s.tel, "# HELP "+name+" "); len(help) != 1 {
			t.Errorf("%s: got help %q, want one line", name, help)
		}
	}
}

// The wait series of a pool start at 0 for the priorities at which a tier
// of the table may wait, for each pool of the pool table, a pool added
// later included; any other priority, and any other pool, from its first
// wait on. Without a pool table, a pool has none before its first wait.
func TestPoolWaitSeriesStart(t *testing.T) {
	ctx := context.Background()
	newObserver := func(t *testing.T, ts []tiers.Tier, ps *pools.Table) (*Telemetry, *Observer) {
		tel, err := New(ctx, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tel.Shutdown(ctx) })
		var table *tiers.Table
		if ts != nil {
			table = tiers.NewTable()
			if err := table.Replace(ts); err != nil {
				t.Fatal(err)
			}
		}
		o, err := NewObserver(tel.MeterProvider, table, ObserverOptions{Pools: ps})
		if err != nil {
			t.Fatal(err)
		}
		return tel, o
	}
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: capOf(1), MaxWait: time.Second}.WithDefaults()
	org := pools.Pool{Pool: "org", MaxConcurrentStreams: capOf(1)}.WithDefaults()
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{model}); err != nil {
		t.Fatal(err)
	}
	// expect checks the waiting and wait_total series of each of pools'
	// priorities (pool "=" priority), all at 0 but for a granted wait
	// at region=0.
	expect := func(t *testing.T, tel *Telemetry, series ...string) {
		t.Helper()
		var gauges, totals []string
		for _, s := range series {
			pool, priority, _ := strings.Cut(s, "=")
			byOutcome := []int{}
			if s == "region=0" {
				byOutcome = []int{1}
			}
			gauge, counts := poolWaitLines(pool, priority, 0, byOutcome...)
			gauges, totals = append(gauges, gauge), append(totals, counts...)
		}
		expectLines(t, tel, "limiter_pool_acquire_waiting", gauges...)
		expectLines(t, tel, "limiter_pool_acquire_wait_total", totals...)
	}

	t.Run("with both tables", func(t *testing.T) {
		tel, o := newObserver(t, poolWaitTiers(), table)
		expect(t, tel, "model=2", "model=5")
		if err := table.Replace([]pools.Pool{model, org}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = table.Replace([]pools.Pool{model}) }()
		expect(t, tel, "model=2", "model=5", "org=2", "org=5")
		// free may not wait (a tier changed while its acquire waited);
		// region is in no table (removed meanwhile).
		o.PoolWaiting(ctx, "region", 0, 1)
		o.PoolWaiting(ctx, "region", 0, -1)
		o.PoolWaited(ctx, "region", 0, limiter.WaitGranted, time.Millisecond)
		expect(t, tel, "model=2", "model=5", "org=2", "org=5", "region=0", "region=2", "region=5")
	})
	t.Run("without a pool table", func(t *testing.T) {
		tel, o := newObserver(t, poolWaitTiers(), nil)
		expect(t, tel)
		o.PoolWaiting(ctx, "region", 0, 1)
		o.PoolWaiting(ctx, "region", 0, -1)
		o.PoolWaited(ctx, "region", 0, limiter.WaitGranted, time.Millisecond)
		expect(t, tel, "region=0", "region=2", "region=5")
	})
	t.Run("without a tier table", func(t *testing.T) {
		tel, o := newObserver(t, nil, table)
		expect(t, tel)
		o.PoolWaiting(ctx, "region", 0, 1)
		o.PoolWaiting(ctx, "region", 0, -1)
		o.PoolWaited(ctx, "region", 0, limiter.WaitGranted, time.Millisecond)
		expect(t, tel, "region=0")
	})
	t.Run("out of range", func(t *testing.T) {
		tel, o := newObserver(t, nil, nil)
		o.PoolWaiting(ctx, "region", 10, 1)
		o.PoolWaiting(ctx, "region", -1, 1)
		o.PoolWaited(ctx, "region", 10, limiter.WaitGranted, time.Millisecond)
		o.PoolWaited(ctx, "region", 0, "made-up", time.Millisecond)
		expect(t, tel)
		if got := scrapeLines(t, tel, "limiter_pool_acquire_wait_duration_seconds_count"); len(got) != 0 {
			t.Errorf("durations of no wait counted: %q", got)
		}
	})
}

// Counting a pool wait allocates nothing once its pool was seen: it runs
// on the request path.
func TestPoolWaitDoesNotAllocate(t *testing.T) {
	_, o, _ := newTestObserver(t)
	ctx := context.Background()
	o.PoolWaiting(ctx, "model", 5, 1)
	if allocs := testing.AllocsPerRun(100, func() {
		o.PoolWaiting(ctx, "model", 5, 1)
		o.PoolWaiting(ctx, "model", 5, -1)
		o.PoolWaited(ctx, "model", 5, limiter.WaitTimeout, time.Second)
	}); allocs != 0 {
		t.Errorf("PoolWaiting and PoolWaited: %v allocations per run, want 0", allocs)
	}
}
