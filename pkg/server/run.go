package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Addrs are the listen addresses of the two listeners.
type Addrs struct {
	API string // default ":8080"
	Ops string // default ":9090"
}

// Run serves the API and ops listeners until ctx ends, then drains: /readyz
// turns false, the API listener stops accepting, in-flight requests get up
// to grace to finish, and Run returns nil. It returns an error when a
// listener cannot start or a drain overruns grace.
func (s *Server) Run(ctx context.Context, addrs Addrs, grace time.Duration) error {
	if addrs.API == "" {
		addrs.API = ":8080"
	}
	if addrs.Ops == "" {
		addrs.Ops = ":9090"
	}
	apiLn, err := net.Listen("tcp", addrs.API)
	if err != nil {
		return fmt.Errorf("http.addr %s: %w", addrs.API, err)
	}
	opsLn, err := net.Listen("tcp", addrs.Ops)
	if err != nil {
		apiLn.Close()
		return fmt.Errorf("ops.addr %s: %w", addrs.Ops, err)
	}
	api := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	ops := &http.Server{Handler: s.OpsHandler(), ReadHeaderTimeout: 10 * time.Second}

	errc := make(chan error, 2)
	go func() { errc <- serve(api, apiLn) }()
	go func() { errc <- serve(ops, opsLn) }()
	s.log.Info("listening", "api", "http://"+apiLn.Addr().String(), "ops", "http://"+opsLn.Addr().String())

	select {
	case err := <-errc:
		api.Close()
		ops.Close()
		return err
	case <-ctx.Done():
	}

	s.draining.Store(true)
	s.log.Info("draining", "grace", grace.String())
	drainCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	drainErr := api.Shutdown(drainCtx)
	if drainErr != nil {
		drainErr = fmt.Errorf("draining in-flight requests: %w (grace %s)", drainErr, grace)
		api.Close()
	}
	opsErr := ops.Shutdown(drainCtx)
	if opsErr != nil {
		ops.Close()
	}
	s.log.Info("stopped")
	return errors.Join(drainErr, opsErr)
}

func serve(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
