package telemetry

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// poolStack is a limiter on the shared standalone Redis with a pool table
// and the telemetry Observer, wired as serve wires them, whose pool keys'
// shard can be taken down alone.
type poolStack struct {
	tel   *Telemetry
	lim   *limiter.Limiter
	table *pools.Table
	// down makes every call on a pool key fail as an outage does (a
	// connection error) while the users' keys still answer: the shard of
	// the pool keys is gone.
	down *atomic.Bool
}

// newPoolStack returns a stack with the pools ps. withTable hands the
// pool table to the observer (ObserverOptions.Pools).
func newPoolStack(t *testing.T, withTable bool, ps ...pools.Pool) *poolStack {
	t.Helper()
	return newPoolStackOf(t, nil, withTable, ps...)
}

// newPoolStackOf is newPoolStack with the tiers ts (nil: limitertest's).
func newPoolStackOf(t *testing.T, ts []tiers.Tier, withTable bool, ps ...pools.Pool) *poolStack {
	t.Helper()
	tel, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	s := &poolStack{tel: tel, table: pools.NewTable(), down: new(atomic.Bool)}
	if err := s.table.Replace(ps); err != nil {
		t.Fatal(err)
	}
	schema := keys.Schema{Prefix: "telemetrytest:" + keys.NewStreamID()[:12] + ":"}
	outage := poolOutage{pools: schema.Prefix + "pool:{", down: s.down}
	opts := ObserverOptions{}
	if withTable {
		opts.Pools = s.table
	}
	s.lim = limitertest.New(t, limitertest.Options{
		Tiers:   ts,
		Redis:   cluster.Options{NewRedis: outage.newRedis},
		Limiter: limiter.Options{Keys: schema, Pools: s.table},
		NewObserver: func(table *tiers.Table) (limiter.Observer, error) {
			return NewObserver(tel.MeterProvider, table, opts)
		},
	}).Limiter
	return s
}

// acquire takes a slot of plan three for a user of its own, joining the
// pool keys named.
func (s *poolStack) acquire(t *testing.T, named map[string]string) (limiter.AcquireResult, error) {
	t.Helper()
	return s.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: "pooltest-" + keys.NewStreamID()[:12], Plan: "three", Pools: named})
}

// poolOutage builds rueidis clients whose calls that name a key starting
// with pools fail, while down is set, with a connection error.
type poolOutage struct {
	pools string
	down  *atomic.Bool
}

func (p poolOutage) newRedis(o rueidis.ClientOption) (rueidis.Client, error) {
	c, err := rueidis.NewClient(o)
	if err != nil {
		return nil, err
	}
	return outageClient{Client: c, outage: p}, nil
}

var errShardDown = errors.New("test: the pool keys' shard is down")

type outageClient struct {
	rueidis.Client
	outage poolOutage
}

func (c outageClient) hit(cmd rueidis.Completed) bool {
	return c.outage.down.Load() && slices.ContainsFunc(cmd.Commands(), func(arg string) bool { return strings.HasPrefix(arg, c.outage.pools) })
}

func (c outageClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if c.hit(cmd) {
		return rueidis.NewErrorResult(errShardDown)
	}
	return c.Client.Do(ctx, cmd)
}

func (c outageClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if slices.ContainsFunc(cmds, c.hit) {
		out := make([]rueidis.RedisResult, len(cmds))
		for i := range out {
			out[i] = rueidis.NewErrorResult(errShardDown)
		}
		return out
	}
	return c.Client.DoMulti(ctx, cmds...)
}

func capOf(n int) *int { return &n }

