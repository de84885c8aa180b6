package extproc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
)

// Span attributes of an Envoy stream. Never metric labels.
const (
	attrStreamID = attribute.Key("limiter.stream_id")
	attrDegraded = attribute.Key("limiter.degraded")
	attrEnd      = attribute.Key("limiter.end")
	attrRefused  = attribute.Key("limiter.refused")
	attrCaller   = attribute.Key("limiter.caller")
	// attrWouldRefuse: a shadow grant's hold.WouldRefuse.
	attrWouldRefuse = attribute.Key("limiter.would_refuse")
)

// headerWouldRefuse is hold.HeaderWouldRefuse as Envoy spells headers.
var headerWouldRefuse = strings.ToLower(hold.HeaderWouldRefuse)

// Process serves one Envoy stream, that is one HTTP stream through the
// ext_proc filter, until Envoy ends it. It answers every message Envoy
// waits for with exactly one response, holds a slot from a granted
// request_headers on, and releases it at the response's end of stream or
// when the gRPC stream ends, whichever comes first.
func (s *Server) Process(grpcStream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := grpcStream.Context()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		ctx = s.opts.Propagator.Extract(ctx, metadataCarrier(md))
	}
	ctx, span := s.tracer.Start(ctx, "extproc.stream", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()

	gone := make(chan struct{})
	x := &exchange{s: s, span: span, send: grpcStream.Send, gone: gone}
	if s.opts.Callers != nil {
		who, err := s.authenticate(ctx)
		if err != nil {
			s.authWarn.Log(ctx, slog.LevelError, "ext_proc stream refused: its caller is not in api.tokensFile; "+
				"Envoy fails these requests, or passes them uncapped with failure_mode_allow", "err", err)
			span.SetAttributes(attrRefused.String(hold.CodeUnauthenticated))
			return status.Error(codes.Unauthenticated, err.Error())
		}
		x.caller = &who
		span.SetAttributes(attrCaller.String(who.Name()))
	}
	defer x.release(ctx, hold.EndClientGone) // whatever ended the stream first

	msgs := make(chan received)
	done := make(chan struct{})
	defer close(done)
	go receive(grpcStream, msgs, done, gone)
	for {
		var lost <-chan struct{}
		if x.st != nil && !x.released && !x.lostSeen {
			lost = x.st.Lost()
		}
		select {
		case m := <-msgs:
			if m.err != nil {
				x.release(ctx, x.endOnClose(m.err))
				return nil
			}
			resp := x.handle(ctx, m.req)
			if resp == nil || m.req.GetObservabilityMode() {
				continue // nothing to answer, or Envoy ignores answers
			}
			if err := grpcStream.Send(resp); err != nil {
				x.release(ctx, hold.EndClientGone)
				return err
			}
		case <-lost:
			x.lostSeen = true
			if errors.Is(x.st.Err(), hold.ErrShutdown) {
				// Closed with OK, Envoy carries on with the HTTP stream
				// without the filter instead of failing it.
				x.release(ctx, hold.EndShutdown)
				return nil
			}
			// Cut at the next message Envoy sends (see cutIfLost).
		case <-s.stopping:
			if resp := x.endPending(ctx); resp != nil {
				// Closed with OK instead, Envoy would pass a request that
				// holds no slot yet upstream uncapped.
				if err := grpcStream.Send(resp); err != nil {
					return err
				}
			}
			x.release(ctx, hold.EndShutdown)
			return nil
		}
	}
}

// received is one Recv's result.
type received struct {
	req *extprocv3.ProcessingRequest
	err error
}

// receive feeds msgs with the stream's messages until Recv fails or done
// closes. It closes gone as soon as Recv fails: Envoy closed or reset the
// stream, which a request waiting for a slot must learn while Process,
// waiting with it, reads no message.
func receive(grpcStream extprocv3.ExternalProcessor_ProcessServer, msgs chan<- received, done <-chan struct{}, gone chan<- struct{}) {
	for {
		req, err := grpcStream.Recv()
		if err != nil {
			close(gone)
		}
		select {
		case msgs <- received{req, err}:
		case <-done:
			return
		}
		if err != nil {
			return
		}
	}
}

