package limiter_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
)

// lostReplies is a limiter whose Redis runs every call but can be made to
// lose the answers: the connection drops before the reply, and the Redis
// client tries again on a fresh one.
func lostReplies(t *testing.T, timeout time.Duration) (*env, *testenv.Proxy) {
	t.Helper()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: timeout}})
	// Load the scripts: a NOSCRIPT answer would take the drop instead.
	user := newUser(t)
	e.acquire(t, user, "three", "s")
	if _, err := e.lim.Release(context.Background(), user, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.lim.ReleaseAll(context.Background(), user, newAuditID()); err != nil {
		t.Fatal(err)
	}
	return e, proxy
}

// TestReleaseAllWhoseReplyIsLostAnswersWhatItReleased: the retry after a
// lost reply finds the slots gone; it must still answer the ones the call
// released, or the admin answer and its audit record would say none.
func TestReleaseAllWhoseReplyIsLostAnswersWhatItReleased(t *testing.T) {
	t.Parallel()
	e, proxy := lostReplies(t, 2*time.Second)
	ctx := context.Background()
	user := newUser(t)
	e.acquire(t, user, "three", "a")
	e.acquire(t, user, "three", "b")

	proxy.DropReplies(1)
	ids, err := e.lim.ReleaseAll(ctx, user, newAuditID())
	if err != nil || !slices.Equal(ids, []string{"a", "b"}) {
		t.Fatalf("ReleaseAll whose first reply was lost: got %v, %v; want [a b], the slots it released", ids, err)
	}
	if slots, err := e.lim.Slots(ctx, user); err != nil || slots.Used != 0 {
		t.Errorf("slots after ReleaseAll: got %+v, %v; want none", slots, err)
	}
	e.acquire(t, user, "three", "c")
	if ids, err := e.lim.ReleaseAll(ctx, user, newAuditID()); err != nil || !slices.Equal(ids, []string{"c"}) {
		t.Errorf("the next ReleaseAll: got %v, %v; want [c], its own answer", ids, err)
	}
}

// TestReleaseAllWithEveryReplyLostSaysTheOutcomeIsUnknown: when no answer
// comes back, ReleaseAll cannot say what it released, and says so.
func TestReleaseAllWithEveryReplyLostSaysTheOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	e, proxy := lostReplies(t, 300*time.Millisecond)
	ctx := context.Background()
	user := newUser(t)
	e.acquire(t, user, "three", "a")

	proxy.DropReplies(1 << 20)
	ids, err := e.lim.ReleaseAll(ctx, user, newAuditID())
	if !errors.Is(err, limiter.ErrOutcomeUnknown) || !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("ReleaseAll with every reply lost: got %v, %v; want ErrOutcomeUnknown (and ErrUnavailable)", ids, err)
	}
	proxy.DropReplies(0)
	// The client is redialling the connections the proxy dropped; a read
	// may time out until it has one again.
	slots, err := e.lim.Slots(ctx, user)
	for deadline := time.Now().Add(3 * time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		slots, err = e.lim.Slots(ctx, user)
	}
	if err != nil || slots.Used != 0 {
		t.Errorf("slots after: got %+v, %v; want none (it ran, only its answers were lost)", slots, err)
	}
}

// TestReleaseWhoseReplyIsLostIsNeverReportedNotHeld: a retry after a lost
// reply finds the slot gone and would answer released false for a slot the
// first run released. The answer must be true, or degraded (unknown).
func TestReleaseWhoseReplyIsLostIsNeverReportedNotHeld(t *testing.T) {
	t.Parallel()
	e, proxy := lostReplies(t, 2*time.Second)
	ctx := context.Background()
	user := newUser(t)
	e.acquire(t, user, "three", "a")

	proxy.DropReplies(1)
	res, err := e.lim.Release(ctx, user, "a")
	if err != nil || (!res.Released && !res.Degraded) {
		t.Fatalf("Release of a held slot whose reply was lost: got %+v, %v; want released or degraded, never a plain released false", res, err)
	}
	if slots, err := e.lim.Slots(ctx, user); err != nil || slots.Used != 0 {
		t.Errorf("slots after Release: got %+v, %v; want none", slots, err)
	}
}
