package extproc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// stopAfterGrace bounds the wait, once the grace is over and every stream
// told to end, for the streams to return before the connections are cut.
const stopAfterGrace = 5 * time.Second

// Listen opens the ext_proc listener at addr; the error names the
// extproc.addr key.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("extproc.addr %s: %w", addr, err)
	}
	return ln, nil
}

// Run serves the ext_proc service and gRPC health (grpc.health.v1, the
// service "" and envoy.service.ext_proc.v3.ExternalProcessor) on ln, over
// TLS when tlsConfig is set, until ctx ends; then it drains: health turns
// NOT_SERVING, new connections and streams are refused (GOAWAY), the
// streams in flight have up to grace to end, and those still open after
// it are released and closed with OK, so that Envoy carries on with their
// HTTP streams without the filter rather than failing them; a request
// still waiting for its body, holding no slot yet, is answered 503
// instead (endPending). Health
// answers SERVING once the tier table has synced, never depending on
// Redis (an outage is each tier's failure mode to decide, not Envoy's).
func (s *Server) Run(ctx context.Context, ln net.Listener, tlsConfig *tls.Config, grace time.Duration) error {
	opts := []grpc.ServerOption{
		// Streams last as long as the HTTP streams they follow: nothing
		// bounds a connection's age or idleness, but a peer that stops
		// answering pings is cut, which ends (and releases) its streams.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: s.opts.KeepaliveTime, Timeout: s.opts.KeepaliveTimeout}),
		// Envoy pings its HTTP/2 connections (connection_keepalive), idle
		// or not: allow it, down to MinPingInterval.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: s.opts.MinPingInterval, PermitWithoutStream: true}),
		// A BUFFERED body comes in one message, as large as Envoy's buffer
		// limit lets it be. gRPC's own bound (4 MiB unless set) would end
		// the stream with an error at a larger one, which Envoy with
		// failure_mode_allow takes for leave to send the request upstream
		// without a slot; and gRPC answers that error itself, before the
		// limiter could answer 413. So gRPC takes any message, and the
		// limiter refuses a body over MaxBodyBytes (requestBody).
		grpc.MaxRecvMsgSize(math.MaxInt32),
	}
	if tlsConfig != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsConfig)))
	}
	srv := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(srv, s)
	hs := health.NewServer()
	services := []string{"", extprocv3.ExternalProcessor_ServiceDesc.ServiceName}
	for _, name := range services {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	healthpb.RegisterHealthServer(srv, hs)

	serving := func() {
		for _, name := range services {
			hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
		}
	}
	synced, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	select {
	case <-s.opts.Tiers.Synced():
		// Already synced (a static table): SERVING before the first
		// probe can ask, not whenever a goroutine gets to it.
		serving()
	default:
		go func() {
			select {
			case <-s.opts.Tiers.Synced():
				serving()
			case <-synced.Done():
			}
		}()
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	scheme := "grpc://"
	if tlsConfig != nil {
		scheme = "grpcs://"
	}
	s.log.Info("ext_proc listening", "addr", scheme+ln.Addr().String(), "authenticated", s.opts.Callers != nil)

	select {
	case err := <-errc:
		srv.Stop()
		return err
	case <-ctx.Done():
	}
	stopWatch()
	hs.Shutdown()       // NOT_SERVING, and stays so
	s.holder.EndWaits() // answered 503 now, not cut at the grace's end
	s.log.Info("ext_proc draining", "grace", grace.String(), "streams", s.holder.Held())
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	var drainErr error
	select {
	case <-stopped:
	case <-timer.C:
		open := s.holder.Held()
		close(s.stopping)
		select {
		case <-stopped:
		case <-time.After(stopAfterGrace):
			srv.Stop()
			<-stopped
		}
		if open > 0 {
			drainErr = fmt.Errorf("ext_proc: %d streams still open after the grace (%s) were released; Envoy carries them on uncapped", open, grace)
		}
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		drainErr = errors.Join(drainErr, err)
	}
	s.log.Info("ext_proc stopped")
	return drainErr
}
