package extproc

import (
	"context"
	"fmt"
	"net/http"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
)

// A pool whose key comes from the request body (identity.pools body:
// sources) decides the slot at the body, not the headers: Envoy sends it
// in one message in BUFFERED mode, which the shipped configs set.

// pendingAcquire is a request whose identity is known and whose slot
// waits for the body, where a pool's key is read.
type pendingAcquire struct {
	msg    *extprocv3.ProcessingRequest // the request headers' message
	id     identity.Identity
	caller string
	body   []byte
	// cut: Envoy may have cut the body at its buffer limit
	// (BUFFERED_PARTIAL, end_of_stream false).
	cut bool
}

// heldHeadersContinue answers the request headers of a request whose slot
// waits for its body: CONTINUE, removing the headers the grant sets
// (grantHeaders: a stream id, and with a JWT the user and plan headers)
// that the client sent. In STREAMED mode Envoy forwards the headers now
// and ignores a body answer's header mutation (it applies it in BUFFERED
// mode only): the upstream must then get none rather than forged ones.
func (s *Server) heldHeadersContinue() *extprocv3.ProcessingResponse {
	remove := []string{s.opts.StreamIDHeader}
	if user, plan, ok := s.identityHeaders(); ok {
		remove = append(remove, user, plan)
	}
	r := requestHeadersContinue()
	r.GetRequestHeaders().Response.HeaderMutation = &extprocv3.HeaderMutation{RemoveHeaders: remove}
	return r
}

// requestBody takes a chunk of a pending request's body: the slot is
// decided at its end, with the pools the body names. In BUFFERED (and
// BUFFERED_PARTIAL) mode Envoy sends the body in one message, which is
// its end whatever end_of_stream says: it is false when trailers follow
// (sent only with request_trailer_mode SEND) or, BUFFERED_PARTIAL, when
// the body was cut at the buffer limit, and no more of the body comes.
func (x *exchange) requestBody(ctx context.Context, b *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	p := x.pending
	if len(p.body)+len(b.GetBody()) > x.s.opts.MaxBodyBytes {
		x.pending = nil
		x.s.holder.Refused(ctx, hold.ReasonInvalid)
		return x.refuse(hold.Refused(http.StatusRequestEntityTooLarge, hold.TypeInvalidRequest, hold.CodeBodyTooLarge,
			fmt.Sprintf("the request body is over the %d bytes the limiter reads to find a pool's key", x.s.opts.MaxBodyBytes)))
	}
	p.body = append(p.body, b.GetBody()...)
	whole := x.modeKnown && (x.requestBodyMode == filterv3.ProcessingMode_BUFFERED || x.requestBodyMode == filterv3.ProcessingMode_BUFFERED_PARTIAL)
	p.cut = x.requestBodyMode == filterv3.ProcessingMode_BUFFERED_PARTIAL && !b.GetEndOfStream()
	if !b.GetEndOfStream() && !whole {
		return bodyContinue(b, false, false) // STREAMED: the rest is to come
	}
	return x.decidePending(ctx, func(set ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
		// In BUFFERED mode the request headers are still Envoy's to
		// change: the stream id goes upstream as with the headers.
		r := bodyContinue(b, false, false)
		r.GetRequestBody().Response = proceed(set...)
		return r
	})
}

// decidePending decides the pending request, its body read: answered by
// next when granted.
func (x *exchange) decidePending(ctx context.Context, next func(...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	p := x.pending
	x.pending = nil
	if len(p.body) > 0 {
		if err := x.s.ident.BodyPools(&p.id, p.body); err != nil {
			x.s.holder.Refused(ctx, hold.ReasonInvalid)
			if p.cut {
				// Not the client's body: the part of it Envoy's buffer held.
				return x.refuse(hold.Refused(http.StatusRequestEntityTooLarge, hold.TypeInvalidRequest, hold.CodeBodyTooLarge,
					fmt.Sprintf("the request body was cut at Envoy's buffer limit (request_body_mode BUFFERED_PARTIAL, %d bytes sent), "+
						"and a pool's key is not read from part of a body: %v", len(p.body), err)))
			}
			return x.refuse(identity.BodyRefusal(err, headerMap{p.msg.GetRequestHeaders().GetHeaders()}))
		}
	}
	return x.decide(ctx, p.msg, p.id, p.caller, next)
}

// endPending answers a request still waiting for its body when the
// drain's grace is over: it holds no slot, so it is refused 503
// limiter_unavailable and counted as a wait the drain ends, rather than
// closed with OK, which would let Envoy pass it upstream uncapped. Envoy
// takes an ImmediateResponse whatever message it waits on. nil when no
// request waits for its body, or Envoy reads no answer (observability
// mode).
func (x *exchange) endPending(ctx context.Context) *extprocv3.ProcessingResponse {
	p := x.pending
	if p == nil {
		return nil
	}
	x.pending = nil
	x.s.holder.Refused(ctx, hold.ReasonUnavailable)
	refusal, _ := hold.AcquireRefusal(hold.ErrClosed)
	resp := x.refuse(refusal)
	if p.msg.GetObservabilityMode() {
		return nil
	}
	return resp
}
