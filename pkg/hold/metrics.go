package hold

import (
	"context"
	"errors"
	"time"

	"github.com/joishi/limiter/pkg/limiter"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// meterName is the instrumentation scope of the stream metrics.
const meterName = "github.com/joishi/limiter/pkg/hold"

// Reason says why a stream was refused a slot: the reason label of
// limiter_streams_refused_total.
type Reason string

// Reasons of a refusal.
const (
	// ReasonLimit: the user holds the plan's limit (429).
	ReasonLimit Reason = "limit"
	// ReasonUnavailable: Redis did not answer and the plan fails closed (503).
	ReasonUnavailable Reason = "unavailable"
	// ReasonUnknownPlan: the plan is not in the tier table.
	ReasonUnknownPlan Reason = "unknown_plan"
	// ReasonUnknownPool: a pool of the request's sources is not in the
	// pool table (422).
	ReasonUnknownPool Reason = "unknown_pool"
	// ReasonIdentity: no identity, or one that did not verify (401).
	ReasonIdentity Reason = "identity"
	// ReasonPlanNotAllowed: the identity's plan is outside the plans of
	// the caller asking (the ext_proc server's Envoy, scoped by the API
	// tokens file: 403).
	ReasonPlanNotAllowed Reason = "plan_not_allowed"
	// ReasonInvalid: a malformed request (a bad user id or pool key,
	// oversized headers or body, a body that is not JSON).
	ReasonInvalid Reason = "invalid"
	// ReasonLost: the request's slot was released (by support) while it
	// waited for a pool key (503 slot_lost).
	ReasonLost Reason = "lost"
	// ReasonError: the limiter failed otherwise (Redis refused the call).
	ReasonError Reason = "error"
)

var (
	allEnds    = []End{EndComplete, EndClientGone, EndUpstreamError, EndPanic, EndShutdown, EndLost, EndIdle, EndStalled}
	allReasons = []Reason{ReasonLimit, ReasonUnavailable, ReasonUnknownPlan, ReasonUnknownPool, ReasonIdentity, ReasonPlanNotAllowed, ReasonInvalid, ReasonLost, ReasonError}
	// durationBuckets span a short completion to an hour-long session.
	durationBuckets = []float64{0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
)

// refusalOf maps an error of Acquire to its refusal reason; false for the
// caller's own context ending, which refuses nothing.
func refusalOf(err error) (Reason, bool) {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "", false
	case errors.Is(err, limiter.ErrUnavailable):
		return ReasonUnavailable, true
	case errors.Is(err, limiter.ErrUnknownPlan):
		return ReasonUnknownPlan, true
	case errors.Is(err, limiter.ErrUnknownPool):
		return ReasonUnknownPool, true
	case errors.Is(err, limiter.ErrInvalidUserID), errors.Is(err, limiter.ErrInvalidStreamID), errors.Is(err, limiter.ErrInvalidLabel),
		errors.Is(err, limiter.ErrInvalidPoolKey):
		return ReasonInvalid, true
	case errors.Is(err, limiter.ErrSlotLost):
		return ReasonLost, true
	default:
		return ReasonError, true
	}
}

// metrics are the stream metrics, the same names for every mode; labels
// are the mode, the end and the reason, never a user or a plan from a
// request.
type metrics struct {
	active   metric.Int64UpDownCounter
	held     metric.Int64Counter
	duration metric.Float64Histogram
	refused  metric.Int64Counter
	lostN    metric.Int64Counter

	mode    metric.MeasurementOption
	ends    map[End]metric.MeasurementOption
	reasons map[Reason]metric.MeasurementOption
}

func newMetrics(mp metric.MeterProvider, mode string) (*metrics, error) {
	m := mp.Meter(meterName)
	var o metrics
	var errs [5]error
	o.active, errs[0] = m.Int64UpDownCounter("limiter.streams.active", metric.WithUnit("{stream}"),
		metric.WithDescription("Streams holding a slot now, by mode (proxy, extproc)."))
	o.held, errs[1] = m.Int64Counter("limiter.streams.held", metric.WithUnit("{stream}"),
		metric.WithDescription("Streams that held a slot, counted when they end, by mode and end: complete, client_gone, upstream_error, panic, shutdown, lost, idle, stalled."))
	o.duration, errs[2] = m.Float64Histogram("limiter.streams.duration", metric.WithUnit("s"),
		metric.WithDescription("How long streams held their slot, by mode and end."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	o.refused, errs[3] = m.Int64Counter("limiter.streams.refused", metric.WithUnit("{stream}"),
		metric.WithDescription("Streams refused a slot, by mode and reason: limit (429), unavailable (503), unknown_plan, identity (401), plan_not_allowed (403), invalid, lost (503 slot_lost: released while it waited), error."))
	o.lostN, errs[4] = m.Int64Counter("limiter.streams.lost", metric.WithUnit("{stream}"),
		metric.WithDescription("Streams whose slot the limiter no longer held (expired, released by support, lost in a failover), by mode: each was cut."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	modeAttr := attribute.String("mode", mode)
	o.mode = metric.WithAttributeSet(attribute.NewSet(modeAttr))
	o.ends = map[End]metric.MeasurementOption{}
	for _, e := range allEnds {
		o.ends[e] = metric.WithAttributeSet(attribute.NewSet(modeAttr, attribute.String("end", string(e))))
	}
	o.reasons = map[Reason]metric.MeasurementOption{}
	for _, r := range allReasons {
		o.reasons[r] = metric.WithAttributeSet(attribute.NewSet(modeAttr, attribute.String("reason", string(r))))
	}
	o.zero()
	return &o, nil
}

// zero starts every series of the counters at 0, each end and reason
// included: a series that first appears at the value of its first
// increase (the first stalled stream after a deploy) is one that rate()
// and increase() cannot count. The duration histogram has no zero to
// record; it appears with its first stream of each end.
func (m *metrics) zero() {
	ctx := context.Background()
	m.active.Add(ctx, 0, m.mode)
	m.lostN.Add(ctx, 0, m.mode)
	for _, labels := range m.ends {
		m.held.Add(ctx, 0, labels)
	}
	for _, labels := range m.reasons {
		m.refused.Add(ctx, 0, labels)
	}
}

func (m *metrics) started(ctx context.Context) { m.active.Add(ctx, 1, m.mode) }

func (m *metrics) ended(ctx context.Context, end End, took time.Duration) {
	labels, ok := m.ends[end]
	if !ok {
		labels = m.ends[EndComplete]
	}
	m.active.Add(ctx, -1, m.mode)
	m.held.Add(ctx, 1, labels)
	m.duration.Record(ctx, took.Seconds(), labels)
}

func (m *metrics) refuse(ctx context.Context, reason Reason) {
	labels, ok := m.reasons[reason]
	if !ok {
		labels = m.reasons[ReasonError]
	}
	m.refused.Add(ctx, 1, labels)
}

func (m *metrics) lost(ctx context.Context) { m.lostN.Add(ctx, 1, m.mode) }
