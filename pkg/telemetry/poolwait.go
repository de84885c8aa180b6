package telemetry

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The pool wait metrics (DESIGN §17): acquires waiting in a pool key's
// queue, by pool name and the priority they wait at (their tier's),
// never by key or user. For each pool reported (rangePools), the
// priorities at which a tier of the table may wait (maxWait > 0) start
// at 0; any other from its first wait on the replica. Not all ten: a
// table uses a few, and only a tier's acquires wait at its priority, so
// ten times six series a pool would be mostly zeros. The duration
// histogram starts at its first wait, as limiter_acquire_wait_duration's.

// poolPriority holds the wait counts of one pool at one priority, and
// their attribute sets.
type poolPriority struct {
	// seen: an acquire waited at this priority on this replica; its
	// series are reported from now on, whatever the tier table says.
	seen    atomic.Bool
	waiting atomic.Int64
	waits   [len(waitOutcomes)]atomic.Int64 // by waitOutcomes

	set      metric.MeasurementOption                    // {pool, priority}
	outcomes [len(waitOutcomes)]metric.MeasurementOption // {pool, priority, outcome}, by waitOutcomes
	// durations are outcomes as the histogram's options: a slice passed
	// whole (durations[i]...) spares Record the one it would allocate.
	durations [len(waitOutcomes)][]metric.RecordOption
}

// initWaits builds the attribute sets of the pool's priorities (l.waits).
func (l *poolLabels) initWaits(pool attribute.KeyValue) {
	for i := range l.waits {
		p, priority := &l.waits[i], attribute.Int("priority", i)
		p.set = metric.WithAttributeSet(attribute.NewSet(pool, priority))
		for j, outcome := range waitOutcomes {
			p.outcomes[j] = metric.WithAttributeSet(attribute.NewSet(pool, priority, attribute.String("outcome", string(outcome))))
			p.durations[j] = []metric.RecordOption{p.outcomes[j]}
		}
	}
}

// waitIndex is outcome's index in waitOutcomes; -1 for none.
func waitIndex(outcome limiter.WaitOutcome) int {
	for i, o := range waitOutcomes {
		if o == outcome {
			return i
		}
	}
	return -1
}

// registerPoolWaits creates the pool wait instruments on m.
func (o *Observer) registerPoolWaits(m metric.Meter) error {
	var errs [3]error
	waiting, err := m.Int64ObservableUpDownCounter("limiter.pool.acquire.waiting", metric.WithUnit("{acquire}"),
		metric.WithDescription("Acquires waiting in a pool key's queue for a membership now (wait_ms), by pool and priority (their tier's)."))
	errs[0] = err
	waits, err := m.Int64ObservableCounter("limiter.pool.acquire.wait", metric.WithUnit("{acquire}"),
		metric.WithDescription("Waits in a pool key's queue by pool, priority and outcome: granted, timeout (429 pool_limit_reached once the wait ran out), cancelled (the caller left, a membership granted meanwhile given back), full (the key's queue held its most, refused at once), failed (Redis stopped answering, or refused; or the replica shut down while it waited, 503)."))
	errs[1] = err
	if errors.Join(errs[:2]...) == nil {
		_, errs[2] = m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
			tierPriorities := o.waitingPriorities()
			o.rangePools(func(l *poolLabels) {
				for i := range l.waits {
					p := &l.waits[i]
					if !tierPriorities[i] && !p.seen.Load() {
						continue
					}
					obs.ObserveInt64(waiting, p.waiting.Load(), p.set)
					for j := range p.waits {
						obs.ObserveInt64(waits, p.waits[j].Load(), p.outcomes[j])
					}
				}
			})
			return nil
		}, waiting, waits)
	}
	o.poolWaited, err = m.Float64Histogram("limiter.pool.acquire.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("How long acquires waited in a pool key's queue, by pool, priority and outcome."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	return errors.Join(append(errs[:], err)...)
}

// waitingPriorities says which priorities a tier of the table may wait
// at in a pool key's queue (maxWait > 0); none without a table.
func (o *Observer) waitingPriorities() (in [tiers.MaxPriority + 1]bool) {
	if o.table == nil {
		return in
	}
	for _, t := range o.table.List() {
		if t.MaxWait > 0 && t.Priority >= 0 && t.Priority <= tiers.MaxPriority {
			in[t.Priority] = true
		}
	}
	return in
}

// poolPriority returns the counts of pool at priority, marked seen; nil
// for a priority out of range.
func (o *Observer) poolPriority(pool string, priority int) *poolPriority {
	if priority < 0 || priority > tiers.MaxPriority {
		return nil
	}
	p := &o.poolLabels(pool).waits[priority]
	if !p.seen.Load() {
		p.seen.Store(true)
	}
	return p
}

// PoolWaiting counts an acquire that starts (delta 1) or stops (-1)
// waiting in the queue of a key of pool.
func (o *Observer) PoolWaiting(_ context.Context, pool string, priority, delta int) {
	if p := o.poolPriority(pool, priority); p != nil {
		p.waiting.Add(int64(delta))
	}
}

// PoolWaited counts how one wait in the queue of a key of pool ended, and
// records how long it took.
func (o *Observer) PoolWaited(ctx context.Context, pool string, priority int, outcome limiter.WaitOutcome, took time.Duration) {
	i := waitIndex(outcome)
	if i < 0 {
		return
	}
	p := o.poolPriority(pool, priority)
	if p == nil {
		return
	}
	p.waits[i].Add(1)
	o.poolWaited.Record(ctx, took.Seconds(), p.durations[i]...)
}
