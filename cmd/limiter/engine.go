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

// limitTables are the tables a replica enforces, filled by one source
// (tiers.source): the plans, and the pools.
type limitTables struct {
	tiers *tiers.Table
	pools *pools.Table
}

// startLimitTables returns the tables of the configured source, and stop,
// which waits for the source's watch (if any) to end with ctx. A watch
// that ends on its own calls fail. With tiers.source static both come from
// the config file (tiers.static, pools.static); with kubernetes, both from
// the objects of tiers.namespace (LimitTiers, LimitPools).
func startLimitTables(ctx context.Context, cfg config.Config, deps serveDeps, logger *slog.Logger, fail context.CancelCauseFunc) (tables limitTables, stop func(), err error) {
	switch cfg.Tiers.Source {
	case config.SourceStatic:
		tables = limitTables{tiers: tiers.NewTable(), pools: pools.NewTable()}
		if err := tables.tiers.Replace(cfg.StaticTiers()); err != nil {
			return limitTables{}, nil, fmt.Errorf("%w: tiers.static: %w", config.ErrInvalid, err)
		}
		if err := tables.pools.Replace(cfg.StaticPools()); err != nil {
			return limitTables{}, nil, fmt.Errorf("%w: pools.static: %w", config.ErrInvalid, err)
		}
		return tables, func() {}, nil
	case config.SourceKubernetes:
		return startKubernetesTiers(ctx, cfg, deps.watchTiers, logger, fail)
	default:
		return limitTables{}, nil, fmt.Errorf("%w: tiers.source %q", config.ErrInvalid, cfg.Tiers.Source)
	}
}

// startEngine starts the engine of cfg for the tables. holders names what
// runs on it ("replica", "proxy") in the embedded store's warning. stop
// closes Redis, then flushes the last spans; it is to be called after the
// drain, and is a no-op when startEngine fails (it cleans up itself).
func startEngine(ctx context.Context, cfg config.Config, tables limitTables, logger *slog.Logger, holders string) (e engine, stop func(), err error) {
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
	observer, err := telemetry.NewObserver(e.tel.MeterProvider, tables.tiers, telemetry.ObserverOptions{UsedMaxWindow: cfg.Telemetry.SlotsUsedMaxWindow, Pools: tables.pools})
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
		logger.Warn(fmt.Sprintf("redis.addrs is empty: using the embedded store, which holds this %s's slots only, in memory: "+
			"do not run more than one %[1]s on it, and expect a restart to lose every slot, override and audit record", holders), "addr", e.redis.Addrs()[0])
	}

	e.lim = limiter.New(e.redis, tables.tiers, limiter.Options{
		Pools:          tables.pools,
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
