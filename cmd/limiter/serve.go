package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/config"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/telemetry"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel"
)

// serveDeps is what `limiter serve` is given rather than configured with.
type serveDeps struct {
	// logs receives the service's log lines.
	logs io.Writer
	// watchTiers runs the LimitTier watch: (*controller.Controller).Start,
	// or in tests a stand-in that dies on demand.
	watchTiers tierWatch
}

// runServe runs one limiter replica with cfg until ctx ends, then drains
// and returns nil. It logs to deps.logs. Should the tier source fail for
// good (the LimitTier watch ends), it drains too, and returns that error.
func runServe(ctx context.Context, cfg config.Config, deps serveDeps) error {
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	logger := newLogger(cfg.Log, deps.logs)
	b := currentBuild()
	logger.Info("starting", "version", b.Version, "commit", b.Commit, "go", b.Go)

	table, stopTiers, err := tierTable(ctx, cfg, deps, logger, fail)
	if err != nil {
		return err
	}
	defer stopTiers()
	if cfg.Tiers.Source == config.SourceStatic {
		logger.Info("tiers loaded", "source", cfg.Tiers.Source, "tiers", table.Len())
	} else {
		logger.Info("watching LimitTier objects; ready once the first list is in", "namespace", cfg.Tiers.Namespace)
	}

	// Telemetry: the only place the OpenTelemetry globals are touched.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { logger.Warn("telemetry", "err", err) }))
	tel, err := telemetry.New(ctx, telemetry.Options{ServiceName: cfg.Telemetry.ServiceName,
		OTLPEndpoint: cfg.Telemetry.OTLPEndpoint, Version: b.Version, Commit: b.Commit})
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	defer func() { // after the drain: flush the last spans
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(flushCtx); err != nil {
			logger.Warn("flushing telemetry", "err", err)
		}
	}()
	logger.Info("telemetry", "traces", cmp.Or(tel.Exporter(), "off"), "metrics", cfg.Ops.Addr+"/metrics")
	observer, err := telemetry.NewObserver(tel.MeterProvider, table, telemetry.ObserverOptions{UsedMaxWindow: cfg.Telemetry.SlotsUsedMaxWindow})
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}

	redisOpts, err := cfg.ClusterOptions()
	if err != nil {
		return err
	}
	redisOpts.Logger = logger.With("component", "redis")
	redisOpts.NewRedis = tel.NewRedisClient
	redis, err := cluster.New(redisOpts)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer redis.Close()
	if err := telemetry.RegisterRedisUp(tel.MeterProvider, redis); err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	if redis.Embedded() {
		logger.Warn("redis.addrs is empty: using the embedded store, which holds this replica's slots only; "+
			"do not run more than one replica on it", "addr", redis.Addrs()[0])
	}

	lim := limiter.New(redis, table, limiter.Options{
		Keys:           keys.Schema{Prefix: cfg.Redis.KeyPrefix},
		Logger:         logger,
		Observer:       observer,
		TracerProvider: tel.TracerProvider,
		SyncReplicas:   cfg.Redis.SyncReplicas,
	})
	if err := telemetry.RegisterOverridesActive(tel.MeterProvider, lim); err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	callers, stopCallers, err := startCallers(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer stopCallers()
	admin, stopAdmin, err := startAdmin(ctx, cfg, lim, logger)
	if err != nil {
		return err
	}
	defer stopAdmin()
	srvOpts := server.Options{Logger: logger, Metrics: tel.MetricsHandler(), Middleware: tel.Middleware, Admin: admin, Callers: callers}
	if cfg.Redis.RequiredForReadiness {
		srvOpts.RedisAnswered = redis.Answered
	}
	srv := server.New(lim, srvOpts)
	err = srv.Run(ctx, server.Listeners{API: cfg.HTTP.Addr, Ops: cfg.Ops.Addr, Admin: cfg.Admin.Addr, TLS: cfg.HTTP.TLS.Files(), Timeouts: cfg.HTTP.Timeouts()}, cfg.HTTP.ShutdownGrace)
	if cause := context.Cause(ctx); errors.Is(cause, errTierWatchStopped) {
		return cause
	}
	return err
}

// tierTable returns the table of the configured tier source, and stop,
// which waits for the source's watch (if any) to end with ctx. A watch that
// ends on its own calls fail.
func tierTable(ctx context.Context, cfg config.Config, deps serveDeps, logger *slog.Logger, fail context.CancelCauseFunc) (table *tiers.Table, stop func(), err error) {
	switch cfg.Tiers.Source {
	case config.SourceStatic:
		table = tiers.NewTable()
		if err := table.Replace(cfg.StaticTiers()); err != nil {
			return nil, nil, fmt.Errorf("%w: tiers.static: %w", config.ErrInvalid, err)
		}
		return table, func() {}, nil
	case config.SourceKubernetes:
		return startKubernetesTiers(ctx, cfg, deps.watchTiers, logger, fail)
	default:
		return nil, nil, fmt.Errorf("%w: tiers.source %q", config.ErrInvalid, cfg.Tiers.Source)
	}
}

func newLogger(cfg config.Log, out io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.SlogLevel()}
	if cfg.Format == config.FormatText {
		return slog.New(slog.NewTextHandler(out, opts))
	}
	return slog.New(slog.NewJSONHandler(out, opts))
}
