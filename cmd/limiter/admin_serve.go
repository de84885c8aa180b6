package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/joishi/limiter/pkg/admin"
	"github.com/joishi/limiter/pkg/config"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
)

// startAdmin builds the admin API and page when admin.tokensFile is set and
// says at start whether they are on. It returns them for
// server.Options.Admin (nil when off) and stop, which ends the tokens
// file's watcher and waits for it.
func startAdmin(ctx context.Context, cfg config.Config, lim *limiter.Limiter, logger *slog.Logger) (routes server.AdminRoutes, stop func(), err error) {
	if cfg.Admin.TokensFile == "" {
		logger.Info("admin.tokensFile is not set: the admin API and page are off (no admin listener)")
		return nil, func() {}, nil
	}
	a, err := admin.New(lim, admin.Options{
		TokensFile:  cfg.Admin.TokensFile,
		AuditMaxLen: cfg.Admin.AuditMaxLen,
		Logger:      logger.With("component", "admin"),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: admin.tokensFile (env %s): %w", config.ErrInvalid, config.EnvVar("admin.tokensFile"), err)
	}
	if a.Tokens() == 0 {
		logger.Warn("admin.tokensFile holds no token: every admin call is refused until one is added", "file", cfg.Admin.TokensFile)
	}
	logger.Info("admin API and page on", "addr", cfg.Admin.Addr, "page", httpapi.PathAdminPage, "tokens", a.Tokens(),
		"file", cfg.Admin.TokensFile, "auditMaxLen", cfg.Admin.AuditMaxLen)

	watchCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { a.WatchTokens(watchCtx) })
	return a, func() { cancel(); wg.Wait() }, nil
}
