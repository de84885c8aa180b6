package telemetry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Outcomes of limiter_acquire_total and limiter_heartbeat_total.
const (
	outcomeGranted     = "granted"
	outcomeLimited     = "limited"
	outcomeDegraded    = "degraded"
	outcomeUnavailable = "unavailable"
	// outcomeShadowRefused: the plan is in shadow mode (enforce: false)
	// and its limit would have refused the acquire, which was granted.
	outcomeShadowRefused = "shadow_refused"
	// outcomePoolLimited: a pool key the acquire named was at its cap
	// (429 pool_limit_reached), not the plan's limit: counted by pool in
	// limiter_pool_acquire_total.
	outcomePoolLimited = "pool_limited"
	outcomeAlive       = "alive"
	outcomeLost        = "lost"
)

// Histogram buckets.
var (
	// usedBuckets fit maxConcurrentStreams of a few to a few dozen.
	usedBuckets = []float64{1, 2, 3, 4, 5, 10, 20, 50, 100}
	// redisBuckets bracket the default 250ms per-call deadline, so its
	// p99 alert can tell timeouts from slow answers.
	redisBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
	// waitBuckets span a slot freed at once to the longest maxWait (60s).
	waitBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60}
	// waitOutcomes label the wait metrics, the pool waits' by index.
	waitOutcomes = [...]limiter.WaitOutcome{limiter.WaitGranted, limiter.WaitTimeout, limiter.WaitCancelled, limiter.WaitFull, limiter.WaitFailed, limiter.WaitRevoked}
)

// Observer records the limiter's metrics. Labels are the plan (bounded by
// the tier table, never taken from a request), the pool's name (bounded by
// the pool table; never a pool key), the priority of a pool wait (its
// tier's, 0 to tiers.MaxPriority), the outcome and the Redis operation;
// never a user id.
//
// The counters of every request (limiter_acquire_total,
// limiter_heartbeat_total, limiter_release_total,
// limiter_pool_acquire_total, limiter_pool_acquire_wait_total, and the
// gauge limiter_pool_acquire_waiting) are counted in atomics
// and read at collection (observable counters: the same series): adding
// to a synchronous counter normalises its attribute set and looks up its
// series on every call, and a batch of 1,000 heartbeats counts 1,000.
type Observer struct {
	unsynced  metric.Int64Counter
	used      metric.Int64Histogram
	reclaimed metric.Int64Counter
	beats     [len(beatOutcomes)]atomic.Int64 // by beatOutcomes
	releases  [2]atomic.Int64                 // released false, true
	redis     metric.Float64Histogram
	waiting   metric.Int64UpDownCounter
	waits     metric.Int64Counter
	waited    metric.Float64Histogram
	usedMax   *usedMax
	table     *tiers.Table // bounds the plans the used max is recorded for

	// The pool metrics (pools.go): limiter_pool_used_max and
	// limiter_pool_fill_max (in millionths, fillScale) by pool name.
	poolUsedMax *usedMax
	poolFillMax *usedMax
	poolTable   *pools.Table // its pools' series start at 0; nil: at first sight
	// The pool wait metrics (poolwait.go): limiter_pool_acquire_waiting
	// and limiter_pool_acquire_wait_total are counted in poolLabels.
	poolWaited metric.Float64Histogram

	// Attribute sets, built once per label value so that recording does
	// not allocate: plans by name (*planLabels), ops by name, pools by
	// name (*poolLabels).
	plans sync.Map
	ops   sync.Map
	pools sync.Map
}

// planLabels are the attribute sets of one plan, and its acquires.
type planLabels struct {
	plan     metric.MeasurementOption                         // {plan}
	outcomes map[string]metric.MeasurementOption              // {plan, outcome}
	acquires map[string]*atomic.Int64                         // by outcome
	waits    map[limiter.WaitOutcome]metric.MeasurementOption // {plan, outcome}
}

func (o *Observer) planLabels(plan string) *planLabels {
	if l, ok := o.plans.Load(plan); ok {
		return l.(*planLabels)
	}
	p := attribute.String("plan", plan)
	l := &planLabels{plan: metric.WithAttributeSet(attribute.NewSet(p)), outcomes: map[string]metric.MeasurementOption{},
		acquires: map[string]*atomic.Int64{}, waits: map[limiter.WaitOutcome]metric.MeasurementOption{}}
	for _, outcome := range []string{outcomeGranted, outcomeLimited, outcomeDegraded, outcomeUnavailable, outcomeShadowRefused, outcomePoolLimited} {
		l.outcomes[outcome] = metric.WithAttributeSet(attribute.NewSet(p, attribute.String("outcome", outcome)))
		l.acquires[outcome] = new(atomic.Int64)
	}
	for _, outcome := range waitOutcomes {
		l.waits[outcome] = metric.WithAttributeSet(attribute.NewSet(p, attribute.String("outcome", string(outcome))))
	}
	got, loaded := o.plans.LoadOrStore(plan, l)
	if !loaded {
		o.zero(plan, l)
	}
	return got.(*planLabels)
}

