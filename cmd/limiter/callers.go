package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/joishi/limiter/pkg/config"
	"github.com/joishi/limiter/pkg/server"
)

// startCallers reads api.tokensFile, the callers of the slot API, and says
// at start whether the API is open. It returns nil callers when the file
// is not set, and stop, which ends the file's watcher and waits for it.
func startCallers(ctx context.Context, cfg config.Config, logger *slog.Logger) (callers *server.Callers, stop func(), err error) {
	if cfg.API.TokensFile == "" {
		logger.Warn("api.tokensFile is not set: the slot API is open to anyone who can reach http.addr, for every plan; " +
			"set it to authenticate callers and scope their plans")
		return nil, func() {}, nil
	}
	callers, err = server.LoadCallers(server.CallersOptions{
		TokensFile: cfg.API.TokensFile,
		Logger:     logger.With("component", "api"),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: api.tokensFile (env %s): %w", config.ErrInvalid, config.EnvVar("api.tokensFile"), err)
	}
	if callers.Len() == 0 {
		logger.Warn("api.tokensFile holds no caller: every call of the slot API is refused until one is added", "file", cfg.API.TokensFile)
	}
	logger.Info("slot API callers authenticated", "callers", callers.Len(), "file", cfg.API.TokensFile)

	watchCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { callers.Watch(watchCtx) })
	return callers, func() { cancel(); wg.Wait() }, nil
}