// expectLines fails unless the lines of tel's /metrics starting with
// prefix are exactly want (in any order).
func expectLines(t *testing.T, tel *Telemetry, prefix string, want ...string) {
	t.Helper()
	got := scrapeLines(t, tel, prefix)
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: got\n  %s\nwant\n  %s", prefix, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// A key of cap 1 asked twice: one granted, one limited; the key held 1
// membership at most, and sat at its cap.
func TestPoolMetricsOfAKeyAtItsCap(t *testing.T) {
	s := newPoolStack(t, false, pools.Pool{Pool: "model", MaxConcurrentStreams: capOf(1)}.WithDefaults())
	if res, err := s.acquire(t, map[string]string{"model": "gpt-4o"}); err != nil || !res.Granted {
		t.Fatalf("first acquire: %+v, %v; want granted", res, err)
	}
	if res, err := s.acquire(t, map[string]string{"model": "gpt-4o"}); err != nil || res.Granted || res.RefusedBy == nil {
		t.Fatalf("second acquire: %+v, %v; want refused by the pool", res, err)
	}
	expectLines(t, s.tel, "limiter_pool_acquire_total",
		`limiter_pool_acquire_total{outcome="granted",pool="model"} 1`,
		`limiter_pool_acquire_total{outcome="limited",pool="model"} 1`,
		`limiter_pool_acquire_total{outcome="degraded",pool="model"} 0`,
		`limiter_pool_acquire_total{outcome="unavailable",pool="model"} 0`,
		`limiter_pool_acquire_total{outcome="shadow_refused",pool="model"} 0`,
	)
	expectLines(t, s.tel, "limiter_pool_used_max", `limiter_pool_used_max{pool="model"} 1`)
	expectLines(t, s.tel, "limiter_pool_fill_max", `limiter_pool_fill_max{pool="model"} 1`)
	// The plan's count says the pool refused, not the plan's limit: the
	// second user held none of its streams.
	for _, line := range []string{
		`limiter_acquire_total{outcome="granted",plan="three"} 1`,
		`limiter_acquire_total{outcome="limited",plan="three"} 0`,
		`limiter_acquire_total{outcome="pool_limited",plan="three"} 1`,
	} {
		series, _, _ := strings.Cut(line, " ")
		expectLines(t, s.tel, series+" ", line)
	}
}

// Each pool step is counted under its own pool, in the order the limiter
// takes them (by pool name): a step granted before a later pool refuses
// counts granted, the pools after a refusal are not asked; an outage of
// the pool keys' shard counts degraded on a pool that fails open and
// unavailable on one that fails closed. The used and fill maxima are the
// largest a key of the pool showed; a key of cap 0 fills nothing.
func TestPoolMetricsCountEachStep(t *testing.T) {
	s := newPoolStack(t, false,
		pools.Pool{Pool: "model", MaxConcurrentStreams: capOf(1)}.WithDefaults(),
		pools.Pool{Pool: "org", MaxConcurrentStreams: capOf(2)}.WithDefaults(),
		pools.Pool{Pool: "provider", MaxConcurrentStreams: capOf(4), Keys: map[string]int{"off": 0}}.WithDefaults(),
		pools.Pool{Pool: "region", MaxConcurrentStreams: capOf(5), FailureMode: tiers.FailClosed}.WithDefaults(),
	)
	for _, step := range []struct {
		name    string
		pools   map[string]string
		down    bool
		granted bool
		refused string // the pool that refuses
		err     error
	}{
		{name: "model 1/1, org 1/2, provider 1/4", pools: map[string]string{"model": "gpt-4o", "org": "acme", "provider": "openai"}, granted: true},
		{name: "model gpt-4o full", pools: map[string]string{"model": "gpt-4o", "org": "acme"}, refused: "model"},
		{name: "model 1/1, org 2/2", pools: map[string]string{"model": "llama", "org": "acme"}, granted: true},
		{name: "model 1/1 given back, org full", pools: map[string]string{"model": "mistral", "org": "acme"}, refused: "org"},
		{name: "a key of cap 0", pools: map[string]string{"provider": "off"}, refused: "provider"},
		{name: "model down, fails open", pools: map[string]string{"model": "qwen"}, down: true, granted: true},
		{name: "region down, fails closed", pools: map[string]string{"region": "eu"}, down: true, err: limiter.ErrUnavailable},
	} {
		s.down.Store(step.down)
		res, err := s.acquire(t, step.pools)
		switch {
		case step.err != nil:
			if !errors.Is(err, step.err) {
				t.Fatalf("%s: %+v, %v; want %v", step.name, res, err, step.err)
			}
		case err != nil || res.Granted != step.granted || res.Degraded != step.down:
			t.Fatalf("%s: %+v, %v; want granted %v, degraded %v", step.name, res, err, step.granted, step.down)
		case step.refused != "" && (res.RefusedBy == nil || res.RefusedBy.Pool != step.refused):
			t.Fatalf("%s: refused by %+v, want pool %s", step.name, res.RefusedBy, step.refused)
		}
	}
	s.down.Store(false)

	expectLines(t, s.tel, "limiter_pool_acquire_total",
		`limiter_pool_acquire_total{outcome="granted",pool="model"} 3`,
		`limiter_pool_acquire_total{outcome="limited",pool="model"} 1`,
		`limiter_pool_acquire_total{outcome="degraded",pool="model"} 1`,
		`limiter_pool_acquire_total{outcome="unavailable",pool="model"} 0`,
		`limiter_pool_acquire_total{outcome="shadow_refused",pool="model"} 0`,
		`limiter_pool_acquire_total{outcome="granted",pool="org"} 2`,
		`limiter_pool_acquire_total{outcome="limited",pool="org"} 1`,
		`limiter_pool_acquire_total{outcome="degraded",pool="org"} 0`,
		`limiter_pool_acquire_total{outcome="unavailable",pool="org"} 0`,
		`limiter_pool_acquire_total{outcome="shadow_refused",pool="org"} 0`,
		`limiter_pool_acquire_total{outcome="granted",pool="provider"} 1`,
		`limiter_pool_acquire_total{outcome="limited",pool="provider"} 1`,
		`limiter_pool_acquire_total{outcome="degraded",pool="provider"} 0`,
		`limiter_pool_acquire_total{outcome="unavailable",pool="provider"} 0`,
		`limiter_pool_acquire_total{outcome="shadow_refused",pool="provider"} 0`,
		`limiter_pool_acquire_total{outcome="granted",pool="region"} 0`,
		`limiter_pool_acquire_total{outcome="limited",pool="region"} 0`,
		`limiter_pool_acquire_total{outcome="degraded",pool="region"} 0`,
		`limiter_pool_acquire_total{outcome="unavailable",pool="region"} 1`,
		`limiter_pool_acquire_total{outcome="shadow_refused",pool="region"} 0`,
	)
	expectLines(t, s.tel, "limiter_pool_used_max",
		`limiter_pool_used_max{pool="model"} 1`,
		`limiter_pool_used_max{pool="org"} 2`,
		`limiter_pool_used_max{pool="provider"} 1`,
		`limiter_pool_used_max{pool="region"} 0`,
	)
	expectLines(t, s.tel, "limiter_pool_fill_max",
		`limiter_pool_fill_max{pool="model"} 1`,
		`limiter_pool_fill_max{pool="org"} 1`,
		`limiter_pool_fill_max{pool="provider"} 0.25`,
		`limiter_pool_fill_max{pool="region"} 0`,
	)
	for name, kind := range map[string]string{"limiter_pool_acquire_total": "counter", "limiter_pool_used_max": "gauge", "limiter_pool_fill_max": "gauge"} {
		expectLines(t, s.tel, "# TYPE "+name+" ", "# TYPE "+name+" "+kind)
		if help := scrapeLines(t, s.tel, "# HELP "+name+" "); len(help) != 1 {
			t.Errorf("%s: got help %q, want one line", name, help)
		}
	}
}

// With the pool table, every pool's series start at 0, before its first
// acquire and for a pool added later; without it, a pool has none until
// its first acquire.
func TestPoolSeriesStartAtZero(t *testing.T) {
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: capOf(1)}.WithDefaults()
	zero := func(pool string) []string {
		return []string{
			`limiter_pool_acquire_total{outcome="granted",pool="` + pool + `"} 0`,
			`limiter_pool_acquire_total{outcome="limited",pool="` + pool + `"} 0`,
			`limiter_pool_acquire_total{outcome="degraded",pool="` + pool + `"} 0`,
			`limiter_pool_acquire_total{outcome="unavailable",pool="` + pool + `"} 0`,
			`limiter_pool_acquire_total{outcome="shadow_refused",pool="` + pool + `"} 0`,
			`limiter_pool_fill_max{pool="` + pool + `"} 0`,
			`limiter_pool_used_max{pool="` + pool + `"} 0`,
			`limiter_pool_reclaimed_total{pool="` + pool + `"} 0`,
		}
	}

	s := newPoolStack(t, true, model)
	expectLines(t, s.tel, "limiter_pool_", zero("model")...)
	if err := s.table.Replace([]pools.Pool{model, pools.Pool{Pool: "org", MaxConcurrentStreams: capOf(2)}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	expectLines(t, s.tel, "limiter_pool_", append(zero("model"), zero("org")...)...)

	bare := newPoolStack(t, false, model)
	expectLines(t, bare.tel, "limiter_pool_")
}

// Memberships that expired instead of being left are counted by pool, as
// a counter: the pool's leak and crash signal.
func TestPoolReclaimedCountsByPool(t *testing.T) {
	tel, o, _ := newTestObserver(t)
	ctx := context.Background()
	o.PoolReclaimed(ctx, "model", 2)
	o.PoolReclaimed(ctx, "model", 1)
	o.PoolReclaimed(ctx, "model", 0)
	expectLines(t, tel, "limiter_pool_reclaimed_total", `limiter_pool_reclaimed_total{pool="model"} 3`)
	if meta := scrapeLines(t, tel, "# TYPE limiter_pool_reclaimed_total"); !slices.Equal(meta, []string{"# TYPE limiter_pool_reclaimed_total counter"}) {
		t.Errorf("got %q, want a counter", meta)
	}
}

// Counting a pool step allocates nothing once its pool was seen: it runs
// on the request path, once per pool of every acquire.
func TestJoinedDoesNotAllocate(t *testing.T) {
	_, o, _ := newTestObserver(t)
	ctx := context.Background()
	o.Joined(ctx, "model", limiter.JoinGranted, 1, 2)
	if allocs := testing.AllocsPerRun(100, func() {
		o.Joined(ctx, "model", limiter.JoinGranted, 1, 2)
		o.Joined(ctx, "model", limiter.JoinLimited, 2, 2)
		o.Joined(ctx, "model", limiter.JoinDegraded, 0, 2)
	}); allocs != 0 {
		t.Errorf("Joined: %v allocations per run, want 0", allocs)
	}
}

// Shadow refusals are counted apart, exactly: a plan in shadow mode
// counts each acquire over its limit shadow_refused (by plan), and a pool
// in shadow mode each membership over a key's cap (by pool); neither
// counts them granted or limited.
func TestShadowRefusalsAreCountedByPlanAndPool(t *testing.T) {
	off := false
	s := newPoolStackOf(t, []tiers.Tier{
		tiers.Tier{Plan: "watch", MaxConcurrentStreams: 1, Enforce: &off}.WithDefaults(),
		tiers.Tier{Plan: "three", MaxConcurrentStreams: 3}.WithDefaults(),
	}, false, pools.Pool{Pool: "model", MaxConcurrentStreams: capOf(2), Enforce: &off}.WithDefaults())
	user := "shadowtest-" + keys.NewStreamID()[:12]
	for range 4 { // the first within the limit, 3 over it
		if res, err := s.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "watch"}); err != nil || !res.Granted {
			t.Fatalf("acquire of plan watch: %+v, %v; want granted", res, err)
		}
	}
	for range 5 { // 2 within the cap, 3 over it
		if res, err := s.acquire(t, map[string]string{"model": "big"}); err != nil || !res.Granted {
			t.Fatalf("acquire joining model=big: %+v, %v; want granted", res, err)
		}
	}
	expectLines(t, s.tel, `limiter_acquire_total{outcome="shadow_refused",plan="watch"}`, `limiter_acquire_total{outcome="shadow_refused",plan="watch"} 3`)
	expectLines(t, s.tel, `limiter_acquire_total{outcome="granted",plan="watch"}`, `limiter_acquire_total{outcome="granted",plan="watch"} 1`)
	expectLines(t, s.tel, `limiter_acquire_total{outcome="limited",plan="watch"}`, `limiter_acquire_total{outcome="limited",plan="watch"} 0`)
	expectLines(t, s.tel, `limiter_pool_acquire_total{outcome="shadow_refused"`, `limiter_pool_acquire_total{outcome="shadow_refused",pool="model"} 3`)
	expectLines(t, s.tel, `limiter_pool_acquire_total{outcome="granted"`, `limiter_pool_acquire_total{outcome="granted",pool="model"} 2`)
	expectLines(t, s.tel, "limiter_pool_used_max", `limiter_pool_used_max{pool="model"} 5`)
}

