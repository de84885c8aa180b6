// Package holdtest builds what the tests of pkg/hold and of its front
// ends (pkg/proxy, pkg/extproc) run on: a limiter stack
// (internal/limitertest) with telemetry, and a hold.Holder on it; and it
// reads what they hold: slots and queues in Redis, series on /metrics, and
// what they answer: the error body of a refusal.
package holdtest

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/telemetry"
	"github.com/joishi/limiter/pkg/tiers"
)

// redisTimeout replaces the 250ms default per-call deadline: these tests
// check correctness, not latency, and a loaded machine must not turn them
// degraded.
const redisTimeout = 5 * time.Second

// Options configure an Env. Zero values take the documented defaults.
type Options struct {
	// Stack configures the limiter stack. A zero Redis.Timeout becomes 5s
	// when Redis.Addrs is empty (a test that dials a server of its own,
	// a black hole say, sets the timeout it needs). Without an observer
	// of its own (Limiter.Observer, NewObserver), the limiter reports to
	// the telemetry's, so that its series (the waits' outcomes, say) are
	// on /metrics beside the holder's.
	Stack limitertest.Options
	// Hold configures the holder; its MeterProvider is always the
	// telemetry's. Default Mode "test".
	Hold hold.Options
	// Telemetry configures the telemetry (a SpanExporter, say).
	Telemetry telemetry.Options
}

// Env is a Holder on a limiter stack, with the telemetry that serves its
// metrics. Everything in it is closed on the test's cleanup.
type Env struct {
	Stack  *limitertest.Stack
	Holder *hold.Holder
	Tel    *telemetry.Telemetry
}

// New returns the Env o describes. It is skipped or fails as
// limitertest.New is when the shared Redis is not set up.
func New(t testing.TB, o Options) *Env {
	t.Helper()
	tel, err := telemetry.New(context.Background(), o.Telemetry)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	if o.Stack.Redis.Timeout == 0 && len(o.Stack.Redis.Addrs) == 0 {
		o.Stack.Redis.Timeout = redisTimeout
	}
	if o.Stack.Limiter.Observer == nil && o.Stack.NewObserver == nil {
		o.Stack.NewObserver = func(table *tiers.Table) (limiter.Observer, error) {
			return telemetry.NewObserver(tel.MeterProvider, table, telemetry.ObserverOptions{Pools: o.Stack.Limiter.Pools})
		}
	}
	stack := limitertest.New(t, o.Stack)
	if o.Hold.Mode == "" {
		o.Hold.Mode = "test"
	}
	o.Hold.MeterProvider = tel.MeterProvider
	h, err := hold.New(stack.Limiter, o.Hold)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return &Env{Stack: stack, Holder: h, Tel: tel}
}

// Used returns how many live slots Redis holds for user.
func (e *Env) Used(t testing.TB, user string) int {
	t.Helper()
	slots, err := e.Stack.Limiter.Slots(context.Background(), user)
	if err != nil {
		t.Fatalf("Slots(%s): %v", user, err)
	}
	return slots.Used
}

// AwaitUsed waits up to within for user to hold want slots.
func (e *Env) AwaitUsed(t testing.TB, user string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := e.Used(t, user)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("user %s holds %d slots after %s, want %d", user, got, within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// AwaitQueue waits up to within for user's queue to hold n acquires.
func (e *Env) AwaitQueue(t testing.TB, user string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got, err := e.Stack.Limiter.Slots(context.Background(), user)
		if err == nil && len(got.Queue) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %s after %s: %+v, %v; want %d waiting", user, within, got.Queue, err, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Metric returns the value of the /metrics line that starts with series,
// "" when there is none.
func (e *Env) Metric(t testing.TB, series string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	e.Tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for line := range strings.SplitSeq(rec.Body.String(), "\n") {
		if value, ok := strings.CutPrefix(line, series+" "); ok {
			return value
		}
	}
	return ""
}

// ErrorBody is the JSON body of a refusal the front ends answer
// (hold.Refusal), as a client reads it: OpenAI's error shape plus the
// limiter's figures. It is written out here, not hold.ErrorBody, so that a
// change of the wire shows in the tests.
type ErrorBody struct {
	Error struct {
		Message      string  `json:"message"`
		Type         string  `json:"type"`
		Code         string  `json:"code"`
		Param        *string `json:"param"`
		RetryAfterMs *int64  `json:"retry_after_ms"`
		Used         *int    `json:"used"`
		Limit        *int    `json:"limit"`
	} `json:"error"`
}
