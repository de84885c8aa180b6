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
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
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
				// A user of its own per acquire: users drawn at random would
				// reach the limit of 3 once b.N grows to a fair share of the pool.
				var next atomic.Int64
				b.SetParallelism((benchClients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				cpu := cpuTime()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						user := run + "-" + strconv.FormatInt(next.Add(1), 10)
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
	for i := 0; b.Loop(); i++ {
		body, _ := json.Marshal(httpapi.AcquireRequest{UserID: run + "-" + strconv.Itoa(i), Plan: "three"})
		req := benchRequest(httpapi.PathAcquire, body)
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

// BenchmarkHeartbeatBatchHTTP: one heartbeat of 1000 held slots of 1000
// users, by the library (Limiter.HeartbeatBatch) and as a
// POST /v1/slots/heartbeats through the server's handler in process
// (reading and decoding the body, caller authentication, the middleware,
// encoding the answer; no sockets), on the same limiter with metrics on
// as serve runs, on the standalone Redis. Each op runs both, in an order
// that alternates, and times each with this process's CPU (Redis runs in
// another): library-cpu-us/slot, http-cpu-us/slot and their ratio,
// http/library.
func BenchmarkHeartbeatBatchHTTP(b *testing.B) {
	lim, handler := benchStack(b, "metrics")
	ctx := context.Background()
	run := randomID()
	slots := make([]httpapi.HeartbeatRequest, httpapi.MaxBatch)
	reqs := make([]limiter.HeartbeatRequest, len(slots))
	for i := range slots {
		slots[i] = httpapi.HeartbeatRequest{UserID: run + "-" + strconv.Itoa(i), Plan: "three", StreamID: "s" + strconv.Itoa(i)}
		reqs[i] = limiter.HeartbeatRequest{UserID: slots[i].UserID, Plan: slots[i].Plan, StreamID: slots[i].StreamID}
		if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: slots[i].UserID, Plan: "three", StreamID: slots[i].StreamID}); err != nil || !res.Granted || res.Degraded {
			b.Fatalf("Acquire: %+v, %v", res, err)
		}
	}
	body, _ := json.Marshal(httpapi.HeartbeatsRequest{Slots: slots})
	// Each side's answer is checked after its CPU is read: the checks
	// (two scans of the HTTP answer) are the benchmark's work, not the
	// server's. The recorder writes into one buffer kept across ops, as
	// serve writes into its connection's: growing a new one per answer
	// is the recorder's work.
	var results []limiter.HeartbeatResult
	var errs []error
	library := func() { results, errs = lim.HeartbeatBatch(ctx, reqs) }
	checkLibrary := func() {
		for i := range results {
			if errs[i] != nil || !results[i].Alive || results[i].Degraded {
				b.Fatalf("HeartbeatBatch: slot %d: %+v, %v", i, results[i], errs[i])
			}
		}
	}
	var rec *httptest.ResponseRecorder
	answer := new(bytes.Buffer)
	overHTTP := func() {
		answer.Reset()
		rec = httptest.NewRecorder()
		rec.Body = answer
		handler.ServeHTTP(rec, benchRequest(httpapi.PathHeartbeats, body))
	}
	checkHTTP := func() {
		if rec.Code != http.StatusOK || bytes.Contains(answer.Bytes(), []byte(`"alive":false`)) || bytes.Contains(answer.Bytes(), []byte(`"degraded":true`)) {
			b.Fatalf("heartbeats: %d %.300s", rec.Code, answer)
		}
	}
	// Once each untimed: the first batch fills the pools and connections.
	library()
	checkLibrary()
	overHTTP()
	checkHTTP()
	var spent [2]time.Duration // library, http
	for i := 0; b.Loop(); i++ {
		for j := range 2 {
			side := (i + j) % 2
			start := cpuTime()
			if side == 0 {
				library()
			} else {
				overHTTP()
			}
			spent[side] += cpuTime() - start
			if side == 0 {
				checkLibrary()
			} else {
				checkHTTP()
			}
		}
	}
	perSlot := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N*len(slots)) }
	b.ReportMetric(perSlot(spent[0]), "library-cpu-us/slot")
	b.ReportMetric(perSlot(spent[1]), "http-cpu-us/slot")
	b.ReportMetric(perSlot(spent[1])/perSlot(spent[0]), "http/library")
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
	req := benchRequest(httpapi.PathAcquire, body)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		b.Errorf("acquire: %d %s", rec.Code, rec.Body)
	}
}

// benchToken is the caller token of every benchmark request: the API
// authenticates its callers (api.tokensFile), as serve runs in production.
const benchToken = "bench-token-0123456789abcdef"

// benchRequest is a POST of body to path as a caller sends it.
func benchRequest(path string, body []byte) *http.Request {
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+benchToken)
	return req
}

// benchStack returns a limiter on the shared Redis and its API handler,
// with every telemetry hook serve uses wired in unless mode is "off", and
// caller authentication by a tokens file that holds benchToken.
func benchStack(b *testing.B, mode string) (*limiter.Limiter, http.Handler) {
	b.Helper()
	quiet := slog.New(slog.DiscardHandler)
	opts := limitertest.Options{
		Redis:   cluster.Options{Timeout: 10 * time.Second, Logger: quiet},
		Limiter: limiter.Options{Logger: quiet},
	}
	tokens := filepath.Join(b.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("bench "+benchToken+" *\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	callers, err := server.LoadCallers(server.CallersOptions{TokensFile: tokens, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	srvOpts := server.Options{Logger: quiet, Callers: callers}
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
