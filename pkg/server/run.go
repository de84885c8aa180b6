package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/joishi/limiter/internal/httpserve"
)

// Defaults of Timeouts.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 10 * time.Second
	DefaultWriteTimeout      = 10 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
)

// Listeners say where the listeners listen and how long a connection may
// take.
type Listeners struct {
	API string // default ":8080"
	Ops string // default ":9090"
	// Admin is where the admin API and page listen, when Options.Admin is
	// set. Default ":8081".
	Admin string
	// TLS, when its files are set, serves the API over TLS (and mutual
	// TLS with a client CA), and the admin listener over TLS with the
	// same certificate: its bearer tokens release anyone's slots. The
	// ops listener stays plain HTTP: probes and scrapers reach it inside
	// the cluster.
	TLS TLSFiles
	// Timeouts apply to every listener.
	Timeouts Timeouts
}

// Timeouts bound every connection, so that a client sending its request a
// byte at a time (or not at all) cannot hold a connection, and the
// goroutine serving it, for as long as it likes. Zero fields take the
// defaults.
type Timeouts struct {
	// ReadHeader bounds reading a request's line and headers. Default 5s.
	ReadHeader time.Duration
	// Read bounds reading a whole request, headers and body. Default 10s.
	Read time.Duration
	// Write bounds a request from the end of its headers to the end of its
	// answer, the handler's work included. Every route answers once (none
	// streams), within redis.timeout of Redis work; an acquire that waits
	// for a slot (wait_ms) gets its wait on top of this, and of Read.
	// Default 10s.
	Write time.Duration
	// Idle bounds how long a kept-alive connection waits for its next
	// request. Default 2m: above the 90s after which Go's and most clients
	// drop idle connections themselves, so the client closes first and never
	// reuses a connection the server is closing.
	Idle time.Duration
}

// WithDefaults returns t with its zero fields set to the defaults.
func (t Timeouts) WithDefaults() Timeouts {
	if t.ReadHeader == 0 {
		t.ReadHeader = DefaultReadHeaderTimeout
	}
	if t.Read == 0 {
		t.Read = DefaultReadTimeout
	}
	if t.Write == 0 {
		t.Write = DefaultWriteTimeout
	}
	if t.Idle == 0 {
		t.Idle = DefaultIdleTimeout
	}
	return t
}

func (t Timeouts) server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, WriteTimeout: t.Write, IdleTimeout: t.Idle}
}

// Run serves the API and ops listeners, and the admin listener when
// Options.Admin is set, until ctx ends, then drains: /readyz turns false,
// the API and admin listeners stop accepting, in-flight requests get up to
// grace to finish, and Run returns nil. It returns an error when a
// listener cannot start or a drain overruns grace.
func (s *Server) Run(ctx context.Context, l Listeners, grace time.Duration) error {
	if l.API == "" {
		l.API = ":8080"
	}
	if l.Ops == "" {
		l.Ops = ":9090"
	}
	if l.Admin == "" {
		l.Admin = ":8081"
	}
	timeouts := l.Timeouts.WithDefaults()
	s.listening.Store(&timeouts)
	var tlsConfig, adminTLS *tls.Config
	if l.TLS.enabled() {
		var err error
		if tlsConfig, err = l.TLS.Config(s.log); err != nil {
			return err
		}
		// Cloned now: the API's server adds its protocols to tlsConfig
		// when it starts serving.
		adminTLS = adminTLSConfig(tlsConfig)
	}
	apiLn, err := net.Listen("tcp", l.API)
	if err != nil {
		return fmt.Errorf("http.addr %s: %w", l.API, err)
	}
	opsLn, err := net.Listen("tcp", l.Ops)
	if err != nil {
		apiLn.Close()
		return fmt.Errorf("ops.addr %s: %w", l.Ops, err)
	}
	var adminLn net.Listener
	if s.opts.Admin != nil {
		if adminLn, err = net.Listen("tcp", l.Admin); err != nil {
			apiLn.Close()
			opsLn.Close()
			return fmt.Errorf("admin.addr %s: %w", l.Admin, err)
		}
	}
	api := timeouts.server(s.Handler())
	api.TLSConfig = tlsConfig
	ops := timeouts.server(s.OpsHandler())
	// Drained in this order: the API and the admin listeners together,
	// while the ops listener still answers /readyz (draining) to the
	// probes, then the ops listener.
	front := []*http.Server{api}

	errc := make(chan error, 3)
	go func() { errc <- httpserve.Serve(api, apiLn) }()
	go func() { errc <- httpserve.Serve(ops, opsLn) }()
	scheme := "http://"
	if tlsConfig != nil {
		scheme = "https://"
	}
	attrs := []any{"api", scheme + apiLn.Addr().String(), "ops", "http://" + opsLn.Addr().String(), "client_certificates", l.TLS.ClientCAFile != ""}
	if adminLn != nil {
		admin := timeouts.server(s.AdminHandler())
		admin.TLSConfig = adminTLS
		front = append(front, admin)
		go func() { errc <- httpserve.Serve(admin, adminLn) }()
		attrs = append(attrs, "admin", scheme+adminLn.Addr().String())
	}
	s.log.Info("listening", attrs...)

	select {
	case err := <-errc:
		for _, srv := range append(front, ops) {
			srv.Close()
		}
		return err
	case <-ctx.Done():
	}

	s.draining.Store(true)
	s.endWaits() // the waiting acquires are answered now, not cut at the grace's end
	s.log.Info("draining", "grace", grace.String())
	drainCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	drain := func(srv *http.Server) error {
		err := srv.Shutdown(drainCtx)
		if err != nil {
			srv.Close()
		}
		return err
	}
	// Each Shutdown closes its listener as it starts: the API's and the
	// admin's stop accepting at once, their in-flight requests draining
	// side by side.
	errs := make([]error, len(front))
	var wg sync.WaitGroup
	for i, srv := range front {
		wg.Go(func() { errs[i] = drain(srv) })
	}
	wg.Wait()
	if errs[0] != nil {
		errs[0] = fmt.Errorf("draining in-flight requests: %w (grace %s)", errs[0], grace)
	}
	errs = append(errs, drain(ops))
	s.log.Info("stopped")
	return errors.Join(errs...)
}
