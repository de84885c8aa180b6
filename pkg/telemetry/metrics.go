package telemetry

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
)

// meterName is the instrumentation scope of the limiter's own metrics.
const meterName = "github.com/joishi/limiter/pkg/telemetry"

// newMeterProvider returns a meter provider whose metrics are served, with
// the Go runtime's and the process's, from a registry of its own.
func newMeterProvider(res *resource.Resource) (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		// limiter.acquire (unit {acquire}) becomes limiter_acquire_total,
		// limiter.redis.duration (unit s) limiter_redis_duration_seconds.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	// No exemplars: /metrics is Prometheus's text format, which carries
	// none, and the SDK's default looks each measurement's context over for
	// a sampled span, a walk of the whole context of a request or a Redis
	// call, on every measurement of every instrument.
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res),
		sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	return mp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// buildInfo registers limiter_build_info{version, commit, go_version} 1.
func buildInfo(mp metric.MeterProvider, version, commit, goVersion string) error {
	attrs := metric.WithAttributes(
		attribute.String("version", version),
		attribute.String("commit", commit),
		attribute.String("go_version", goVersion),
	)
	_, err := mp.Meter(meterName).Int64ObservableGauge("limiter.build.info",
		metric.WithDescription("Always 1; its labels say which build runs."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(1, attrs)
			return nil
		}))
	return err
}

// RegisterRedisUp registers limiter_redis_up: 1 while redis.Up() (Redis
// answers this replica; cluster.Client.Up states the rule), else 0. It has
// no label.
func RegisterRedisUp(mp metric.MeterProvider, redis interface{ Up() bool }) error {
	_, err := mp.Meter(meterName).Int64ObservableGauge("limiter.redis.up",
		metric.WithDescription("1 while Redis answers this replica's calls and probes, 0 before it first answers and once calls have failed (timeouts, connection errors, cluster down) with none answered for a second."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			if redis.Up() {
				o.Observe(1)
			} else {
				o.Observe(0)
			}
			return nil
		}))
	return err
}

// RegisterOverridesActive registers limiter_overrides_active: the support
// overrides in force, as counter counts them (limiter.ActiveOverrides: one
// Redis read per scrape, bounded by the limiter's per-call deadline). It
// has no label: never a user. When Redis does not answer, the scrape has
// no sample rather than a wrong one.
func RegisterOverridesActive(mp metric.MeterProvider, counter interface {
	ActiveOverrides(context.Context) (int, error)
}) error {
	_, err := mp.Meter(meterName).Int64ObservableGauge("limiter.overrides.active", metric.WithUnit("{override}"),
		metric.WithDescription("Support overrides of a user's limit in force (POST /v1/admin/users/{user_id}/override), counted across all replicas: read from Redis at each scrape."),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			n, err := counter.ActiveOverrides(ctx)
			if err != nil {
				return nil // no sample: unknown, not 0
			}
			o.Observe(int64(n))
			return nil
		}))
	return err
}
