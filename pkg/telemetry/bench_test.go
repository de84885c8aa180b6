//go:build unix

package telemetry_test

// The cost of telemetry on the request path: acquire with metrics only (what
// serve runs without an OTLP endpoint: no-op tracer), and with metrics and
// tracing (every span sampled and batched to an exporter that discards
// them), against the same with both off, on the shared standalone Redis
// (LIMITER_TEST_REDIS). Read "on" as a ratio of "off" measured in the same
// run (BENCHMARKS.md), never as absolute figures. Besides ops/s, each
// reports cpu-us/op: this process's CPU time (user and system, GC included)
// per acquire. Redis runs in another process, so that figure is the
// limiter's own cost, and it moves far less than ops/s when other work
// shares the machine.

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/telemetry"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// benchClients concurrent callers, as the limiter's own benchmarks.
const benchClients = 50

// discard is a span exporter that drops what it is given: the benchmark
// measures making and batching spans, not a collector.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkAcquireTelemetry: Limiter calls Limiter.Acquire; Handler sends
// POST /v1/slots/acquire through the server's handler in process (JSON and
// the otelhttp middleware included, no sockets). Each with telemetry off,
// metrics only, and metrics and traces on.
func BenchmarkAcquireTelemetry(b *testing.B) {
	for _, level := range []string{"Limiter", "Handler"} {
		for _, mode := range []string{"off", "metrics", "on"} {
			b.Run(level+"/"+mode, func(b *testing.B) {
				lim, handler := benchStack(b, mode)
				run := randomID()
				b.SetParallelism((benchClients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				cpu := cpuTime()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						user := run + "-" + strconv.Itoa(rand.IntN(1_000_000))
						if level == "Limiter" {
							benchLimiter(b, lim, user)
						} else {
							benchHandler(b, handler, user)
						}
					}
				})
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
				b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-us/op")
			})
		}
	}
}

// BenchmarkHandlerAllocs counts the heap allocations of one
// POST /v1/slots/acquire through the server's handler with metrics on, as
// serve runs without an OTLP endpoint (the real observer, meter and
// middleware, a no-op tracer), on the standalone Redis. Calls run one at
// a time so that handler-allocs/op and handler-B/op cover ServeHTTP alone,
// and what the Redis client's goroutines allocate meanwhile: building the
// request and the recorder is not counted (the allocs/op of -benchmem
// counts them too).
func BenchmarkHandlerAllocs(b *testing.B) {
	_, handler := benchStack(b, "metrics")
	run := randomID()
	var before, after runtime.MemStats
	var allocs, allocBytes uint64
	for b.Loop() {
		body, _ := json.Marshal(httpapi.AcquireRequest{UserID: run + "-" + strconv.Itoa(rand.IntN(1_000_000)), Plan: "three"})
		req := httptest.NewRequest(http.MethodPost, httpapi.PathAcquire, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		runtime.ReadMemStats(&before)
		handler.ServeHTTP(rec, req)
		runtime.ReadMemStats(&after)
		allocs += after.Mallocs - before.Mallocs
		allocBytes += after.TotalAlloc - before.TotalAlloc
		if rec.Code != http.StatusOK {
			b.Fatalf("acquire: %d %s", rec.Code, rec.Body)
		}
	}
	b.ReportMetric(float64(allocs)/float64(b.N), "handler-allocs/op")
	b.ReportMetric(float64(allocBytes)/float64(b.N), "handler-B/op")
}

// cpuTime is the CPU time this process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchLimiter(b *testing.B, lim *limiter.Limiter, user string) {
	res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three"})
	if err != nil || res.Degraded {
		b.Errorf("Acquire: %+v, %v", res, err)
	}
}

func benchHandler(b *testing.B, h http.Handler, user string) {
	body, _ := json.Marshal(httpapi.AcquireRequest{UserID: user, Plan: "three"})
	req := httptest.NewRequest(http.MethodPost, httpapi.PathAcquire, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		b.Errorf("acquire: %d %s", rec.Code, rec.Body)
	}
}

// benchStack returns a limiter on the shared Redis and its API handler,
// with every telemetry hook serve uses wired in unless mode is "off".
func benchStack(b *testing.B, mode string) (*limiter.Limiter, http.Handler) {
	b.Helper()
	quiet := slog.New(slog.DiscardHandler)
	opts := limitertest.Options{
		Redis:   cluster.Options{Timeout: 10 * time.Second, Logger: quiet},
		Limiter: limiter.Options{Logger: quiet},
	}
	srvOpts := server.Options{Logger: quiet}
	if mode != "off" {
		var telOpts telemetry.Options
		if mode == "on" {
			telOpts.SpanExporter = discard{}
		}
		tel, err := telemetry.New(context.Background(), telOpts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
		opts.Redis.NewRedis = tel.NewRedisClient
		opts.Limiter.TracerProvider, opts.NewObserver = tel.TracerProvider, observer(tel)
		srvOpts.Middleware, srvOpts.Metrics = tel.Middleware, tel.MetricsHandler()
	}
	lim := limitertest.New(b, opts).Limiter
	return lim, server.New(lim, srvOpts).Handler()
}
