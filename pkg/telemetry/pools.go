package telemetry

import (
	"context"
	"errors"
	"math"
	"sync/atomic"

	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The pool metrics (DESIGN §16) are labelled by pool name only, never by
// key or user: a pool of models has as many keys as model names, and its
// keys are what the admin API's pool key view is for. The names are
// bounded by the pool table: the limiter reports only pools it resolved
// there.

// joinOutcomes label limiter_pool_acquire_total, by index.
var joinOutcomes = [...]limiter.JoinOutcome{limiter.JoinGranted, limiter.JoinLimited, limiter.JoinDegraded, limiter.JoinUnavailable, limiter.JoinShadowRefused}

// joinIndex is outcome's index in joinOutcomes; -1 for none.
func joinIndex(outcome limiter.JoinOutcome) int {
	switch outcome {
	case limiter.JoinGranted:
		return 0
	case limiter.JoinLimited:
		return 1
	case limiter.JoinDegraded:
		return 2
	case limiter.JoinUnavailable:
		return 3
	case limiter.JoinShadowRefused:
		return 4
	}
	return -1
}

// fillScale is the fixed point limiter_pool_fill_max is kept in (usedMax
// keeps integers): millionths, so that a key at its cap is exactly 1 and
// one a member short of it below 1 (a cap is at most
// pools.MaxConcurrentStreams).
const fillScale = 1_000_000

// poolLabels are the attribute sets of one pool, and its steps.
type poolLabels struct {
	name     string
	pool     metric.MeasurementOption                    // {pool}
	outcomes [len(joinOutcomes)]metric.MeasurementOption // {pool, outcome}, by joinOutcomes
	joins    [len(joinOutcomes)]atomic.Int64             // by joinOutcomes
	// reclaimed counts the pool's memberships that expired instead of
	// being left, found by any operation on their key.
	reclaimed atomic.Int64
	// waits are the pool's waits by priority (poolwait.go).
	waits [tiers.MaxPriority + 1]poolPriority
}

func (o *Observer) poolLabels(pool string) *poolLabels {
	if l, ok := o.pools.Load(pool); ok {
		return l.(*poolLabels)
	}
	p := attribute.String("pool", pool)
	l := &poolLabels{name: pool, pool: metric.WithAttributeSet(attribute.NewSet(p))}
	l.initWaits(p)
	for i, outcome := range joinOutcomes {
		l.outcomes[i] = metric.WithAttributeSet(attribute.NewSet(p, attribute.String("outcome", string(outcome))))
	}
	got, _ := o.pools.LoadOrStore(pool, l)
	return got.(*poolLabels)
}

// rangePools calls fn with each pool seen, and first makes the labels of
// the pool table's pools, so that their series start at 0: a counter that
// first appears at the value of its first increase is one that rate() and
// increase() cannot count.
func (o *Observer) rangePools(fn func(*poolLabels)) {
	if o.poolTable != nil {
		for _, p := range o.poolTable.List() {
			o.poolLabels(p.Pool)
		}
	}
	o.pools.Range(func(_, v any) bool {
		fn(v.(*poolLabels))
		return true
	})
}

// registerPools creates the pool instruments on m.
func (o *Observer) registerPools(m metric.Meter) error {
	var errs [5]error
	_, errs[0] = m.Int64ObservableCounter("limiter.pool.acquire", metric.WithUnit("{acquire}"),
		metric.WithDescription("Pool steps of acquires, by pool and outcome: granted (the key had room; counted even when a later pool of the acquire refused it and the membership was given back), limited (the key was at its cap: 429 pool_limit_reached), degraded (the key's shard did not answer, the pool fails open: granted uncounted), unavailable (the same, failing closed: 503), shadow_refused (the key was at its cap and the pool is in shadow mode, enforce: false: joined and counted all the same; a membership held already, extended, counts granted). The pools after the one that refused are not asked, nor counted."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			o.rangePools(func(l *poolLabels) {
				for i := range l.joins {
					obs.Observe(l.joins[i].Load(), l.outcomes[i])
				}
			})
			return nil
		}))
	_, errs[1] = m.Int64ObservableGauge("limiter.pool.used.max", metric.WithUnit("{stream}"),
		metric.WithDescription("By pool: the most live memberships one key of the pool held over the last minute (telemetry.slotsUsedMaxWindow), as Redis counted them at the pool's acquires, granted or refused (heartbeats do not report it); 0 when none was seen."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			o.rangePools(func(l *poolLabels) {
				obs.Observe(int64(o.poolUsedMax.max(l.name)), l.pool)
			})
			return nil
		}))
	// No unit: "1" would add _ratio to the exported name.
	_, errs[2] = m.Float64ObservableGauge("limiter.pool.fill.max",
		metric.WithDescription("By pool: the highest used/limit of one key of the pool over the last minute (telemetry.slotsUsedMaxWindow), at the pool's acquires, granted or refused; 1 = a key at its cap. Keys with a cap of 0 (closed on purpose) are left out. 0 when none was seen."),
		metric.WithFloat64Callback(func(_ context.Context, obs metric.Float64Observer) error {
			o.rangePools(func(l *poolLabels) {
				obs.Observe(float64(o.poolFillMax.max(l.name))/fillScale, l.pool)
			})
			return nil
		}))
	errs[3] = o.registerPoolWaits(m)
	_, errs[4] = m.Int64ObservableCounter("limiter.pool.reclaimed", metric.WithUnit("{membership}"),
		metric.WithDescription("By pool: memberships that expired instead of being left (their holder crashed, or stopped beating), removed by whichever acquire, wait or heartbeat on the key finds them first. The pool's leak and crash signal."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			o.rangePools(func(l *poolLabels) {
				obs.Observe(l.reclaimed.Load(), l.pool)
			})
			return nil
		}))
	return errors.Join(errs[:]...)
}

// PoolReclaimed counts memberships of a key of pool that had expired
// instead of being left, found and removed by an operation on the key.
func (o *Observer) PoolReclaimed(_ context.Context, pool string, members int) {
	if members > 0 {
		o.poolLabels(pool).reclaimed.Add(int64(members))
	}
}

// Joined counts one pool step of an acquire and, when Redis counted the
// key (granted or limited), notes its used and fill.
func (o *Observer) Joined(_ context.Context, pool string, outcome limiter.JoinOutcome, used, limit int) {
	i := joinIndex(outcome)
	if i < 0 {
		return
	}
	o.poolLabels(pool).joins[i].Add(1)
	if outcome != limiter.JoinGranted && outcome != limiter.JoinLimited && outcome != limiter.JoinShadowRefused {
		return
	}
	o.poolUsedMax.record(pool, used)
	if limit > 0 && used > 0 {
		o.poolFillMax.record(pool, int(min(int64(used)*fillScale/int64(limit), math.MaxInt32)))
	}
}