// exchange is the state of one Envoy stream. Only Process's goroutine
// touches it.
type exchange struct {
	s      *Server
	span   trace.Span
	caller *server.Caller // nil: the API is open
	// send sends a response on the gRPC stream (Process's goroutine only).
	send func(*extprocv3.ProcessingResponse) error
	// gone is closed once Envoy has closed or reset the gRPC stream.
	gone <-chan struct{}

	st             *hold.Stream    // the slot, once granted
	wouldRefuse    string          // a shadow grant's hold.WouldRefuse: said to the client
	pending        *pendingAcquire // a request waiting for its body before its slot
	released       bool
	lostSeen       bool
	sawHeaders     bool // request_headers arrived
	started        bool // response_headers arrived
	duplexRequest  bool // request body in FULL_DUPLEX_STREAMED mode
	duplexResponse bool // response body in FULL_DUPLEX_STREAMED mode
	// requestBodyMode is the request body mode protocol_config announced
	// (Envoy sends it on the first message); modeKnown is false when it
	// came without one (an older Envoy).
	requestBodyMode filterv3.ProcessingMode_BodySendMode
	modeKnown       bool
	// responseBodyMode is the response body mode protocol_config
	// announced (with modeKnown).
	responseBodyMode filterv3.ProcessingMode_BodySendMode
	// midResponse: the last response body chunk came without
	// end_of_stream.
	midResponse bool
}