// zero starts a plan's reclaimed and wait counters at 0 (its acquires are
// reported from the plan's first sight on), as soon as
// the plan is first seen (or at start for the table's plans): a counter
// that first appears at the value of its first increase (a wave of slots
// reclaimed after a deploy, on a new replica) is one that rate() and
// increase() cannot count. plan "" (the reclaimed slots of a release or
// an unlock, which name no plan) is no plan an acquire or a wait is of:
// it has its reclaimed counter alone.
func (o *Observer) zero(plan string, l *planLabels) {
	ctx := context.Background()
	o.reclaimed.Add(ctx, 0, l.plan)
	if plan == "" {
		return
	}
	o.waiting.Add(ctx, 0, l.plan)
	for _, set := range l.waits {
		o.waits.Add(ctx, 0, set)
	}
}

func (o *Observer) opLabels(op string) metric.MeasurementOption {
	if l, ok := o.ops.Load(op); ok {
		return l.(metric.MeasurementOption)
	}
	got, _ := o.ops.LoadOrStore(op, metric.WithAttributeSet(attribute.NewSet(attribute.String("op", op))))
	return got.(metric.MeasurementOption)
}

// Indexes of beatOutcomes.
const (
	beatAlive = iota
	beatLost
	beatDegraded
	beatUnavailable
)

// Fixed attribute sets.
var (
	// beatOutcomes are the outcomes of Observer.beats by index (beat*);
	// beatLabels their sets.
	beatOutcomes = [...]string{beatAlive: outcomeAlive, beatLost: outcomeLost, beatDegraded: outcomeDegraded, beatUnavailable: outcomeUnavailable}
	beatLabels   = func() (sets [len(beatOutcomes)]metric.MeasurementOption) {
		for i, outcome := range beatOutcomes {
			sets[i] = outcomeSet(outcome)
		}
		return sets
	}()
	// releasedLabels are the sets of Observer.releases: released false, true.
	releasedLabels = [2]metric.MeasurementOption{
		metric.WithAttributeSet(attribute.NewSet(attribute.Bool("released", false))),
		metric.WithAttributeSet(attribute.NewSet(attribute.Bool("released", true))),
	}
)

func outcomeSet(outcome string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", outcome)))
}

var _ limiter.Observer = (*Observer)(nil)

// ObserverOptions configure an Observer.
type ObserverOptions struct {
	// UsedMaxWindow is the window of limiter_slots_used_max,
	// limiter_pool_used_max and limiter_pool_fill_max: each reports the
	// largest value seen over the last UsedMaxWindow (in six steps, so
	// over the last 5/6 to 6/6 of it). Keep it at least the scrape
	// interval, or maxima between scrapes are missed. Default 1m.
	UsedMaxWindow time.Duration
	// Pools is the pool table: the pool series of each of its pools are
	// reported from the first scrape on (a pool added later, from the
	// scrape after it), at 0 until the pool's first acquire; its wait
	// series at each priority a tier of the table may wait at (maxWait >
	// 0), other priorities from their first wait. Default nil: a pool's
	// series appear at its first acquire (its wait series at its first
	// wait at a priority), already counting it.
	Pools *pools.Table
}