// An extension of a stream a shadow scope let in over its limit (a
// retry under its stream id) answers that verdict again, and is counted
// granted, by plan and by pool: the shadow refusal was counted when the
// stream was taken.
func TestAnExtensionOfAShadowGrantIsCountedGranted(t *testing.T) {
	off := false
	s := newPoolStackOf(t, []tiers.Tier{
		tiers.Tier{Plan: "watch", MaxConcurrentStreams: 1, Enforce: &off}.WithDefaults(),
	}, false, pools.Pool{Pool: "model", MaxConcurrentStreams: capOf(1), Enforce: &off}.WithDefaults())
	user := "shadowext-" + keys.NewStreamID()[:12]
	big := map[string]string{"model": "big"}
	for _, id := range []string{"first", "over", "over"} { // the second "over" extends the first
		res, err := s.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "watch", StreamID: id, Pools: big})
		if err != nil || !res.Granted || res.WouldRefuse != "" != (id == "over") {
			t.Fatalf("acquire of %s: %+v, %v; want granted, would_refuse only for over", id, res, err)
		}
	}
	expectLines(t, s.tel, `limiter_acquire_total{outcome="shadow_refused",plan="watch"}`, `limiter_acquire_total{outcome="shadow_refused",plan="watch"} 1`)
	expectLines(t, s.tel, `limiter_acquire_total{outcome="granted",plan="watch"}`, `limiter_acquire_total{outcome="granted",plan="watch"} 2`)
	expectLines(t, s.tel, `limiter_pool_acquire_total{outcome="shadow_refused"`, `limiter_pool_acquire_total{outcome="shadow_refused",pool="model"} 1`)
	expectLines(t, s.tel, `limiter_pool_acquire_total{outcome="granted"`, `limiter_pool_acquire_total{outcome="granted",pool="model"} 2`)
}

