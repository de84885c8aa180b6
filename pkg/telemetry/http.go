package telemetry

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Middleware traces every request as a server span named by its route
// ("POST /v1/slots/acquire"), continuing the caller's W3C trace context,
// and records the HTTP server metrics. It is a server.Options.Middleware.
func (t *Telemetry) Middleware(next http.Handler) http.Handler {
	return otelhttp.NewHandler(routePath(next), "limiter",
		otelhttp.WithTracerProvider(t.TracerProvider),
		otelhttp.WithMeterProvider(t.MeterProvider),
		otelhttp.WithPropagators(t.Propagator),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if r.Pattern != "" {
				return r.Pattern
			}
			return r.Method
		}),
	)
}

// routePath replaces the span's url.path with the route's template once
// the mux has matched it: admin paths carry user ids
// (/v1/admin/users/{user_id}/slots), which must not reach a span.
func routePath(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if r.Pattern == "" {
			return
		}
		path := r.Pattern
		if _, p, ok := strings.Cut(path, " "); ok {
			path = p
		}
		trace.SpanFromContext(r.Context()).SetAttributes(semconv.URLPath(path))
	})
}
