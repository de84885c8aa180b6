package extproc

import (
	"context"
	"errors"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/limiter"
)

// A request whose user holds every slot of its plan may wait in the
// user's queue for one (extproc.wait, the holder's Options.Wait; the
// plan's maxWait caps it). Envoy gives every answer the filter's
// message_timeout (200ms by default, 1s as docs/envoy.md advises) and then
// gives up on the limiter: with failure_mode_allow the request goes
// through uncapped, otherwise it fails. So before it waits, the server
// sends override_message_timeout, the wait plus TimerMargin, which
// restarts Envoy's timer for the request headers; Envoy takes it once per
// message and only up to the filter's max_message_timeout (unset, 0: it
// ignores every override).

// TimerMargin is what a waiting request's override_message_timeout adds
// to its wait: room for the decision after the wait runs out (a Redis
// round trip within redis.timeout + 100ms, 350ms by default), as the
// README's message_timeout of 1s gives an acquire that does not wait.
const TimerMargin = time.Second

// errGone: Envoy closed or reset the stream while its request waited.
var errGone = errors.New("extproc: Envoy closed the stream while its request waited for a slot")

// acquire takes a slot for req, the acquire of msg's request headers.
// Should it wait, Envoy's timer is extended first, and the wait ends as
// soon as Envoy closes or resets the stream (errGone: nothing to answer)
// or the drain's grace is over (hold.ErrClosed: 503, as when the holder
// closes), as a proxy's waiting request ends when its client leaves.
func (x *exchange) acquire(ctx context.Context, msg *extprocv3.ProcessingRequest, req limiter.AcquireRequest) (*hold.Stream, limiter.AcquireResult, error) {
	waitCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req.OnWait = func(wait time.Duration) {
		// Process reads no message while the request waits: the receiving
		// goroutine says when the stream ends.
		go func() {
			select {
			case <-x.gone:
				cancel(errGone)
			case <-x.s.stopping:
				cancel(hold.ErrClosed)
			case <-waitCtx.Done():
			}
		}()
		if !msg.GetObservabilityMode() { // Envoy reads no answer in that mode
			// A failed send is the stream ending, which gone reports.
			_ = x.send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(wait + TimerMargin)})
		}
	}
	st, res, err := x.s.holder.Acquire(waitCtx, req)
	if err != nil {
		if cause := context.Cause(waitCtx); errors.Is(cause, errGone) || errors.Is(cause, hold.ErrClosed) {
			return nil, res, cause
		}
	}
	return st, res, err
}
