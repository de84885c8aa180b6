package limiter

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TestSpansOnlyWhenRecorded: given no tracer provider, or the no-op one
// (serve's when no exporter is configured), an operation runs in its
// caller's context, with no span started and nothing allocated; given one
// that records, it runs in its own span.
func TestSpansOnlyWhenRecorded(t *testing.T) {
	ctx := context.Background()
	for name, tp := range map[string]trace.TracerProvider{"none": nil, "no-op": noop.NewTracerProvider()} {
		l := New(nil, nil, Options{TracerProvider: tp})
		if got, span := l.startSpan(ctx, "limiter.acquire"); got != ctx || span.SpanContext().IsValid() {
			t.Errorf("%s: startSpan gave a new context (%v) or a span (%v)", name, got != ctx, span.SpanContext())
		}
		if allocs := testing.AllocsPerRun(100, func() {
			_, span := l.startSpan(ctx, "limiter.acquire")
			endSpan(span, nil)
		}); allocs != 0 {
			t.Errorf("%s: a span started and ended allocates %v times, want 0", name, allocs)
		}
	}
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(ctx)
	l := New(nil, nil, Options{TracerProvider: tp})
	got, span := l.startSpan(ctx, "limiter.acquire")
	defer span.End()
	if !span.IsRecording() || trace.SpanFromContext(got) != span {
		t.Errorf("recording provider: span recording %v, in the context %v; want both", span.IsRecording(), trace.SpanFromContext(got) == span)
	}
}
