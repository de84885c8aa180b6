package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"

	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/config"
	"github.com/joishi/limiter/pkg/server"
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
	return runServing(ctx, cfg, deps, "starting", "replica", func(ctx context.Context, s serving) error {
		logger, table := s.logger, s.tables.tiers
		tel, redis, lim := s.engine.tel, s.engine.redis, s.engine.lim
		if cfg.Tiers.Source == config.SourceStatic {
			logger.Info("tiers loaded", "source", cfg.Tiers.Source, "tiers", table.Len())
		} else {
			logger.Info("watching LimitTier objects; ready once the first list is in", "namespace", cfg.Tiers.Namespace)
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
		srvOpts := server.Options{Logger: logger, Metrics: tel.MetricsHandler(), Middleware: tel.Middleware, Admin: admin, Callers: callers,
			RedisAnswered: redisReady(redis, cfg.Redis.RequiredForReadiness)}
		srv := server.New(lim, srvOpts)
		runExtProc, err := startExtProc(cfg, redis.Embedded(), lim, table, callers, tel, logger)
		if err != nil {
			return err
		}
		// The ext_proc server runs beside the HTTP listeners, and drains with
		// them when ctx ends; should either stop on its own, so does the other.
		runCtx, stopRun := context.WithCancelCause(ctx)
		defer stopRun(nil)
		extErr := make(chan error, 1)
		if runExtProc != nil {
			go func() {
				err := runExtProc(runCtx)
				if runCtx.Err() == nil {
					s.fail(fmt.Errorf("ext_proc server: %w", err))
				}
				extErr <- err
			}()
		} else {
			extErr <- nil
		}
		err = srv.Run(runCtx, server.Listeners{API: apiAddr(cfg, redis.Embedded(), logger), Ops: cfg.Ops.Addr, Admin: cfg.Admin.Addr, TLS: cfg.HTTP.TLS.Files(), Timeouts: cfg.HTTP.Timeouts()}, cfg.HTTP.ShutdownGrace)
		err = listenError(err, "http.addr", "ops.addr", "admin.addr")
		stopRun(nil)
		return errors.Join(err, <-extErr)
	})
}

// serving is what a serving command (serve, proxy) runs on: its logger,
// the limit tables, the engine, and fail, which ends the command's
// context with a cause (what stopped on its own).
type serving struct {
	logger *slog.Logger
	tables limitTables
	engine engine
	fail   context.CancelCauseFunc
}

// runServing runs a serving command with cfg: it logs starting (the
// build's version beside it), starts the limit tables and the engine
// (holders names what runs on it, for the embedded store's warning), runs
// run on them, and once run returns (after its drain) stops them. Should
// the tier source fail for good (the LimitTier watch ends), ctx ends with
// that cause, and runServing returns the cause rather than run's error.
func runServing(ctx context.Context, cfg config.Config, deps serveDeps, starting, holders string, run func(context.Context, serving) error) error {
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	logger := newLogger(cfg.Log, deps.logs)
	b := currentBuild()
	logger.Info(starting, "version", b.Version, "commit", b.Commit, "go", b.Go)

	tables, stopTiers, err := startLimitTables(ctx, cfg, deps, logger, fail)
	if err != nil {
		return err
	}
	defer stopTiers()
	eng, stopEngine, err := startEngine(ctx, cfg, tables, logger, holders)
	if err != nil {
		return err
	}
	defer stopEngine() // after the drain: flush the last spans
	err = run(ctx, serving{logger: logger, tables: tables, engine: eng, fail: fail})
	if cause := context.Cause(ctx); errors.Is(cause, errTierWatchStopped) {
		return cause
	}
	return err
}

// listenError adds, to the error of a listener that could not open, the
// environment variable and flag of the key of its address, as a
// configuration error names them. pkg/server, pkg/proxy and pkg/extproc
// start such an error with the key ("ops.addr :9090: listen tcp :9090:
// bind: address already in use"); keys are those it may be.
func listenError(err error, keys ...string) error {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "listen" {
		return err
	}
	for _, k := range keys {
		if strings.HasPrefix(err.Error(), k+" ") {
			return fmt.Errorf("%w (%s)", err, config.Sources(k))
		}
	}
	return err
}

// redisReady is what readiness waits for of Redis: the client warmed up,
// or gave up warming up within its bound (cluster.Client.Warmed), so that
// a rolling deploy's first requests to this replica are neither degraded
// nor slow while Redis is up; and, with redis.requiredForReadiness, a
// first answer. Both stay true once true, as server.Options.RedisAnswered
// requires: readiness gates the start, it never follows Redis.
func redisReady(redis *cluster.Client, requireAnswer bool) func() bool {
	if !requireAnswer {
		return redis.Warmed
	}
	return func() bool { return redis.Warmed() && redis.Answered() }
}

func newLogger(cfg config.Log, out io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.SlogLevel()}
	if cfg.Format == config.FormatText {
		return slog.New(slog.NewTextHandler(out, opts))
	}
	return slog.New(slog.NewJSONHandler(out, opts))
}

// apiAddr is where the slot API listens: http.addr, except that an open
// API (no api.tokensFile) on the embedded store, the try-it default,
// listens on the loopback interface only when http.addr names no host
// (":8080"): anyone who can reach it may take and release any user's
// slots. A host in http.addr ("0.0.0.0:8080") is listened on as given.
func apiAddr(cfg config.Config, embedded bool, logger *slog.Logger) string {
	return openAddr(cfg, "the API", "http.addr", cfg.HTTP.Addr, embedded, logger)
}

// openAddr is where a listener that takes slots (the API, the ext_proc
// server) listens: addr, the value of key, except on the embedded store
// with callers not authenticated (no api.tokensFile), where an addr that
// names no host listens on the loopback interface only (see apiAddr).
func openAddr(cfg config.Config, what, key, addr string, embedded bool, logger *slog.Logger) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "" || !embedded || cfg.API.TokensFile != "" {
		return addr
	}
	local := net.JoinHostPort("127.0.0.1", port)
	logger.Info(what+" is open (no api.tokensFile) on the embedded store: listening on the loopback interface only; "+
		"give "+key+" a host (0.0.0.0"+addr+") to serve other machines", "addr", local)
	return local
}
