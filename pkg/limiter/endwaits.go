package limiter

import (
	"context"
	"sync"
)

// EndWaitsWith returns ctx and req made so that req's wait ends, ctx
// cancelled with cause, once over has ended while the acquire waits: a
// front end's drain (over) ends the acquires waiting in a queue, now and
// from then on. An acquire that does not wait is not ended: one in its
// first attempt when over ends, or one that starts after, is granted or
// refused at once as before, and ended only if, denied, it would wait.
// cancel releases the context's resources; call it once Acquire returns.
// A drain's cause should wrap ErrShuttingDown (see there). Calls compose:
// req made by one may be made again with another over and cause, and
// whichever over ends first ends the waits, with its cause.
func EndWaitsWith(ctx, over context.Context, cause error, req AcquireRequest) (context.Context, AcquireRequest, context.CancelFunc) {
	waitCtx, cancelCause := context.WithCancelCause(ctx)
	// Under mu, whichever of a wait's start and the drain comes second
	// sees the other, so a wait that starts as the drain does is ended all
	// the same; and one that ended (granted its slot, its pool's place)
	// is not, nor what the acquire does after it without waiting.
	var mu sync.Mutex
	waiting := false
	stop := context.AfterFunc(over, func() {
		mu.Lock()
		defer mu.Unlock()
		if waiting {
			cancelCause(cause)
		}
	})
	outer := req.waits
	req.waits = func(on bool) {
		if outer != nil {
			outer(on)
		}
		mu.Lock()
		defer mu.Unlock()
		if waiting = on; on && over.Err() != nil {
			cancelCause(cause)
		}
	}
	return waitCtx, req, func() {
		stop()
		cancelCause(nil)
	}
}
