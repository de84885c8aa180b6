package telemetry

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// The wait metrics: the acquires waiting now, and how each wait ended and
// how long it took, by plan and outcome; no label names a user.
func TestWaitMetrics(t *testing.T) {
	tel, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	o, err := NewObserver(tel.MeterProvider, nil, ObserverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	paid := tiers.Tier{Plan: "paid"}
	for range 3 {
		o.Waiting(ctx, paid, 1)
	}
	o.Waiting(ctx, paid, -1)
	o.Waited(ctx, paid, limiter.WaitGranted, 40*time.Millisecond)
	o.Waited(ctx, paid, limiter.WaitTimeout, 10*time.Second)
	o.Waited(ctx, paid, limiter.WaitCancelled, 2*time.Second)
	o.Waited(ctx, paid, "made-up", time.Second) // not an outcome: not counted

	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`limiter_acquire_waiting{plan="paid"} 2`,
		`limiter_acquire_wait_total{outcome="granted",plan="paid"} 1`,
		`limiter_acquire_wait_total{outcome="timeout",plan="paid"} 1`,
		`limiter_acquire_wait_total{outcome="cancelled",plan="paid"} 1`,
		`limiter_acquire_wait_duration_seconds_bucket{outcome="granted",plan="paid",le="0.025"} 0`,
		`limiter_acquire_wait_duration_seconds_bucket{outcome="granted",plan="paid",le="0.1"} 1`,
		`limiter_acquire_wait_duration_seconds_count{outcome="timeout",plan="paid"} 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics has no line %s", want)
		}
	}
	if strings.Contains(body, "made-up") {
		t.Errorf("/metrics counts an outcome that is none:\n%s", body)
	}
}
