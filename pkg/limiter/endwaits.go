package limiter

import (
	"context"
	"sync/atomic"
	"time"
)

// EndWaitsWith returns ctx and req made so that req's wait ends, ctx
// cancelled with cause, once over has ended and the acquire waits: a
// front end's drain (over) ends the acquires waiting in a queue, now and
// from then on. An acquire that does not wait is not ended: one in its
// first attempt when over ends, or one that starts after, is granted or
// refused at once as before, and ended only if, denied, it would wait.
// cancel releases the context's resources; call it once Acquire returns.
// cause should wrap ErrShuttingDown (see there).
func EndWaitsWith(ctx, over context.Context, cause error, req AcquireRequest) (context.Context, AcquireRequest, context.CancelFunc) {
	waitCtx, cancelCause := context.WithCancelCause(ctx)
	// Whichever of the two comes second sees the other's mark, so a wait
	// that starts as the drain does is ended all the same.
	var waiting atomic.Bool
	stop := context.AfterFunc(over, func() {
		if waiting.Load() {
			cancelCause(cause)
		}
	})
	onWait := req.OnWait
	req.OnWait = func(d time.Duration) {
		if onWait != nil {
			onWait(d)
		}
		waiting.Store(true)
		if over.Err() != nil {
			cancelCause(cause)
		}
	}
	return waitCtx, req, func() {
		stop()
		cancelCause(nil)
	}
}
