package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/client"
	"go.opentelemetry.io/otel/trace"
)

// TestTraceContextIsInjected: the client itself writes the W3C trace
// context of each call's ctx, so an application's trace continues through
// the limiter without wrapping the transport.
func TestTraceContextIsInjected(t *testing.T) {
	sampled := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
	unsampled := sampled.WithTraceFlags(0)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want string // the traceparent header the limiter receives
	}{
		{name: "a sampled span's context is sent as traceparent",
			ctx:  trace.ContextWithSpanContext(context.Background(), sampled),
			want: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{name: "an unsampled span's context is sent with its flags",
			ctx:  trace.ContextWithSpanContext(context.Background(), unsampled),
			want: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"},
		{name: "a context without a span sends no traceparent", ctx: context.Background(), want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			c := newClient(t, f.URL(), client.WithHeartbeatInterval(time.Hour))
			lease, err := c.Acquire(tc.ctx, "u1", "paid")
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if err := lease.Release(tc.ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.headers) != 2 {
				t.Fatalf("got %d requests, want 2 (acquire, release)", len(f.headers))
			}
			for i, h := range f.headers {
				if got := h.Get("Traceparent"); got != tc.want {
					t.Errorf("request %d: got traceparent %q, want %q", i, got, tc.want)
				}
			}
		})
	}
}
