package client_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
)

// wantNotSlotHolder fails t unless err is the limiter's 403 not_slot_holder,
// matching ErrNotSlotHolder and none of the other outcomes.
func wantNotSlotHolder(t *testing.T, what string, err error) {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) || !errors.Is(err, client.ErrNotSlotHolder) || e.Status != http.StatusForbidden || e.Code != httpapi.CodeNotSlotHolder {
		t.Fatalf("%s: got %v, want a 403 not_slot_holder matching ErrNotSlotHolder", what, err)
	}
	for _, other := range []error{client.ErrPlanNotAllowed, client.ErrLimitReached, client.ErrSlotLost, client.ErrUnavailable, client.ErrInvalid} {
		if errors.Is(err, other) {
			t.Errorf("%s: got %v matching %v too, want ErrNotSlotHolder only", what, err, other)
		}
	}
}

// With callers authenticated, a slot belongs to the caller that took it:
// the limiter refuses another caller's acquire, heartbeat and release of it
// with 403 not_slot_holder and changes nothing.
func TestNotSlotHolder(t *testing.T) {
	ctx := context.Background()
	releases := func(f *fakeLimiter) int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.releases
	}

	t.Run("an acquire of another caller's stream id is ErrNotSlotHolder, and sends no release", func(t *testing.T) {
		f := newFake(t)
		mine := newClient(t, f.URL(), client.WithToken(appToken))
		theirs := newClient(t, f.URL(), client.WithToken(otherToken))
		if _, err := theirs.Acquire(ctx, "u1", "paid", client.WithStreamID("s")); err != nil {
			t.Fatalf("their Acquire: %v", err)
		}
		_, err := mine.Acquire(ctx, "u1", "paid", client.WithStreamID("s"))
		wantNotSlotHolder(t, "Acquire of their stream id", err)
		if got := f.used("u1"); got != 1 {
			t.Errorf("slots after the refused acquire: got %d, want 1", got)
		}
		if got := releases(f); got != 0 {
			t.Errorf("release requests: got %d, want 0", got)
		}
	})

	t.Run("an unanswered acquire whose retry finds the id another caller's sends no release", func(t *testing.T) {
		f := newFake(t)
		c := newClient(t, f.URL(), client.WithToken(appToken))
		var calls atomic.Int32
		f.set(func(f *fakeLimiter) {
			f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool {
				if calls.Add(1) > 1 {
					return false
				}
				// The first attempt's answer is lost, and meanwhile another
				// caller takes the id.
				f.takeOver("u1", "s", otherToken)
				hangUp(w)
				return true
			}
		})
		_, err := c.Acquire(ctx, "u1", "paid", client.WithStreamID("s"))
		wantNotSlotHolder(t, "Acquire retried", err)
		if got := calls.Load(); got != 2 {
			t.Errorf("acquire requests: got %d, want 2 (the lost one and its retry)", got)
		}
		if got := releases(f); got != 0 {
			t.Errorf("release requests: got %d, want 0: the id is another caller's", got)
		}
	})

	t.Run("a release of a slot another caller took over is ErrNotSlotHolder, and leaves it held", func(t *testing.T) {
		f := newFake(t)
		c := newClient(t, f.URL(), client.WithToken(appToken))
		lease, err := c.Acquire(ctx, "u1", "paid", client.WithStreamID("s"), client.WithLabel("pod-7"))
		if err != nil {
			t.Fatal(err)
		}
		f.takeOver("u1", "s", otherToken)
		wantNotSlotHolder(t, "Release", lease.Release(ctx))
		if got := f.used("u1"); got != 1 {
			t.Errorf("slots after the refused release: got %d, want 1", got)
		}
		// Refused, so not done: a later Release asks again.
		wantNotSlotHolder(t, "second Release", lease.Release(ctx))
		if got := releases(f); got != 2 {
			t.Errorf("release requests: got %d, want 2", got)
		}
	})

	t.Run("a lease whose heartbeat is refused is lost with ErrNotSlotHolder", func(t *testing.T) {
		f := newFake(t)
		c := newClient(t, f.URL(), client.WithToken(appToken))
		keep, err := c.Acquire(ctx, "u1", "paid", client.WithStreamID("keep"))
		if err != nil {
			t.Fatal(err)
		}
		lease, err := c.Acquire(ctx, "u1", "paid", client.WithStreamID("taken"))
		if err != nil {
			t.Fatal(err)
		}
		f.takeOver("u1", "taken", otherToken)
		select {
		case <-lease.Lost():
		case <-time.After(2 * time.Second):
			t.Fatal("Lost did not close")
		}
		wantNotSlotHolder(t, "Lease.Err", lease.Err())
		// The lost lease is no longer heartbeated, and its slot stays the
		// other caller's; the other lease is kept.
		n := len(f.batches())
		for _, b := range f.waitBatches(n+2, 2*time.Second)[n:] {
			if got := strings.Join(b.streams, ","); got != "keep" {
				t.Errorf("got a heartbeat for %s after the loss, want keep only", got)
			}
		}
		select {
		case <-keep.Lost():
			t.Errorf("the other lease was lost too: %v", keep.Err())
		default:
		}
		if got := f.used("u1"); got != 2 {
			t.Errorf("slots: got %d, want 2", got)
		}
	})
}