// handle answers one message: nil when it needs no answer.
func (x *exchange) handle(ctx context.Context, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	if pc := req.GetProtocolConfig(); pc != nil { // on the first message only
		x.requestBodyMode, x.responseBodyMode, x.modeKnown = pc.GetRequestBodyMode(), pc.GetResponseBodyMode(), true
		x.duplexRequest = pc.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		x.duplexResponse = pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return x.requestHeaders(ctx, req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		if x.pending != nil {
			return x.requestBody(ctx, r.RequestBody)
		}
		if cut := x.cutIfLost(ctx); cut != nil {
			return cut
		}
		return bodyContinue(r.RequestBody, x.duplexRequest, false)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if x.pending != nil { // the body ended with trailers
			return x.decidePending(ctx, func(...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse { return trailersContinue(false) })
		}
		if cut := x.cutIfLost(ctx); cut != nil {
			return cut
		}
		return trailersContinue(false)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		x.noRequestHeaders(ctx)
		if x.pending != nil {
			// Envoy sent no request body, or not its end: decided now,
			// with what came of it, so that the stream is still counted
			// (and a refusal still replaces the upstream's answer).
			if len(x.pending.body) == 0 {
				x.s.modeWarn.Log(ctx, slog.LevelError, "a pool's key comes from the request body, and Envoy sent none: "+
					"the pools of the body are not applied; set the filter's processing_mode.request_body_mode to BUFFERED")
			} else {
				x.s.modeWarn.Log(ctx, slog.LevelError, "a pool's key comes from the request body, and Envoy sent it without its end "+
					"(trailers followed, and request_trailer_mode is SKIP): the slot was taken at the response headers; "+
					"set the filter's processing_mode.request_body_mode to BUFFERED")
			}
			if resp := x.decidePending(ctx, responseHeadersContinue); x.st == nil || resp == nil {
				return resp
			}
		}
		if cut := x.cutIfLost(ctx); cut != nil {
			return cut
		}
		x.started = true
		resp := x.responseHeaders()
		if r.ResponseHeaders.GetEndOfStream() {
			x.release(ctx, hold.EndComplete)
		}
		return resp
	case *extprocv3.ProcessingRequest_ResponseBody:
		x.noRequestHeaders(ctx)
		if cut := x.cutIfLost(ctx); cut != nil {
			return cut
		}
		if x.st != nil {
			x.st.Touch()
		}
		x.midResponse = !r.ResponseBody.GetEndOfStream()
		resp := bodyContinue(r.ResponseBody, x.duplexResponse, true)
		if r.ResponseBody.GetEndOfStream() {
			x.release(ctx, hold.EndComplete)
		}
		return resp
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.noRequestHeaders(ctx)
		if cut := x.cutIfLost(ctx); cut != nil {
			return cut // lost however the response would have ended
		}
		// Trailers come last: the response is complete.
		x.release(ctx, hold.EndComplete)
		return trailersContinue(true)
	}
	return nil // flow control only: no answer expected
}

// responseHeaders answers the response headers: CONTINUE with the
// limiter's headers to the client, the stream id and, on a shadow grant,
// x-limiter-would-refuse, each replacing one the upstream sent. A header
// of the limiter's that it does not set is removed: the upstream's (a
// limiter behind this one) is not this limiter's word, so the client
// hears none, on a stream without a slot too (Envoy sent no request
// headers).
func (x *exchange) responseHeaders() *extprocv3.ProcessingResponse {
	var set []*corev3.HeaderValueOption
	var remove []string
	if x.st != nil {
		set = append(set, header(x.s.opts.StreamIDHeader, x.st.ID()))
	} else {
		remove = append(remove, x.s.opts.StreamIDHeader)
	}
	if x.wouldRefuse != "" {
		set = append(set, header(headerWouldRefuse, x.wouldRefuse))
	} else {
		remove = append(remove, headerWouldRefuse)
	}
	resp := responseHeadersContinue(set...)
	common := resp.GetResponseHeaders().GetResponse()
	if common.HeaderMutation == nil {
		common.HeaderMutation = &extprocv3.HeaderMutation{}
	}
	common.HeaderMutation.RemoveHeaders = remove
	return resp
}

// requestHeaders decides the stream: identity, then a slot; or, when a
// pool's key comes from the body and one follows, the identity now and
// the slot at the body (requestBody).
func (x *exchange) requestHeaders(ctx context.Context, req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	s := x.s
	if x.sawHeaders {
		return requestHeadersContinue() // never twice per stream
	}
	x.sawHeaders = true
	id, err := x.identify(req, h)
	if err != nil {
		s.holder.Refused(ctx, hold.ReasonIdentity)
		return x.refuse(identity.Refusal(err))
	}
	callerName := ""
	if x.caller != nil {
		callerName = x.caller.Name()
		if err := x.caller.Allow(id.Plan); err != nil {
			s.holder.Refused(ctx, hold.ReasonPlanNotAllowed)
			return x.refuse(hold.Refused(http.StatusForbidden, hold.TypeInvalidRequest, hold.CodePlanNotAllowed, err.Error()))
		}
	}
	if s.ident.ReadsBody() && !h.GetEndOfStream() {
		switch {
		case x.duplexRequest:
			s.modeWarn.Log(ctx, slog.LevelError, "a pool's key comes from the request body, and Envoy streams it in FULL_DUPLEX_STREAMED mode: "+
				"acquiring at the request headers, without the body's pools; set the filter's processing_mode.request_body_mode to BUFFERED")
		case x.modeKnown && x.requestBodyMode == filterv3.ProcessingMode_NONE:
			// Waiting for a body Envoy never sends would let the request
			// run uncapped until its response.
			s.modeWarn.Log(ctx, slog.LevelError, "a pool's key comes from the request body, and Envoy sends none (request_body_mode NONE): "+
				"acquiring at the request headers, without the body's pools; set the filter's processing_mode.request_body_mode to BUFFERED")
		default:
			switch {
			case x.modeKnown && x.requestBodyMode == filterv3.ProcessingMode_STREAMED:
				s.modeWarn.Log(ctx, slog.LevelError, "a pool's key comes from the request body, and Envoy streams it (request_body_mode STREAMED): "+
					"the slot is decided at its last chunk, after the upstream has the request; set the filter's processing_mode.request_body_mode to BUFFERED")
			case x.modeKnown && x.requestBodyMode == filterv3.ProcessingMode_BUFFERED_PARTIAL:
				s.modeWarn.Log(ctx, slog.LevelError, "a pool's key comes from the request body, and Envoy cuts it at its buffer limit (request_body_mode BUFFERED_PARTIAL): "+
					"a body over the limit is refused, its key unread; set the filter's processing_mode.request_body_mode to BUFFERED")
			}
			x.pending = &pendingAcquire{msg: req, id: id, caller: callerName}
			return s.heldHeadersContinue()
		}
	}
	return x.decide(ctx, req, id, callerName, requestHeadersContinue)
}

// decide acquires the slot of the request id: refused, an
// ImmediateResponse; granted, next with the stream id header.
func (x *exchange) decide(ctx context.Context, msg *extprocv3.ProcessingRequest, id identity.Identity, callerName string,
	next func(...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	s := x.s
	st, res, err := x.acquire(ctx, msg, limiter.AcquireRequest{UserID: id.UserID, Plan: id.Plan, Caller: callerName,
		Label: id.BodyLabel, Pools: id.Pools})
	switch {
	case errors.Is(err, errGone):
		return nil // Envoy is gone; nobody reads an answer
	case err != nil:
		return x.refuseAcquire(ctx, err)
	case st == nil:
		return x.refuse(hold.Limited(res))
	}
	x.st = st
	x.span.SetAttributes(attrStreamID.String(st.ID()), attrDegraded.Bool(res.Degraded))
	granted := []any{"mode", "extproc", "stream_id", st.ID(), "plan", st.Plan(),
		"degraded", res.Degraded, "caller", callerName, "pools", len(res.Pools)}
	if x.wouldRefuse = hold.WouldRefuse(res); x.wouldRefuse != "" {
		// A scope in shadow mode would have refused the stream: the log
		// says so, and the response headers to the client.
		x.span.SetAttributes(attrWouldRefuse.String(x.wouldRefuse))
		granted = append(granted, "would_refuse", x.wouldRefuse)
	}
	s.log.InfoContext(ctx, "stream granted", granted...)
	return next(s.grantHeaders(st)...)
}

// identify resolves the request's identity: from the verified JWT
// payload in the dynamic metadata when configured and present, else from
// the headers.
func (x *exchange) identify(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (identity.Identity, error) {
	s := x.s
	if s.opts.PayloadKey != "" {
		if claims, ok := payloadClaims(req.GetMetadataContext(), s.opts.PayloadNamespace, s.opts.PayloadKey); ok {
			return s.ident.FromClaims(claims, headerMap{h.GetHeaders()})
		}
	}
	return s.ident.Resolve(headerMap{h.GetHeaders()})
}

// refuseAcquire answers an acquire that failed: the plan is unknown, the
// user id cannot be used, or Redis is down on a Closed plan.
func (x *exchange) refuseAcquire(ctx context.Context, err error) *extprocv3.ProcessingResponse {
	refusal, known := hold.AcquireRefusal(err)
	if !known {
		if ctx.Err() != nil {
			return nil // Envoy is gone; nobody reads an answer
		}
		x.s.failed.Log(ctx, slog.LevelError, "acquire failed", "mode", "extproc", "err", err)
	}
	return x.refuse(refusal)
}

func (x *exchange) refuse(r hold.Refusal) *extprocv3.ProcessingResponse {
	x.span.SetAttributes(attrRefused.String(r.Error.Code))
	return immediate(r)
}

// cutIfLost answers the first message after the slot was lost (expired,
// released by support, lost in a failover) with an ImmediateResponse,
// which ends the HTTP stream (Envoy resets it if the response has
// started), as the proxy cuts such a stream. nil while the slot holds.
func (x *exchange) cutIfLost(ctx context.Context) *extprocv3.ProcessingResponse {
	if x.st == nil || x.released || x.st.Err() == nil {
		return nil
	}
	x.release(ctx, hold.EndLost)
	return x.refuse(hold.Refused(http.StatusServiceUnavailable, hold.TypeServer, hold.CodeSlotLost,
		"this stream's slot was released while it ran (by support, by expiry or in a failover)"))
}

// noRequestHeaders warns, rate-limited, when a response arrives on a
// stream that never sent its request headers: the filter is not
// configured to send them, and nothing is limited.
func (x *exchange) noRequestHeaders(ctx context.Context) {
	if !x.sawHeaders {
		x.s.modeWarn.Log(ctx, slog.LevelWarn, "ext_proc stream without request headers: nothing is limited; "+
			"set the filter's processing_mode.request_header_mode to SEND")
		x.sawHeaders = true // once per stream
	}
}

// endOnClose says how the stream ended when the gRPC stream closed before
// the response's end was seen. Anything but io.EOF is a reset, a broken
// connection or a cancelled call. io.EOF is Envoy closing its side, which
// it does however the HTTP stream ended, done or reset by its client: once
// the response had started it is complete unless Envoy would have sent
// the response's end as a message first (endSent), the client having left
// mid-response otherwise, as the proxy counts it.
func (x *exchange) endOnClose(err error) hold.End {
	if x.st != nil {
		switch serr := x.st.Err(); {
		case errors.Is(serr, hold.ErrShutdown):
			return hold.EndShutdown
		case errors.Is(serr, hold.ErrIdle):
			return hold.EndIdle
		case serr != nil:
			return hold.EndLost
		}
	}
	if errors.Is(err, io.EOF) && x.started && !x.endSent() {
		return hold.EndComplete
	}
	return hold.EndClientGone
}

// endSent reports whether Envoy sends the response's end as a message.
// In STREAMED and FULL_DUPLEX_STREAMED mode it sends every body chunk as
// it comes, the last with end_of_stream unless trailers follow (the
// ext_proc protocol's HttpBody.end_of_stream), and the trailers with
// response_trailer_mode SEND, which FULL_DUPLEX_STREAMED requires. With
// STREAMED and SKIP, an upstream's trailers leave the last chunk without
// end_of_stream and nothing after it: such a response is counted
// client_gone too, which is why docs/envoy.md asks for SEND with an
// upstream that sends trailers. In NONE mode Envoy sends no body, and in
// BUFFERED and BUFFERED_PARTIAL mode one message, which skipped trailers or
// Envoy's buffer limit may leave without end_of_stream and nothing after
// it: the close is all Envoy tells of the end. From an Envoy that
// announces no mode, a chunk without end_of_stream is taken for a streamed
// body.
func (x *exchange) endSent() bool {
	if !x.modeKnown {
		return x.midResponse
	}
	switch x.responseBodyMode {
	case filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return true
	}
	return false
}

// release frees the slot, once, recording end.
func (x *exchange) release(ctx context.Context, end hold.End) {
	if x.st == nil || x.released {
		return
	}
	x.released = true
	x.st.Release(ctx, end)
	x.span.SetAttributes(attrEnd.String(string(end)))
	x.s.log.InfoContext(ctx, "stream ended", "mode", "extproc", "stream_id", x.st.ID(), "end", end,
		"took", time.Since(x.st.Started()).Round(time.Millisecond).String())
}