// NewObserver creates the limiter's instruments on mp. With table, it also
// reports limiter_tiers, the number of tiers in force, and
// limiter_slots_used_max for each of its plans. The pool metrics
// (limiter_pool_acquire_total, limiter_pool_used_max,
// limiter_pool_fill_max, and the pool wait metrics by priority:
// limiter_pool_acquire_waiting, limiter_pool_acquire_wait_total,
// limiter_pool_acquire_wait_duration_seconds) are reported for each pool
// seen, and each of opts.Pools.
func NewObserver(mp metric.MeterProvider, table *tiers.Table, opts ObserverOptions) (*Observer, error) {
	m := mp.Meter(meterName)
	o := Observer{usedMax: newUsedMax(opts.UsedMaxWindow, time.Now), table: table,
		poolUsedMax: newUsedMax(opts.UsedMaxWindow, time.Now), poolFillMax: newUsedMax(opts.UsedMaxWindow, time.Now), poolTable: opts.Pools}
	var errs [13]error
	_, errs[0] = m.Int64ObservableCounter("limiter.acquire", metric.WithUnit("{acquire}"),
		metric.WithDescription("Acquires by plan and outcome: granted, limited (429), degraded (granted uncounted: Redis down, fail-open), unavailable (503: Redis down, fail-closed), shadow_refused (the plan is in shadow mode, enforce: false: its limit would have refused the acquire, which was granted and counted; an extension of a held stream counts granted)."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			o.plans.Range(func(plan, v any) bool {
				if plan == "" {
					return true // no acquire is of plan "" (see zero)
				}
				l := v.(*planLabels)
				for outcome, n := range l.acquires {
					obs.Observe(n.Load(), l.outcomes[outcome])
				}
				return true
			})
			return nil
		}))
	o.used, errs[1] = m.Int64Histogram("limiter.slots.used", metric.WithUnit("{slot}"),
		metric.WithDescription("The user's live slots after each counted grant, by plan."),
		metric.WithExplicitBucketBoundaries(usedBuckets...))
	o.reclaimed, errs[2] = m.Int64Counter("limiter.slots.reclaimed", metric.WithUnit("{slot}"),
		metric.WithDescription("Slots that expired instead of being released, removed by whichever operation on the user finds them first: an acquire (granted or denied), a heartbeat, a release or a support unlock (the last two with plan=\"\"). The leak and crash signal."))
	_, errs[3] = m.Int64ObservableCounter("limiter.heartbeat", metric.WithUnit("{heartbeat}"),
		metric.WithDescription("Heartbeats by outcome, each slot of a batch counted: alive, lost (410), degraded (Redis down, fail-open), unavailable (Redis down, fail-closed: 503)."),
		metric.WithInt64Callback(observeCounts(o.beats[:], beatLabels[:])))
	_, errs[4] = m.Int64ObservableCounter("limiter.release", metric.WithUnit("{release}"),
		metric.WithDescription("Releases answered by Redis: released true, or false when the slot was already gone."),
		metric.WithInt64Callback(observeCounts(o.releases[:], releasedLabels[:])))
	o.redis, errs[5] = m.Float64Histogram("limiter.redis.duration", metric.WithUnit("s"),
		metric.WithDescription("Round trips to Redis by limiter operation, failures and timeouts included."),
		metric.WithExplicitBucketBoundaries(redisBuckets...))
	o.unsynced, errs[7] = m.Int64Counter("limiter.acquire.unsynced", metric.WithUnit("{acquire}"),
		metric.WithDescription("Grants fewer replicas than redis.syncReplicas confirmed in time, by plan: kept on Open plans, refused (503) and released on Closed ones."))
	o.waiting, errs[9] = m.Int64UpDownCounter("limiter.acquire.waiting", metric.WithUnit("{acquire}"),
		metric.WithDescription("Acquires waiting in their user's queue for a slot now (wait_ms), by plan."))
	o.waits, errs[10] = m.Int64Counter("limiter.acquire.wait", metric.WithUnit("{acquire}"),
		metric.WithDescription("Waits in a user's queue by plan and outcome: granted, timeout (429 once wait_ms ran out), cancelled (the caller left), full (the queue held its most, refused at once), failed (Redis stopped answering: the failure mode answered; or the replica shut down while it waited, 503)."))
	o.waited, errs[11] = m.Float64Histogram("limiter.acquire.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("How long acquires waited in their user's queue, by plan and outcome."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	errs[12] = o.registerPools(m)
	if table != nil {
		_, errs[6] = m.Int64ObservableGauge("limiter.tiers", metric.WithUnit("{tier}"),
			metric.WithDescription("Tiers in the table this replica enforces."),
			metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
				obs.Observe(int64(table.Len()))
				return nil
			}))
		_, errs[8] = m.Int64ObservableGauge("limiter.slots.used.max", metric.WithUnit("{slot}"),
			metric.WithDescription("By plan: the most live slots one user of the plan held over the last minute (telemetry.slotsUsedMaxWindow), as Redis counted them at that user's acquires (granted or refused) and heartbeats; 0 when none was seen. It returns to 0 when streams stop: a floor that stays up is slots held with no stream behind them."),
			metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
				for _, t := range table.List() {
					obs.Observe(int64(o.usedMax.max(t.Plan)), o.planLabels(t.Plan).plan)
				}
				return nil
			}))
	}
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	// The plan "" counts releases and support unlocks, which carry none.
	o.planLabels("")
	if table != nil {
		for _, t := range table.List() {
			o.planLabels(t.Plan)
		}
	}
	return &o, nil
}

