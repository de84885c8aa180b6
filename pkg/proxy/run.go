package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/joishi/limiter/internal/httpserve"
	"github.com/joishi/limiter/internal/opsmux"
	"github.com/joishi/limiter/pkg/hold"
)

// Listeners say where the proxy and its ops endpoints listen, and bound
// the client connections.
type Listeners struct {
	// Proxy is the proxy's listen address. Default ":8000".
	Proxy string
	// Ops serves /healthz, /readyz and /metrics. Default ":9090".
	Ops string
	// ReadHeaderTimeout bounds reading a request's headers, on both
	// listeners. Default 5s. Nothing else bounds a request on the proxy's
	// listener: streams last as long as they last.
	ReadHeaderTimeout time.Duration
	// IdleTimeout bounds a kept-alive connection's wait for its next
	// request. Default 2m.
	IdleTimeout time.Duration
	// OpsReadTimeout bounds reading a whole request, headers and body, on
	// the ops listener (http.readTimeout). Default 10s. The proxy's
	// listener has no such bound: a request body may stream.
	OpsReadTimeout time.Duration
	// OpsWriteTimeout bounds an ops request from the end of its headers to
	// the end of its answer (http.writeTimeout). Default 10s. The proxy's
	// listener has no such bound: a stream lasts as long as it lasts.
	OpsWriteTimeout time.Duration
	// TLS, when set, serves the proxy's listener over TLS (http.tls, see
	// server.TLSFiles.Config). The ops listener stays plain HTTP, as
	// serve's: probes and scrapers reach it inside the pod's network.
	// Default nil: plain HTTP.
	TLS *tls.Config
}

// Run serves until ctx ends, then drains: /readyz turns false, the
// listener stops accepting, streams in flight (upgraded connections
// included) get up to grace to finish, what is still open is cut at
// once, and every slot still held is released before Run returns, within
// hold.CloseBound (a slot Redis has not freed by then expires by its TTL). Run closes the
// proxy's hold.Holder when it returns. It returns an error when a listener
// cannot start, or when streams had to be cut.
func (p *Proxy) Run(ctx context.Context, l Listeners, grace time.Duration) error {
	if l.Proxy == "" {
		l.Proxy = ":8000"
	}
	if l.Ops == "" {
		l.Ops = ":9090"
	}
	if l.ReadHeaderTimeout == 0 {
		l.ReadHeaderTimeout = 5 * time.Second
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = 2 * time.Minute
	}
	if l.OpsReadTimeout == 0 {
		l.OpsReadTimeout = 10 * time.Second
	}
	if l.OpsWriteTimeout == 0 {
		l.OpsWriteTimeout = 10 * time.Second
	}
	proxyLn, err := net.Listen("tcp", l.Proxy)
	if err != nil {
		return fmt.Errorf("proxy.listen %s: %w", l.Proxy, err)
	}
	opsLn, err := net.Listen("tcp", l.Ops)
	if err != nil {
		proxyLn.Close()
		return fmt.Errorf("ops.addr %s: %w", l.Ops, err)
	}
	srv := &http.Server{
		Handler:           p.Handler(),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		// The hard limit, past which net/http answers 431 itself in plain
		// text; up to it, the handler answers a JSON 431 past
		// MaxHeaderBytes.
		MaxHeaderBytes: 2 * p.opts.MaxHeaderBytes,
		TLSConfig:      l.TLS,
	}
	ops := &http.Server{Handler: p.OpsHandler(), ReadHeaderTimeout: l.ReadHeaderTimeout, ReadTimeout: l.OpsReadTimeout,
		WriteTimeout: l.OpsWriteTimeout, IdleTimeout: l.IdleTimeout}

	errc := make(chan error, 2)
	go func() { errc <- httpserve.Serve(srv, proxyLn) }()
	go func() { errc <- httpserve.Serve(ops, opsLn) }()
	scheme := "http://"
	if l.TLS != nil {
		scheme = "https://"
	}
	p.log.Info("proxying", "listen", scheme+proxyLn.Addr().String(), "upstream", p.opts.Upstream.Redacted(),
		"ops", "http://"+opsLn.Addr().String(), "routes", p.opts.Routes)

	select {
	case err := <-errc:
		srv.Close()
		ops.Close()
		releaseCtx, cancelRelease := context.WithTimeout(context.Background(), hold.CloseBound)
		defer cancelRelease()
		p.holder.Close(releaseCtx)
		return err
	case <-ctx.Done():
	}

	p.draining.Store(true)
	p.holder.EndWaits() // answered 503 now, not cut at the grace's end
	p.log.Info("draining", "grace", grace.String(), "streams", p.holder.Held())
	drainCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	// Shutdown waits for the requests in flight; upgraded connections
	// are the holder's to wait for.
	shutdownErr := srv.Shutdown(drainCtx)
	drained := p.holder.Drain(drainCtx)
	// Whatever still streams is told (its slot marked lost, its upstream
	// request cancelled) and released, then its connection closed.
	releaseCtx, cancelRelease := context.WithTimeout(context.Background(), hold.CloseBound)
	defer cancelRelease()
	var drainErr error
	if cut, released := p.holder.Close(releaseCtx); cut > 0 || shutdownErr != nil || !drained {
		drainErr = fmt.Errorf("%d streams still open after the grace (%s) were cut: %d slots released, %d left to expire by their TTL",
			cut, grace, released, cut-released)
		// A stream cut before its upstream answered is answered 503:
		// its handler returns at once, and its answer goes out before
		// the connections close.
		answerCtx, cancelAnswer := context.WithTimeout(releaseCtx, cutAnswerBound)
		_ = srv.Shutdown(answerCtx)
		cancelAnswer()
		srv.Close()
	}
	_ = ops.Shutdown(releaseCtx)
	p.log.Info("stopped")
	return drainErr
}

// cutAnswerBound is how long the answers of the streams cut at the
// grace's end have to go out before their connections close.
const cutAnswerBound = time.Second

// OpsHandler serves /healthz (the process answers), /readyz (the tier
// table has synced, the Redis client has warmed up or given up within its
// bound, and the proxy is not draining; never tied to Redis answering, so
// an outage leaves the proxy in the load balancer to apply each tier's
// failure mode) and /metrics.
func (p *Proxy) OpsHandler() http.Handler {
	return opsmux.Handler(p.opts.Metrics,
		opsmux.Check{Reason: "draining", Failing: p.draining.Load},
		opsmux.Check{Reason: "tiers not synced yet", Failing: func() bool { return !p.opts.Tiers.IsSynced() }},
		opsmux.Check{Reason: "redis client warming up, or redis has not answered yet", Failing: func() bool { return p.opts.Warmed != nil && !p.opts.Warmed() }},
	)
}
