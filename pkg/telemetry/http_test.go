package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// otelhttpStack is the middleware Middleware replaced: otelhttp's handler,
// its metrics filtered by the view serve had (no attribute from a request
// header), the span's url.path set to the route's template after the mux.
func otelhttpStack(t testing.TB, next http.Handler, traced bool) (http.Handler, http.Handler, *tracetest.InMemoryExporter) {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes), otelprom.WithoutScopeInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithView(sdkmetric.NewView(
		sdkmetric.Instrument{Scope: instrumentation.Scope{Name: otelhttp.ScopeName}},
		sdkmetric.Stream{AttributeFilter: attribute.NewAllowKeysFilter(
			semconv.HTTPRequestMethodKey, semconv.HTTPResponseStatusCodeKey, semconv.HTTPRouteKey,
			semconv.URLSchemeKey, semconv.NetworkProtocolNameKey, semconv.NetworkProtocolVersionKey, semconv.ErrorTypeKey,
		)},
	)))
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = tp.Shutdown(context.Background()) })
	routePath := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if _, path, ok := strings.Cut(r.Pattern, " "); ok {
			trace.SpanFromContext(r.Context()).SetAttributes(semconv.URLPath(path))
		} else if r.Pattern != "" {
			trace.SpanFromContext(r.Context()).SetAttributes(semconv.URLPath(r.Pattern))
		}
	})
	var tracing trace.TracerProvider = tp
	if !traced {
		tracing = noop.NewTracerProvider()
	}
	h := otelhttp.NewHandler(routePath, "limiter",
		otelhttp.WithTracerProvider(tracing), otelhttp.WithMeterProvider(mp),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return spanName(r) }))
	return h, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), spans
}

// testRoutes answer as the API's routes do: a body read and answered, a
// 404, a 405 and a 500, one route with a user id in its path.
func testRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/slots/acquire", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"granted":true}`)
	})
	mux.HandleFunc("/v1/slots/acquire", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusMethodNotAllowed)
	})
	mux.HandleFunc("GET /v1/admin/users/{user_id}/slots", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "unavailable")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	return mux
}

// sendTestRequests sends the same requests to url, each with the caller's
// trace context.
func sendTestRequests(t *testing.T, url string) {
	t.Helper()
	parent := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, req := range []struct{ method, path, body string }{
		{"POST", "/v1/slots/acquire", `{"user_id":"u","plan":"three"}`},
		{"POST", "/v1/slots/acquire", `{"user_id":"v","plan":"three"}`},
		{"GET", "/v1/slots/acquire", ""},
		{"post", "/v1/slots/acquire", `{}`},
		{"FOO", "/v1/slots/acquire", ""},
		{"GET", "/v1/admin/users/alice-secret/slots", ""},
		{"GET", "/nowhere", ""},
	} {
		r, err := http.NewRequest(req.method, url+req.path, strings.NewReader(req.body))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Traceparent", parent)
		r.Header.Set("User-Agent", "test-agent/1")
		r.Header.Set("X-Forwarded-For", "203.0.113.7, 10.0.0.1")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// httpSeries returns the HTTP server metrics of /metrics: the HELP and
// TYPE lines and every series, with the value of those that do not count
// time (the duration's buckets and sum differ from run to run).
func httpSeries(t *testing.T, metrics http.Handler) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var out []string
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if !strings.Contains(line, "http_server_") {
			continue
		}
		if strings.HasPrefix(line, "http_server_request_duration_seconds_bucket") || strings.HasPrefix(line, "http_server_request_duration_seconds_sum") {
			line = line[:strings.LastIndexByte(line, ' ')]
		}
		out = append(out, line)
	}
	slices.Sort(out)
	return out
}

