package telemetry_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/telemetry"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// stack is a limiter on the shared Redis with tel's providers wired in as
// serve wires them, behind an httptest server.
type stack struct {
	tel *telemetry.Telemetry
	lim *limiter.Limiter
	url string
}

func newStack(t testing.TB, tel *telemetry.Telemetry) *stack {
	t.Helper()
	lim := limitertest.New(t, limitertest.Options{
		Redis:       cluster.Options{NewRedis: tel.NewRedisClient, Timeout: 10 * time.Second},
		Limiter:     limiter.Options{TracerProvider: tel.TracerProvider},
		NewObserver: observer(tel),
	}).Limiter
	srv := server.New(lim, server.Options{Middleware: tel.Middleware, Metrics: tel.MetricsHandler()})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &stack{tel: tel, lim: lim, url: ts.URL}
}

// observer builds the limiter's Observer on tel's meter provider, as serve
// does.
func observer(tel *telemetry.Telemetry) func(*tiers.Table) (limiter.Observer, error) {
	return func(table *tiers.Table) (limiter.Observer, error) {
		return telemetry.NewObserver(tel.MeterProvider, table, telemetry.ObserverOptions{})
	}
}

func randomID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// TestAcquireTrace: an application's trace continues through pkg/client,
// the HTTP server and the limiter into Redis: server span -> limiter.acquire
// -> "EVALSHA acquire", all in the caller's trace, with the limiter's
// attributes and no user id anywhere.
func TestAcquireTrace(t *testing.T) {
	ctx := context.Background()
	exported := newExporter()
	tel, err := telemetry.New(ctx, telemetry.Options{SpanExporter: exported})
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t, tel)

	// The application: its own tracer provider, and the limiter client
	// injecting W3C trace context through otelhttp's transport.
	appSpans := tracetest.NewInMemoryExporter()
	app := sdktrace.NewTracerProvider(sdktrace.WithSyncer(appSpans))
	c, err := client.New(s.url, client.WithTransport(func(rt http.RoundTripper) http.RoundTripper {
		return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(app), otelhttp.WithPropagators(propagation.TraceContext{}))
	}))
	if err != nil {
		t.Fatal(err)
	}
	user := "user-" + randomID()
	appCtx, appSpan := app.Tracer("app").Start(ctx, "app.stream")
	lease, err := c.Acquire(appCtx, user, "three")
	appSpan.End()
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	_ = lease
	if err := tel.Shutdown(ctx); err != nil { // flushes
		t.Fatalf("Shutdown: %v", err)
	}
	_ = c.Close(ctx)

	spans := exported.GetSpans()
	server := findSpan(t, spans, "POST /v1/slots/acquire")
	acquire := findSpan(t, spans, "limiter.acquire")
	redis := findSpan(t, spans, "EVALSHA acquire")

	caller := appSpan.SpanContext()
	for _, sp := range []tracetest.SpanStub{server, acquire, redis} {
		if got := sp.SpanContext.TraceID(); got != caller.TraceID() {
			t.Errorf("span %q: trace id %s, want the caller's %s", sp.Name, got, caller.TraceID())
		}
	}
	// app.stream -> the client's HTTP span (otelhttp transport) -> server.
	var sent tracetest.SpanStub
	for _, sp := range appSpans.GetSpans() {
		if sp.SpanKind == trace.SpanKindClient && sp.Parent.SpanID() == caller.SpanID() {
			sent = sp
		}
	}
	if !sent.SpanContext.IsValid() {
		t.Fatalf("the application recorded no HTTP client span under app.stream: %v", appSpans.GetSpans())
	}
	if server.Parent.SpanID() != sent.SpanContext.SpanID() || !server.Parent.IsRemote() {
		t.Errorf("server span parent %s (remote %v), want the caller's HTTP span %s", server.Parent.SpanID(), server.Parent.IsRemote(), sent.SpanContext.SpanID())
	}
	if acquire.Parent.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("limiter.acquire parent %s, want the server span %s", acquire.Parent.SpanID(), server.SpanContext.SpanID())
	}
	if redis.Parent.SpanID() != acquire.SpanContext.SpanID() {
		t.Errorf("redis span parent %s, want limiter.acquire %s", redis.Parent.SpanID(), acquire.SpanContext.SpanID())
	}
	if server.SpanKind != trace.SpanKindServer || redis.SpanKind != trace.SpanKindClient {
		t.Errorf("kinds: server span %v, redis span %v; want server, client", server.SpanKind, redis.SpanKind)
	}

	want := map[attribute.Key]attribute.Value{
		"limiter.plan":         attribute.StringValue("three"),
		"limiter.failure_mode": attribute.StringValue("Open"),
		"limiter.limit":        attribute.IntValue(3),
		"limiter.granted":      attribute.BoolValue(true),
		"limiter.used":         attribute.IntValue(1),
		"limiter.pruned":       attribute.IntValue(0),
		"limiter.degraded":     attribute.BoolValue(false),
	}
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range acquire.Attributes {
		got[kv.Key] = kv.Value
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("limiter.acquire attribute %s = %v, want %v", k, got[k].Emit(), v.Emit())
		}
	}
	if got, want := attr(server, "url.path"), "/v1/slots/acquire"; got != want {
		t.Errorf("server span url.path = %q, want %q", got, want)
	}
	if got, want := attr(redis, "db.system"), "redis"; got != want {
		t.Errorf("redis span db.system = %q, want %q", got, want)
	}
	for _, sp := range spans {
		for _, kv := range sp.Attributes {
			if strings.Contains(kv.Value.Emit(), user) {
				t.Errorf("span %q attribute %s carries the user id: %q", sp.Name, kv.Key, kv.Value.Emit())
			}
		}
	}
}

// TestAdminPathRedacted: a route whose path carries a user id records its
// template as url.path.
func TestAdminPathRedacted(t *testing.T) {
	ctx := context.Background()
	exported := newExporter()
	tel, err := telemetry.New(ctx, telemetry.Options{SpanExporter: exported})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/admin/users/{user_id}/slots", func(w http.ResponseWriter, r *http.Request) {})
	ts := httptest.NewServer(tel.Middleware(mux))
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/v1/admin/users/alice-secret/slots")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_ = tel.Shutdown(ctx)
	sp := findSpan(t, exported.GetSpans(), "GET /v1/admin/users/{user_id}/slots")
	if got, want := attr(sp, "url.path"), "/v1/admin/users/{user_id}/slots"; got != want {
		t.Errorf("url.path = %q, want %q", got, want)
	}
}

// exporter keeps its spans when shut down (InMemoryExporter forgets them),
// so a test can flush through Telemetry.Shutdown, then read.
type exporter struct{ *tracetest.InMemoryExporter }

func newExporter() exporter                     { return exporter{tracetest.NewInMemoryExporter()} }
func (exporter) Shutdown(context.Context) error { return nil }

func findSpan(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	for _, sp := range spans {
		if sp.Name == name {
			return sp
		}
	}
	var names []string
	for _, sp := range spans {
		names = append(names, sp.Name)
	}
	t.Fatalf("no span %q among %q", name, names)
	return tracetest.SpanStub{}
}

func attr(sp tracetest.SpanStub, key attribute.Key) string {
	for _, kv := range sp.Attributes {
		if kv.Key == key {
			return kv.Value.Emit()
		}
	}
	return ""
}
