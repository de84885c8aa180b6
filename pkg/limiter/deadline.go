package limiter

import (
	"context"
	"sync/atomic"
	"time"
)

// deadlineStep is how finely calls' deadlines are told apart: the calls
// that start within one step share a deadline, one timer and one Done
// channel, instead of a context.WithTimeout each (a context, a timer, a
// channel and a cancel func per call). A call's deadline is its timeout
// after it starts, plus less than one step.
const deadlineStep = time.Millisecond

// deadlines hands out the per-call deadline contexts of a Limiter.
type deadlines struct {
	latest atomic.Pointer[deadline] // the deadline of the latest step
}

// deadline is a context that ends at its deadline, shared by the calls of
// one step.
type deadline struct {
	context.Context
	at time.Time
	// cancel frees the timer of a deadline no call uses; a used one ends
	// by itself.
	cancel context.CancelFunc
}

func newDeadline(at time.Time) *deadline {
	ctx, cancel := context.WithDeadline(context.Background(), at)
	return &deadline{Context: ctx, at: at, cancel: cancel}
}

// after returns a context for a call that starts now under parent: it ends
// at most deadlineStep after now + timeout, or at parent's deadline if
// that is sooner, and holds parent's values. The second result releases
// it (a no-op for a shared deadline).
//
// parent's cancellation does not reach it: a call whose caller went away
// runs on until Redis answers or the deadline passes, at most the timeout.
// Callers wait on parent themselves (see deadlineClient), so they return
// at once.
func (d *deadlines) after(parent context.Context, now time.Time, timeout time.Duration) (context.Context, context.CancelFunc) {
	at := now.Add(timeout).Truncate(deadlineStep).Add(deadlineStep)
	if pd, ok := parent.Deadline(); ok && pd.Before(at) {
		return context.WithDeadline(parent, pd)
	}
	shared := d.latest.Load()
	if shared == nil || !shared.at.Equal(at) {
		next := newDeadline(at)
		if !d.latest.CompareAndSwap(shared, next) {
			if other := d.latest.Load(); other.at.Equal(at) { // made meanwhile by another call
				next.cancel()
				next = other
			}
		}
		shared = next
	}
	return &callContext{parent: parent, deadline: shared}, noCancel
}

func noCancel() {}

// callContext is the context of one call: parent's values, and the shared
// deadline's end.
type callContext struct {
	parent   context.Context
	deadline *deadline
}

func (c *callContext) Deadline() (time.Time, bool) { return c.deadline.at, true }
func (c *callContext) Done() <-chan struct{}       { return c.deadline.Done() }
func (c *callContext) Value(key any) any           { return c.parent.Value(key) }

// Err is parent's error if parent ended, else the deadline's.
func (c *callContext) Err() error {
	if err := c.parent.Err(); err != nil {
		return err
	}
	return c.deadline.Err()
}

// callerOf returns the context of ctx's caller: its parent, for a
// callContext. A call's own deadline passing is an outage of that call;
// its caller's context ending is the caller's (see classify).
func callerOf(ctx context.Context) context.Context {
	if c, ok := ctx.(*callContext); ok {
		return c.parent
	}
	return ctx
}

// callerDone is the channel that ends the wait of ctx's caller besides
// ctx.Done(): its parent's, for a callContext (nil when it never ends).
func callerDone(ctx context.Context) <-chan struct{} {
	if c, ok := ctx.(*callContext); ok {
		return c.parent.Done()
	}
	return nil
}
