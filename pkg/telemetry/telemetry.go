// Package telemetry builds the limiter's OpenTelemetry providers from config
// and the standard OTEL_* environment, and the pieces that use them: the
// HTTP server middleware, a traced Redis client, and the limiter's metrics
// (a limiter.Observer).
//
// Main builds one Telemetry and passes its providers to each package; no
// package reads the OpenTelemetry globals.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"

	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Options configure New. Zero values take the documented defaults.
type Options struct {
	// ServiceName is the service.name resource attribute. Default
	// "limiter". OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override it.
	ServiceName string
	// OTLPEndpoint receives the traces: host:port or http://host:port
	// (plaintext), or https://host:port (TLS). OTEL_EXPORTER_OTLP_PROTOCOL
	// picks grpc (default) or http/protobuf, to which /v1/traces is added.
	// Default "": the standard OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT if set,
	// else http://localhost:4317 (4318 for HTTP) if OTEL_TRACES_EXPORTER
	// is otlp, else traces are not recorded at all. OTEL_TRACES_EXPORTER=none
	// and OTEL_SDK_DISABLED=true turn traces off whatever the endpoint.
	OTLPEndpoint string
	// Version and Commit label limiter_build_info. Default "unknown".
	Version string
	Commit  string
	// SpanExporter, when set, receives the spans instead of OTLP (tests,
	// or another backend), whatever OTEL_TRACES_EXPORTER says; only
	// OTEL_SDK_DISABLED=true turns it off.
	SpanExporter sdktrace.SpanExporter
}

// Telemetry holds the providers. Shut it down to flush what is buffered.
type Telemetry struct {
	// TracerProvider is a no-op one when nothing is exported.
	TracerProvider trace.TracerProvider
	// MeterProvider feeds the Prometheus registry served by MetricsHandler.
	MeterProvider metric.MeterProvider
	// Propagator reads and writes the trace context of requests: the
	// propagators OTEL_PROPAGATORS names (tracecontext, baggage, b3,
	// b3multi, jaeger, xray, ottrace, none). Default W3C trace context
	// and baggage.
	Propagator propagation.TextMapPropagator

	metrics     http.Handler
	httpMetrics *httpMetrics
	exporter    string
	shutdown    []func(context.Context) error
}

// New builds the providers. It does not touch the network: exporters
// connect when they first send.
func New(ctx context.Context, opts Options) (*Telemetry, error) {
	if opts.ServiceName == "" {
		opts.ServiceName = "limiter"
	}
	if opts.Version == "" {
		opts.Version = "unknown"
	}
	if opts.Commit == "" {
		opts.Commit = "unknown"
	}
	// FromEnv comes last so that OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES win over the config.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(opts.ServiceName), semconv.ServiceVersion(opts.Version)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	prop, err := propagatorFromEnv()
	if err != nil {
		return nil, err
	}
	t := &Telemetry{Propagator: prop, TracerProvider: noop.NewTracerProvider()}

	mp, handler, err := newMeterProvider(res)
	if err != nil {
		return nil, err
	}
	t.MeterProvider, t.metrics = mp, handler
	t.shutdown = append(t.shutdown, mp.Shutdown)
	if err := buildInfo(mp, opts.Version, opts.Commit, runtime.Version()); err != nil {
		return nil, err
	}
	if t.httpMetrics, err = newHTTPMetrics(mp); err != nil {
		return nil, err
	}

	exp, describe, err := spanExporter(ctx, opts)
	if err != nil {
		return nil, errors.Join(err, t.Shutdown(ctx))
	}
	if exp != nil {
		// The sampler comes from OTEL_TRACES_SAMPLER[_ARG] (default:
		// parent-based, always on), the batching from OTEL_BSP_*.
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		t.TracerProvider, t.exporter = tp, describe
		t.shutdown = append(t.shutdown, tp.Shutdown)
	}
	return t, nil
}

// Exporter says where spans go ("otlp grpc http://collector:4317"), or ""
// when traces are not recorded.
func (t *Telemetry) Exporter() string { return t.exporter }

// MetricsHandler serves the metrics in the Prometheus text format (the ops
// listener's /metrics).
func (t *Telemetry) MetricsHandler() http.Handler { return t.metrics }

// Shutdown flushes buffered spans and stops the providers. ctx bounds the
// flush.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	t.shutdown = nil
	return errors.Join(errs...)
}

// propagatorFromEnv returns the propagators OTEL_PROPAGATORS names, a
// comma-separated list; unset, W3C trace context and baggage.
func propagatorFromEnv() (propagation.TextMapPropagator, error) {
	env := os.Getenv("OTEL_PROPAGATORS")
	var names []string
	for name := range strings.SplitSeq(env, ",") {
		if name = strings.TrimSpace(name); name != "" {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}), nil
	}
	prop, err := autoprop.TextMapPropagator(names...)
	if err != nil {
		return nil, fmt.Errorf("OTEL_PROPAGATORS=%q: %w", env, err)
	}
	return prop, nil
}
