package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/config"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/telemetry"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel"
)

// engine is what serve and proxy both run on: telemetry, the Redis client
// and the limiter over them.
type engine struct {
	tel   *telemetry.Telemetry
	redis *cluster.Client
	lim   *limiter.Limiter
}

// startEngine starts the engine of cfg for the tier table. holders names
// what runs on it ("replica", "proxy") in the embedded store's warning.
// stop closes Redis, then flushes the last spans; it is to be called after
// the drain, and is a no-op when startEngine fails (it cleans up itself).
func startEngine(ctx context.Context, cfg config.Config, table *tiers.Table, logger *slog.Logger, holders string) (e engine, stop func(), err error) {
	var undo []func()
	stop = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
			stop = func() {}
		}
	}()

	// Telemetry: the only place the OpenTelemetry globals are touched.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { logger.Warn("telemetry", "err", err) }))
	b := currentBuild()
	e.tel, err = telemetry.New(ctx, telemetry.Options{ServiceName: cfg.Telemetry.ServiceName,
		OTLPEndpoint: cfg.Telemetry.OTLPEndpoint, Version: b.Version, Commit: b.Commit})
	if err != nil {
		return e, stop, fmt.Errorf("telemetry: %w", err)
	}
	undo = append(undo, func() {
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.tel.Shutdown(flushCtx); err != nil {
			logger.Warn("flushing telemetry", "err", err)
		}
	})
	logger.Info("telemetry", "traces", cmp.Or(e.tel.Exporter(), "off"), "metrics", cfg.Ops.Addr+"/metrics")
	observer, err := telemetry.NewObserver(e.tel.MeterProvider, table, telemetry.ObserverOptions{UsedMaxWindow: cfg.Telemetry.SlotsUsedMaxWindow})
	if err != nil {
		return e, stop, fmt.Errorf("telemetry: %w", err)
	}

	redisOpts, err := cfg.ClusterOptions()
	if err != nil {
		return e, stop, err
	}
	redisOpts.Logger = logger.With("component", "redis")
	redisOpts.NewRedis = e.tel.NewRedisClient
	// Loaded on every node at connect, before readiness (see
	// cluster.Client.Warmed): the first calls find them.
	redisOpts.Scripts = slices.Collect(maps.Values(lua.Sources()))
	e.redis, err = cluster.New(redisOpts)
	if err != nil {
		return e, stop, fmt.Errorf("redis: %w", err)
	}
	undo = append(undo, e.redis.Close)
	if err := telemetry.RegisterRedisUp(e.tel.MeterProvider, e.redis); err != nil {
		return e, stop, fmt.Errorf("telemetry: %w", err)
	}
	if e.redis.Embedded() {
		logger.Warn(fmt.Sprintf("redis.addrs is empty: using the embedded store, which holds this %s's slots only; "+
			"do not run more than one %[1]s on it", holders), "addr", e.redis.Addrs()[0])
	}

	poolTable := pools.NewTable()
	if err := poolTable.Replace(cfg.StaticPools()); err != nil {
		return e, stop, fmt.Errorf("%w: pools.static: %w", config.ErrInvalid, err)
	}
	e.lim = limiter.New(e.redis, table, limiter.Options{
		Pools:          poolTable,
		Keys:           keys.Schema{Prefix: cfg.Redis.KeyPrefix},
		Logger:         logger,
		Observer:       observer,
		TracerProvider: e.tel.TracerProvider,
		SyncReplicas:   cfg.Redis.SyncReplicas,
	})
	if err := telemetry.RegisterOverridesActive(e.tel.MeterProvider, e.lim); err != nil {
		return e, stop, fmt.Errorf("telemetry: %w", err)
	}
	return e, stop, nil
}