// TestMiddlewareAsOtelhttp: the same requests through Middleware and
// through otelhttp as serve had it make the same HTTP server metrics
// (names, units, help, buckets, labels, counts, body sizes) and the same
// server spans (name, kind, parent, status, attributes).
func TestMiddlewareAsOtelhttp(t *testing.T) {
	old, oldMetrics, oldSpans := otelhttpStack(t, testRoutes(), true)
	oldSrv := httptest.NewServer(old)
	defer oldSrv.Close()

	newSpans := keptSpans{tracetest.NewInMemoryExporter()}
	tel, err := New(context.Background(), Options{SpanExporter: newSpans})
	if err != nil {
		t.Fatal(err)
	}
	newSrv := httptest.NewServer(tel.Middleware(testRoutes()))
	defer newSrv.Close()

	sendTestRequests(t, oldSrv.URL)
	sendTestRequests(t, newSrv.URL)
	got, want := httpSeries(t, tel.MetricsHandler()), httpSeries(t, oldMetrics)
	if len(want) < 20 {
		t.Fatalf("otelhttp made only %d HTTP server lines: %q", len(want), want)
	}
	if !slices.Equal(got, want) {
		t.Errorf("HTTP server metrics:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}

	gotSpans := spanShapes(t, flush(t, tel, newSpans), newSrv.URL)
	wantSpans := spanShapes(t, oldSpans.GetSpans(), oldSrv.URL)
	if !slices.Equal(gotSpans, wantSpans) {
		t.Errorf("server spans:\n got %s\nwant %s", strings.Join(gotSpans, "\n     "), strings.Join(wantSpans, "\n     "))
	}
}

// keptSpans keeps its spans when shut down (InMemoryExporter forgets
// them), so a test can flush through Telemetry.Shutdown, then read.
type keptSpans struct{ *tracetest.InMemoryExporter }

func (keptSpans) Shutdown(context.Context) error { return nil }

func flush(t *testing.T, tel *Telemetry, spans keptSpans) tracetest.SpanStubs {
	t.Helper()
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	return spans.GetSpans()
}

// spanShapes describes each span, one line each, ports of the servers and
// clients left out.
func spanShapes(t *testing.T, spans tracetest.SpanStubs, url string) []string {
	t.Helper()
	var out []string
	for _, sp := range spans {
		var attrs []string
		for _, kv := range sp.Attributes {
			v := kv.Value.Emit()
			switch kv.Key {
			case semconv.ServerPortKey, semconv.NetworkPeerPortKey:
				v = "port"
			}
			attrs = append(attrs, string(kv.Key)+"="+v)
		}
		slices.Sort(attrs)
		out = append(out, sp.Name+" "+sp.SpanKind.String()+" parent="+sp.Parent.SpanID().String()+
			" status="+sp.Status.Code.String()+" "+strings.Join(attrs, " "))
	}
	slices.Sort(out)
	if len(out) != 7 {
		t.Fatalf("%d spans from %s, want 7: %q", len(out), url, out)
	}
	return out
}

// Without an exporter no span is started: the handler sees no span, and
// the request's context as it came.
func TestMiddlewareWithoutExporterStartsNoSpan(t *testing.T) {
	tel, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	type key struct{}
	var sawSpan, sawValue bool
	h := tel.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawSpan = trace.SpanContextFromContext(r.Context()).IsValid()
		sawValue = r.Context().Value(key{}) == "v"
	}))
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	r = r.WithContext(context.WithValue(r.Context(), key{}, "v"))
	h.ServeHTTP(httptest.NewRecorder(), r)
	if sawSpan || !sawValue {
		t.Errorf("handler saw a span %v, the request's context %v; want no span, the context", sawSpan, sawValue)
	}
}

// The response writer the handler gets passes flushes and
// http.ResponseController through, and the body it read is restored.
func TestMiddlewareResponseWriter(t *testing.T) {
	tel, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	var flushErr error
	h := tel.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "part")
		flushErr = http.NewResponseController(w).Flush()
	}))
	rec := httptest.NewRecorder()
	body := io.NopCloser(strings.NewReader("{}"))
	r := httptest.NewRequest("POST", "/", nil)
	r.Body = body
	h.ServeHTTP(rec, r)
	if flushErr != nil || !rec.Flushed {
		t.Errorf("Flush through ResponseController: %v, flushed %v; want nil, true", flushErr, rec.Flushed)
	}
	if r.Body != body {
		t.Errorf("request body after the middleware: %T, want the one it came with", r.Body)
	}
}

// BenchmarkMiddleware: one POST through Middleware and through otelhttp as
// serve had it, metrics on and no exporter, around a handler that reads
// the body and answers; the handler's own cost is in both.
func BenchmarkMiddleware(b *testing.B) {
	tel, err := New(context.Background(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	old, _, _ := otelhttpStack(b, testRoutes(), false)
	const body = `{"user_id":"u","plan":"three"}`
	for _, tc := range []struct {
		name string
		h    http.Handler
	}{{"lean", tel.Middleware(testRoutes())}, {"otelhttp", old}} {
		b.Run(tc.name, func(b *testing.B) {
			r := httptest.NewRequest("POST", "/v1/slots/acquire", nil)
			rd := strings.NewReader(body)
			rec := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(body)
				r.Body = io.NopCloser(rd)
				r.Pattern = ""
				rec.Body.Reset()
				tc.h.ServeHTTP(rec, r)
			}
		})
	}
}
