package hold_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// waitTiers: one slot per user, waited for up to 10s.
var waitTiers = []tiers.Tier{
	{Plan: "queued", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 10 * time.Second},
}

type acquired struct {
	st  *hold.Stream
	res limiter.AcquireResult
	err error
}

// acquireAsync runs e.Holder.Acquire in a goroutine and returns once the
// user's queue holds queued acquires.
func (e *env) acquireAsync(t *testing.T, ctx context.Context, user string, queued int) <-chan acquired {
	t.Helper()
	done := make(chan acquired, 1)
	go func() {
		st, res, err := e.Holder.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "queued"})
		done <- acquired{st, res, err}
	}()
	e.AwaitQueue(t, user, queued, 5*time.Second)
	return done
}

// wantClosed wants the waiting Acquire to end with ErrClosed within 3s of
// what (the call that ends the waits).
func wantClosed(t *testing.T, waiting <-chan acquired, what string) {
	t.Helper()
	select {
	case a := <-waiting:
		if !errors.Is(a.err, hold.ErrClosed) || a.st != nil {
			t.Fatalf("waiting Acquire after %s = %v, %v; want ErrClosed", what, a.st, a.err)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("a waiting Acquire outlived %s", what)
	}
}

// The holder's Wait lets a stream wait for the slot another one releases,
// and holds it like any other.
func TestHolderWaitsForASlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t, hold.Options{Wait: 5 * time.Second}, limitertest.Options{Tiers: waitTiers})
	user := newUser()
	first := e.acquire(t, user, "queued")
	second := e.acquireAsync(t, context.Background(), user, 1)
	first.Release(context.Background(), hold.EndComplete)
	var a acquired
	select {
	case a = <-second:
	case <-time.After(3 * time.Second):
		t.Fatal("the waiting stream was not granted the slot released")
	}
	if a.err != nil || a.st == nil || a.res.Waited <= 0 {
		t.Fatalf("waiting Acquire = %v, %+v, %v; want a stream, after a wait", a.st, a.res, a.err)
	}
	if n := e.Holder.Held(); n != 1 {
		t.Errorf("holder holds %d streams, want the waiter's 1", n)
	}
	a.st.Release(context.Background(), hold.EndComplete)
}

// Closing the holder (the process stopping) ends the waits in progress
// with ErrClosed, and their places in the queue with them.
func TestClosingTheHolderEndsWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, hold.Options{Wait: 10 * time.Second}, limitertest.Options{Tiers: waitTiers})
	user := newUser()
	e.acquire(t, user, "queued")
	waiting := e.acquireAsync(t, context.Background(), user, 1)
	e.Holder.Close(context.Background())
	wantClosed(t, waiting, "Close")
	if got, err := e.Stack.Limiter.Slots(context.Background(), user); err != nil || len(got.Queue) != 0 {
		t.Errorf("queue after Close: %+v, %v; want empty", got.Queue, err)
	}
	// Refused a slot (the front ends answer 503), it is counted so, as is
	// an Acquire after Close.
	if _, _, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: newUser(), Plan: "queued"}); !errors.Is(err, hold.ErrClosed) {
		t.Fatalf("Acquire after Close: %v; want ErrClosed", err)
	}
	if got := e.Metric(t, `limiter_streams_refused_total{mode="test",reason="unavailable"}`); got != "2" {
		t.Errorf("refused as unavailable: %q; want 2, the wait Close ended and the Acquire after it", got)
	}
}

// TestEndingWaitsKeepsTheStreamsHeld: EndWaits (a front end starting to
// drain) ends the waiting acquires with ErrClosed at once, and any
// acquire that would wait after it; the streams held go on, and an
// acquire that does not wait is granted as before, until Close.
func TestEndingWaitsKeepsTheStreamsHeld(t *testing.T) {
	t.Parallel()
	e := newEnv(t, hold.Options{Wait: 10 * time.Second}, limitertest.Options{Tiers: waitTiers})
	user := newUser()
	held := e.acquire(t, user, "queued")
	waiting := e.acquireAsync(t, context.Background(), user, 1)
	e.Holder.EndWaits()
	wantClosed(t, waiting, "EndWaits")
	if _, _, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "queued"}); !errors.Is(err, hold.ErrClosed) {
		t.Errorf("an Acquire that would wait, after EndWaits: %v; want ErrClosed", err)
	}
	other, res, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: newUser(), Plan: "queued", Wait: -1})
	if err != nil || other == nil || !res.Granted {
		t.Fatalf("an Acquire that does not wait, after EndWaits: %+v, %v; want granted", res, err)
	}
	if n := e.Holder.Held(); n != 2 {
		t.Errorf("%d streams held after EndWaits; want both", n)
	}
	select {
	case <-held.Lost():
		t.Error("the stream held was lost at EndWaits")
	default:
	}
}

// TestAnAcquireThatNeedNotWaitIsGrantedAfterEndWaits: after EndWaits, an
// acquire allowed to wait (Options.Wait) whose user has a slot free is
// granted, as it would be without the drain: only one that would wait
// is ended, with ErrClosed, and leaves nothing in the queue.
func TestAnAcquireThatNeedNotWaitIsGrantedAfterEndWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, hold.Options{Wait: 10 * time.Second}, limitertest.Options{Tiers: waitTiers})
	e.Holder.EndWaits()
	user := newUser()
	st, res, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "queued"})
	if err != nil || st == nil || !res.Granted {
		t.Fatalf("an Acquire allowed to wait, its user's slot free, after EndWaits: %v, %+v, %v; want granted", st, res, err)
	}
	start := time.Now()
	if _, _, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "queued"}); !errors.Is(err, hold.ErrClosed) {
		t.Errorf("the user's next Acquire, which would wait: %v; want ErrClosed", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the Acquire that would wait was ended %v on; want at once", took)
	}
	if got, err := e.Stack.Limiter.Slots(context.Background(), user); err != nil || len(got.Queue) != 0 || got.Used != 1 {
		t.Errorf("the user's slots after: %d used, queue %+v (%v); want 1 used, none waiting", got.Used, got.Queue, err)
	}
}