// A grant that only a pool let in fail open (its keys' shard down, the
// user's answering) is counted by its plan's own verdict: granted, or
// shadow_refused when a plan in shadow mode would have refused it; its
// pool counts it degraded. The plan's used maxima take its count. Only
// a plan whose own shard is down counts degraded.
func TestAGrantOnlyAPoolLetInFailOpenIsCountedByItsPlansVerdict(t *testing.T) {
	off := false
	s := newPoolStackOf(t, []tiers.Tier{
		tiers.Tier{Plan: "watch", MaxConcurrentStreams: 1, Enforce: &off}.WithDefaults(),
		tiers.Tier{Plan: "three", MaxConcurrentStreams: 3}.WithDefaults(),
	}, false, pools.Pool{Pool: "model", MaxConcurrentStreams: capOf(5)}.WithDefaults())
	s.down.Store(true)
	user := "pooldowntest-" + keys.NewStreamID()[:12]
	for i := range 3 { // the first within watch's limit, 2 over it
		res, err := s.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "watch", Pools: map[string]string{"model": "m"}})
		if err != nil || !res.Granted || !res.Degraded || res.SlotDegraded || res.Used != i+1 {
			t.Fatalf("acquire %d of plan watch, model's shard down: %+v, %v; want granted degraded by the pool alone, used %d", i+1, res, err, i+1)
		}
	}
	if res, err := s.acquire(t, map[string]string{"model": "m"}); err != nil || !res.Granted || !res.Degraded || res.SlotDegraded {
		t.Fatalf("acquire of plan three, model's shard down: %+v, %v; want granted degraded by the pool alone", res, err)
	}
	expectLines(t, s.tel, `limiter_acquire_total{outcome="shadow_refused",plan="watch"}`, `limiter_acquire_total{outcome="shadow_refused",plan="watch"} 2`)
	expectLines(t, s.tel, `limiter_acquire_total{outcome="granted",plan="watch"}`, `limiter_acquire_total{outcome="granted",plan="watch"} 1`)
	expectLines(t, s.tel, `limiter_acquire_total{outcome="degraded",plan="watch"}`, `limiter_acquire_total{outcome="degraded",plan="watch"} 0`)
	expectLines(t, s.tel, `limiter_acquire_total{outcome="granted",plan="three"}`, `limiter_acquire_total{outcome="granted",plan="three"} 1`)
	expectLines(t, s.tel, `limiter_acquire_total{outcome="degraded",plan="three"}`, `limiter_acquire_total{outcome="degraded",plan="three"} 0`)
	expectLines(t, s.tel, `limiter_pool_acquire_total{outcome="degraded"`, `limiter_pool_acquire_total{outcome="degraded",pool="model"} 4`)
	expectLines(t, s.tel, `limiter_slots_used_max{plan="watch"}`, `limiter_slots_used_max{plan="watch"} 3`)
}
