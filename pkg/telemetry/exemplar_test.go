package telemetry

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// lookups is a context that counts the values asked of it.
type lookups struct {
	context.Context
	n int
}

func (c *lookups) Value(key any) any {
	c.n++
	return c.Context.Value(key)
}

// A measurement collects no exemplar: /metrics is Prometheus's text
// format, which carries none, and looking for the sampled span an
// exemplar names walks the whole of the caller's context (an HTTP
// request's, a Redis call's), on every measurement of every instrument.
func TestMeasurementsLookUpNoSpan(t *testing.T) {
	tel, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	meter := tel.MeterProvider.Meter("test")
	hist, err := meter.Float64Histogram("test.duration", metric.WithUnit("s"))
	if err != nil {
		t.Fatal(err)
	}
	count, err := meter.Int64Counter("test.calls")
	if err != nil {
		t.Fatal(err)
	}
	// A sampled span's context, as a traced request's: the one an
	// exemplar would name.
	sampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled}))
	ctx := &lookups{Context: sampled}
	hist.Record(ctx, 0.002)
	count.Add(ctx, 1)
	if ctx.n != 0 {
		t.Errorf("a histogram's and a counter's measurements looked %d values up in their context, want none (no exemplars)", ctx.n)
	}
}
