package client_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// waitingLimiter serves a limiter whose one-slot plans may be waited for
// 10s (queued) or 300ms (short).
func waitingLimiter(t *testing.T) (*limiter.Limiter, string) {
	t.Helper()
	lim := limitertest.New(t, limitertest.Options{
		Redis: cluster.Options{Logger: quiet},
		Tiers: []tiers.Tier{
			{Plan: "queued", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailClosed, MaxWait: 10 * time.Second},
			{Plan: "short", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailClosed, MaxWait: 300 * time.Millisecond},
		},
		Limiter: limiter.Options{Logger: quiet},
	}).Limiter
	srv := httptest.NewServer(server.New(lim, server.Options{Logger: quiet}).Handler())
	t.Cleanup(srv.Close)
	return lim, srv.URL
}

func newWaitClient(t *testing.T, url string) *client.Client {
	t.Helper()
	// A request timeout well below the waits: a waiting acquire has its
	// wait on top.
	return newClient(t, url, client.WithRequestTimeout(500*time.Millisecond))
}

// awaitQueued waits until user's queue holds n acquires.
func awaitQueued(t *testing.T, lim *limiter.Limiter, user string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, err := lim.Slots(context.Background(), user)
		if err == nil && len(got.Queue) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %s: %+v, %v; want %d waiting", user, got.Queue, err, n)
		}
	}
}

func TestAcquireWaitGetsTheSlotAReleaseFrees(t *testing.T) {
	t.Parallel()
	lim, url := waitingLimiter(t)
	c := newWaitClient(t, url)
	user := "wait-" + newID()
	first, err := c.Acquire(context.Background(), user, "queued")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease *client.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		l, err := c.AcquireWait(context.Background(), user, "queued", 5*time.Second)
		done <- result{l, err}
	}()
	awaitQueued(t, lim, user, 1)
	time.Sleep(time.Second) // twice the request timeout
	if err := first.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.lease.Waited() < time.Second {
		t.Fatalf("AcquireWait: %v, %v; want a lease granted after waiting past the request timeout", r.lease, r.err)
	}
}

func TestAcquireWaitThatRunsOutIsLimitReached(t *testing.T) {
	t.Parallel()
	_, url := waitingLimiter(t)
	c := newWaitClient(t, url)
	user := "wait-" + newID()
	if _, err := c.Acquire(context.Background(), user, "short"); err != nil {
		t.Fatal(err)
	}
	_, err := c.AcquireWait(context.Background(), user, "short", 30*time.Second)
	var e *client.Error
	if !errors.Is(err, client.ErrLimitReached) || !errors.As(err, &e) || e.Waited < 300*time.Millisecond || e.RetryAfter <= 0 {
		t.Fatalf("AcquireWait past the plan's 300ms: %v, want ErrLimitReached with Waited >= 300ms and a RetryAfter", err)
	}
}

func TestAcquireWaitCancelledLeavesTheQueue(t *testing.T) {
	t.Parallel()
	lim, url := waitingLimiter(t)
	c := newWaitClient(t, url)
	user := "wait-" + newID()
	if _, err := c.Acquire(context.Background(), user, "queued"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.AcquireWait(ctx, user, "queued", 5*time.Second)
		done <- err
	}()
	awaitQueued(t, lim, user, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireWait cancelled: %v, want context.Canceled", err)
	}
	awaitQueued(t, lim, user, 0)
}

// newID returns an id no other test uses.
func newID() string { return keys.NewStreamID()[:12] }
