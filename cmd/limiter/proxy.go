package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"

	"github.com/joishi/limiter/pkg/config"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/proxy"
	"github.com/spf13/cobra"
)

func newProxyCommand(deps serveDeps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "proxy --upstream URL",
		Short: "Cap each user's concurrent streams in front of an existing endpoint",
		Long: `Proxy requests to --upstream (an OpenAI-compatible server, vLLM, any HTTP
streaming endpoint), holding one of the user's slots for as long as each
response streams, until SIGTERM or interrupt. The proxy talks to Redis
itself: no limiter serve in between, no application change.

For each request on a limited route (--routes; default every path):
  - identity: a verified bearer JWT when --jwt-jwks-file or --jwt-jwks-url
    is set, else the --user-header and --plan-header headers, trusted as
    they come (run it only behind a hop that authenticates and sets them);
    none, or a token that does not verify: 401, no slot; with a JWT the
    two headers go upstream carrying the user and plan counted
  - label: the value of --label-header (default X-Limiter-Label) labels the
    slot, shown to support beside its age and caller; over 128 bytes or with
    whitespace: 400 invalid_label, no slot
  - acquire: the user at the plan's limit gets 429 with Retry-After and an
    OpenAI-shaped body, code stream_limit_reached; a plan outside the tier
    table 422; Redis not answering: the tier's failureMode (Open: proxied,
    counted degraded; Closed: 503)
  - proxy: flushed as the upstream writes (SSE, chunked, HTTP/2, WebSocket),
    the stream id in X-Limiter-Stream-Id both ways, heartbeated in one batch
    per interval for all streams, released when the response ends, the
    client leaves, the upstream fails or the handler panics
On SIGTERM it stops accepting, lets streams finish for up to
http.shutdownGrace, cuts what remains and releases its slots, and exits.
/healthz, /readyz and /metrics are on --ops-addr (default :9092, apart from
serve's :9090, so that both can run on one host).

Configuration: as for serve, the defaults, then --config's YAML file, then
LIMITER_<KEY> environment variables, then these flags (config/limiter.yaml
documents every key, proxy.* and identity.* included). With no Redis
address, an embedded store holds this process's slots only.

Exit codes: 0 after a graceful drain, 1 when proxying failed or streams
had to be cut at the end of the grace, 2 for a usage or configuration
error.`,
		Example: `  limiter proxy --upstream http://my-llm:8000
  limiter proxy --upstream http://vllm:8000 --redis-addrs redis:6379 --routes /v1/chat/completions,/v1/completions
  limiter proxy --config limiter.yaml --jwt-jwks-file /etc/jwks.json --jwt-issuer https://auth --jwt-audience llm`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(config.LoadOptions{Flags: cmd.Flags(), Command: config.CommandProxy})
			if err != nil {
				return err
			}
			if err := runProxy(cmd.Context(), cfg, deps); err != nil {
				return serveFailure{err}
			}
			return nil
		},
	}
	cmd.Flags().SortFlags = false
	config.AddCommandFlags(cmd.Flags(), config.CommandProxy)
	return cmd
}

// runProxy runs `limiter proxy` with cfg until ctx ends, then drains and
// returns nil, or the error of a drain that had to cut streams.
func runProxy(ctx context.Context, cfg config.Config, deps serveDeps) error {
	return runServing(ctx, cfg, deps, "starting proxy", "proxy", func(ctx context.Context, s serving) error {
		logger, tel := s.logger, s.engine.tel
		ident, err := newIdentity(cfg, logger)
		if err != nil {
			return err
		}
		if ident.UsesJWT() {
			logger.Info("identity from verified JWTs", "issuer", cfg.Identity.JWT.Issuer, "audience", cfg.Identity.JWT.Audience,
				"user_claim", cfg.Identity.JWT.UserClaim, "plan_claim", cfg.Identity.JWT.PlanClaim)
		} else {
			logger.Warn("identity from headers, trusted as they come: run only behind a hop that authenticates the caller and sets them",
				"user_header", cfg.Identity.UserHeader, "plan_header", cfg.Identity.PlanHeader)
		}
		holder, err := hold.New(s.engine.lim, hold.Options{Mode: "proxy", Logger: logger, MeterProvider: tel.MeterProvider, Wait: cfg.Proxy.Wait})
		if err != nil {
			return err
		}
		defer holder.Close(context.Background())

		opts, err := cfg.ProxyOptions()
		if err != nil {
			return err
		}
		opts.Tiers, opts.Logger, opts.Warmed = s.tables.tiers, logger, redisReady(s.engine.redis, cfg.Redis.RequiredForReadiness)
		opts.MeterProvider, opts.Propagator = tel.MeterProvider, tel.Propagator
		opts.Middleware, opts.Metrics = tel.Middleware, tel.MetricsHandler()
		p, err := proxy.New(holder, ident, opts)
		if err != nil {
			return fmt.Errorf("%w: %w", config.ErrInvalid, err)
		}
		var tlsConfig *tls.Config // http.tls: the proxy's listener serves it, as serve's API listener does
		if files := cfg.HTTP.TLS.Files(); files.CertFile != "" || files.KeyFile != "" {
			if tlsConfig, err = files.Config(logger); err != nil {
				return fmt.Errorf("%w: %w", config.ErrInvalid, err)
			}
		}
		err = p.Run(ctx, proxy.Listeners{Proxy: cfg.Proxy.Listen, Ops: cfg.Ops.Addr, TLS: tlsConfig,
			ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout, IdleTimeout: cfg.HTTP.IdleTimeout,
			OpsReadTimeout: cfg.HTTP.ReadTimeout, OpsWriteTimeout: cfg.HTTP.WriteTimeout}, cfg.HTTP.ShutdownGrace)
		return upstreamHint(listenError(err, "proxy.listen", "ops.addr"), cfg)
	})
}

// upstreamHint explains a proxy.listen taken by the upstream itself, on
// this host: vLLM listens on :8000 by default, as the proxy does.
func upstreamHint(err error, cfg config.Config) error {
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.HasPrefix(err.Error(), "proxy.listen ") {
		return err
	}
	u, perr := url.Parse(cfg.Proxy.Upstream)
	_, listenPort, serr := net.SplitHostPort(cfg.Proxy.Listen)
	if perr != nil || serr != nil {
		return err
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	ip := net.ParseIP(u.Hostname())
	local := u.Hostname() == "localhost" || (ip != nil && (ip.IsLoopback() || ip.IsUnspecified()))
	if port != listenPort || !local {
		return err
	}
	return fmt.Errorf("%w; the upstream %s is likely what listens there (vLLM, like the proxy, defaults to :8000): give the proxy another port", err, cfg.Proxy.Upstream)
}