// observeCounts reports counts[i] with the attribute set sets[i].
func observeCounts(counts []atomic.Int64, sets []metric.MeasurementOption) metric.Int64Callback {
	return func(_ context.Context, obs metric.Int64Observer) error {
		for i := range counts {
			obs.Observe(counts[i].Load(), sets[i])
		}
		return nil
	}
}

// Acquired counts one acquire. Requests refused before they reached a tier
// (invalid ids, unknown plan) and abandoned by their caller are not counted.
func (o *Observer) Acquired(ctx context.Context, tier tiers.Tier, res limiter.AcquireResult, err error) {
	if res.Unsynced {
		o.unsynced.Add(ctx, 1, o.planLabels(tier.Plan).plan)
	}
	var outcome string
	switch {
	case errors.Is(err, limiter.ErrUnavailable):
		outcome = outcomeUnavailable
	case err != nil:
		return
	case res.SlotDegraded:
		// The plan's own scope failed open. A pool's that did alone is
		// counted by pool (Joined); the plan's limit was judged.
		outcome = outcomeDegraded
	case res.Granted && res.WouldRefuse == limiter.CodeStreamLimitReached && !res.Extended:
		// An extension is never refused: its WouldRefuse is the verdict
		// on the acquire that took the stream, counted then.
		outcome = outcomeShadowRefused
	case res.Granted:
		outcome = outcomeGranted
	case res.RefusedBy != nil:
		outcome = outcomePoolLimited
	default:
		outcome = outcomeLimited
	}
	labels := o.planLabels(tier.Plan)
	labels.acquires[outcome].Add(1)
	if outcome == outcomeGranted || outcome == outcomeShadowRefused {
		o.used.Record(ctx, int64(res.Used), labels.plan)
	}
	if outcome == outcomeGranted || outcome == outcomeLimited || outcome == outcomeShadowRefused {
		o.usedMax.record(tier.Plan, res.Used)
	}
}

// Reclaimed counts slots that expired instead of being released, whichever
// operation found them: an acquire (granted or denied), a heartbeat, a
// release or a support unlock (the last two carry no plan).
func (o *Observer) Reclaimed(ctx context.Context, plan string, slots int) {
	o.reclaimed.Add(ctx, int64(slots), o.planLabels(plan).plan)
}

// Heartbeated counts one heartbeat.
func (o *Observer) Heartbeated(_ context.Context, res limiter.HeartbeatResult, err error) {
	var outcome int
	switch {
	case err == nil && res.Degraded:
		outcome = beatDegraded
	case err == nil && res.Alive:
		outcome = beatAlive
	case errors.Is(err, limiter.ErrSlotLost):
		outcome = beatLost
	case errors.Is(err, limiter.ErrUnavailable):
		outcome = beatUnavailable
	default:
		return
	}
	o.beats[outcome].Add(1)
	// A heartbeat degraded by a pool's shard alone still carries the
	// user's count from Redis (Used > 0); one whose user's shard did not
	// answer carries none.
	if (outcome == beatAlive || outcome == beatDegraded && res.Used > 0) && res.Plan != "" {
		o.usedMax.record(res.Plan, res.Used)
	}
}

// Released counts one release that Redis answered.
func (o *Observer) Released(_ context.Context, res limiter.ReleaseResult, err error) {
	if err != nil || res.Degraded {
		return
	}
	if res.Released {
		o.releases[1].Add(1)
	} else {
		o.releases[0].Add(1)
	}
}

// RedisCall records one round trip. A call made before the first
// connection never left the process and is not a latency.
func (o *Observer) RedisCall(ctx context.Context, op string, took time.Duration, err error) {
	if errors.Is(err, cluster.ErrNotConnected) {
		return
	}
	o.redis.Record(ctx, took.Seconds(), o.opLabels(op))
}

// Waiting counts an acquire that starts (delta 1) or stops (-1) waiting
// in its user's queue.
func (o *Observer) Waiting(ctx context.Context, tier tiers.Tier, delta int) {
	o.waiting.Add(ctx, int64(delta), o.planLabels(tier.Plan).plan)
}

// Waited counts how one wait in a user's queue ended, and records how
// long it took.
func (o *Observer) Waited(ctx context.Context, tier tiers.Tier, outcome limiter.WaitOutcome, took time.Duration) {
	labels, ok := o.planLabels(tier.Plan).waits[outcome]
	if !ok {
		return
	}
	o.waits.Add(ctx, 1, labels)
	o.waited.Record(ctx, took.Seconds(), labels)
}
