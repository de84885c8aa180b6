package limiter

import (
	"context"
	"errors"

	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the limiter's spans.
const tracerName = "github.com/joishi/limiter/pkg/limiter"

// Attributes of the limiter's spans. No user id is ever recorded.
const (
	attrPlan        = attribute.Key("limiter.plan")
	attrFailureMode = attribute.Key("limiter.failure_mode")
	attrLimit       = attribute.Key("limiter.limit")
	attrGranted     = attribute.Key("limiter.granted")
	attrUsed        = attribute.Key("limiter.used")
	attrPruned      = attribute.Key("limiter.pruned")
	attrDegraded    = attribute.Key("limiter.degraded")
	attrAlive       = attribute.Key("limiter.alive")
	attrReleased    = attribute.Key("limiter.released")
	attrCaller      = attribute.Key("limiter.caller")
	attrWaitedMs    = attribute.Key("limiter.waited_ms")
	// Counts of a heartbeat batch, and of a release_all.
	attrBatchSize     = attribute.Key("limiter.batch.size")
	attrBatchAlive    = attribute.Key("limiter.batch.alive")
	attrBatchLost     = attribute.Key("limiter.batch.lost")
	attrBatchDegraded = attribute.Key("limiter.batch.degraded")
	attrReleasedSlots = attribute.Key("limiter.released_slots")
)

// startSpan starts the span name and returns ctx holding it. Without a
// TracerProvider, or with the no-op one, it starts none and returns ctx as
// it is: a no-op span in the context would cost an allocation per
// operation and parent nothing.
func (l *Limiter) startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	if !l.tracing {
		return ctx, noSpan
	}
	return l.tracer.Start(ctx, name)
}

// noSpan is a span that records nothing.
var noSpan = trace.SpanFromContext(context.Background())

// tierAttrs describe the tier a request was judged by; none when the
// request failed before a tier was found.
func tierAttrs(tier tiers.Tier, more ...attribute.KeyValue) []attribute.KeyValue {
	if tier.Plan == "" {
		return more
	}
	return append([]attribute.KeyValue{
		attrPlan.String(tier.Plan),
		attrFailureMode.String(string(tier.FailureMode)),
		attrLimit.Int(tier.MaxConcurrentStreams),
	}, more...)
}

// endSpan marks span failed when err is a failure (a lost slot is an
// answer, not a failure) and ends it. The span is told the failure's kind
// (spanError), never err's text: that names the user and the stream, for
// the logs, and a span leaves the process for a collector.
func endSpan(span trace.Span, err error) {
	if err != nil && !errors.Is(err, ErrSlotLost) {
		kind := spanError(err)
		span.RecordError(kind)
		span.SetStatus(codes.Error, kind.Error())
	}
	span.End()
}

// spanErrors are the kinds of failure a span names, the first err is
// found to be (ErrOutcomeUnknown comes wrapped with ErrUnavailable).
var spanErrors = []error{
	ErrOutcomeUnknown, ErrUnavailable, ErrRedisRefused, ErrNotSlotHolder,
	ErrUnknownPlan, ErrUnknownPool, ErrPoolsDiffer, ErrInvalidUserID,
	ErrInvalidStreamID, ErrInvalidLabel, ErrInvalidPoolKey, ErrInvalidOverride,
	context.Canceled, context.DeadlineExceeded,
}

// errFailed names on a span a failure of no kind spanErrors holds.
var errFailed = errors.New("limiter call failed")

// spanError is the kind of failure err is, as a span may name it.
func spanError(err error) error {
	for _, kind := range spanErrors {
		if errors.Is(err, kind) {
			return kind
		}
	}
	return errFailed
}
