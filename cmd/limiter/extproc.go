package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"

	"github.com/joishi/limiter/pkg/config"
	"github.com/joishi/limiter/pkg/extproc"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/telemetry"
	"github.com/joishi/limiter/pkg/tiers"
)

// startExtProc opens the ext_proc listener of extproc.addr (on the
// loopback interface when it names no host, the store is embedded and
// callers are not authenticated: see openAddr) and returns run, which
// serves it until ctx ends, drains it within http.shutdownGrace, and
// releases what its streams still hold; nil run when extproc.addr is not
// set.
func startExtProc(cfg config.Config, embedded bool, lim *limiter.Limiter, table *tiers.Table, callers *server.Callers,
	tel *telemetry.Telemetry, logger *slog.Logger) (run func(context.Context) error, err error) {
	if cfg.ExtProc.Addr == "" {
		return nil, nil
	}
	ident, err := newIdentity(cfg, logger)
	if err != nil {
		return nil, err
	}
	logIdentity(cfg, ident, logger)
	var tlsConfig *tls.Config
	if files := cfg.HTTP.TLS.Files(); files.CertFile != "" {
		if tlsConfig, err = files.Config(logger); err != nil {
			return nil, err
		}
	}
	holder, err := hold.New(lim, hold.Options{Mode: "extproc", Logger: logger, MeterProvider: tel.MeterProvider, Wait: cfg.ExtProc.Wait})
	if err != nil {
		return nil, err
	}
	opts := cfg.ExtProcOptions()
	opts.Tiers, opts.Callers, opts.Logger = table, callers, logger
	opts.TracerProvider, opts.Propagator = tel.TracerProvider, tel.Propagator
	srv, err := extproc.New(holder, ident, opts)
	if err != nil {
		holder.Close(context.Background())
		return nil, fmt.Errorf("%w: %w", config.ErrInvalid, err)
	}
	ln, err := extproc.Listen(openAddr(cfg, "the ext_proc server", "extproc.addr", cfg.ExtProc.Addr, embedded, logger))
	if err != nil {
		holder.Close(context.Background())
		return nil, listenError(err, "extproc.addr")
	}
	return func(ctx context.Context) error {
		defer func() {
			// The slots still held are released within the bound the
			// proxy's are; the rest expire by their TTL.
			releaseCtx, cancel := context.WithTimeout(context.Background(), hold.CloseBound)
			defer cancel()
			holder.Close(releaseCtx)
		}()
		return srv.Run(ctx, ln, tlsConfig, cfg.HTTP.ShutdownGrace)
	}, nil
}

// newIdentity is the identity resolver of cfg's identity.* keys; an
// error is config.ErrInvalid.
func newIdentity(cfg config.Config, logger *slog.Logger) (*identity.Resolver, error) {
	opts := cfg.IdentityOptions()
	opts.Logger = logger
	ident, err := identity.New(opts)
	if err != nil {
		return nil, fmt.Errorf("%w: identity: %w", config.ErrInvalid, err)
	}
	return ident, nil
}

// logIdentity says where identities come from, and warns when they are
// trusted as they come.
func logIdentity(cfg config.Config, ident *identity.Resolver, logger *slog.Logger) {
	switch i := cfg.Identity; {
	case ident.UsesJWT():
		logger.Info("ext_proc identity from verified JWTs", "issuer", i.JWT.Issuer, "audience", i.JWT.Audience,
			"user_claim", i.JWT.UserClaim, "plan_claim", i.JWT.PlanClaim)
	case ident.UsesPayload():
		logger.Info("ext_proc identity from JWT payloads verified by Envoy's jwt_authn", "header", i.JWTPayload.Header,
			"metadata", i.JWTPayload.MetadataNamespace+"/"+i.JWTPayload.MetadataKey, "user_claim", i.JWTPayload.UserClaim, "plan_claim", i.JWTPayload.PlanClaim)
	default:
		logger.Warn("ext_proc identity from headers, trusted as they come: Envoy must authenticate the caller and set them",
			"user_header", i.UserHeader, "plan_header", i.PlanHeader)
	}
}
