package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/config"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// errKubernetesTiers is returned for tiers.source kubernetes until the
// LimitTier controller is wired in.
var errKubernetesTiers = errors.New("tiers.source kubernetes is not built into this binary yet")

// runServe runs one limiter replica with cfg until ctx ends, then drains
// and returns nil. It logs to out.
func runServe(ctx context.Context, cfg config.Config, out io.Writer) error {
	logger := newLogger(cfg.Log, out)
	b := currentBuild()
	logger.Info("starting", "version", b.Version, "commit", b.Commit, "go", b.Go)

	table, err := tierTable(cfg)
	if err != nil {
		return err
	}
	logger.Info("tiers loaded", "source", cfg.Tiers.Source, "tiers", table.Len())

	redisOpts, err := cfg.ClusterOptions()
	if err != nil {
		return err
	}
	redisOpts.Logger = logger.With("component", "redis")
	redis, err := cluster.New(redisOpts)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer redis.Close()
	if redis.Embedded() {
		logger.Warn("redis.addrs is empty: using the embedded store, which holds this replica's slots only; "+
			"do not run more than one replica on it", "addr", redis.Addrs()[0])
	}

	// Not wired yet: say so rather than let an operator believe them on.
	if cfg.Admin.TokensFile != "" {
		logger.Warn("admin.tokensFile is set but the admin API is not wired into this binary yet")
	}
	if cfg.Telemetry.OTLPEndpoint != "" {
		logger.Warn("telemetry.otlpEndpoint is set but telemetry export is not wired into this binary yet")
	}

	lim := limiter.New(redis, table, limiter.Options{
		Keys:   cluster.Keys{Prefix: cfg.Redis.KeyPrefix},
		Logger: logger,
	})
	srv := server.New(lim, server.Options{Logger: logger})
	return srv.Run(ctx, server.Addrs{API: cfg.HTTP.Addr, Ops: cfg.Ops.Addr}, cfg.HTTP.ShutdownGrace)
}

// tierTable returns the table of the configured tier source.
func tierTable(cfg config.Config) (*tiers.Table, error) {
	table := tiers.NewTable()
	switch cfg.Tiers.Source {
	case config.SourceStatic:
		if err := table.Replace(cfg.StaticTiers()); err != nil {
			return nil, fmt.Errorf("%w: tiers.static: %w", config.ErrInvalid, err)
		}
		return table, nil
	case config.SourceKubernetes:
		return nil, errKubernetesTiers
	default:
		return nil, fmt.Errorf("%w: tiers.source %q", config.ErrInvalid, cfg.Tiers.Source)
	}
}

func newLogger(cfg config.Log, out io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.SlogLevel()}
	if cfg.Format == config.FormatText {
		return slog.New(slog.NewTextHandler(out, opts))
	}
	return slog.New(slog.NewJSONHandler(out, opts))
}
