package limiter_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
)

// outageBound is how long an operation may take while Redis is out: the
// per-call deadline plus 100ms.
const outageBound = cluster.DefaultTimeout + 100*time.Millisecond

// assertOutageAnswers checks, on a limiter whose Redis is out, that an Open
// tier grants degraded and a Closed tier refuses with ErrUnavailable, each
// within outageBound, and that a denial is never reported.
func assertOutageAnswers(t *testing.T, e *env) {
	t.Helper()
	ctx := context.Background()
	user := newUser(t)
	for range 3 {
		start := time.Now()
		res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three"})
		if took := time.Since(start); took > outageBound {
			t.Errorf("Open acquire took %v during the outage, want <= %v", took, outageBound)
		}
		if err != nil || !res.Granted || !res.Degraded || !res.SlotDegraded {
			t.Fatalf("Open acquire during the outage = %+v, %v; want granted and degraded", res, err)
		}

		start = time.Now()
		_, err = e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "closed"})
		if took := time.Since(start); took > outageBound {
			t.Errorf("Closed acquire took %v during the outage, want <= %v", took, outageBound)
		}
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("Closed acquire during the outage = %v, want ErrUnavailable", err)
		}
	}
	hb, err := e.lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: "s"})
	if err != nil || !hb.Alive || !hb.Degraded {
		t.Errorf("Open heartbeat during the outage = %+v, %v; want alive and degraded", hb, err)
	}
	if _, err := e.lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "closed", StreamID: "s"}); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Closed heartbeat during the outage = %v, want ErrUnavailable", err)
	}
	rel, err := e.lim.Release(ctx, user, "s")
	if err != nil || !rel.Degraded {
		t.Errorf("release during the outage = %+v, %v; want degraded, no error", rel, err)
	}
	if _, err := e.lim.Slots(ctx, user); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Slots during the outage = %v, want ErrUnavailable", err)
	}
}

// awaitRecovery waits until a Closed-tier acquire is answered by Redis.
func awaitRecovery(t *testing.T, e *env, within time.Duration) {
	t.Helper()
	user := newUser(t)
	deadline := time.Now().Add(within)
	for {
		res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "closed"})
		if err == nil && res.Granted && !res.Degraded && res.Used == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery within %v after Redis came back: last %+v, %v", within, res, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func newUnconnected(t *testing.T, addrs ...string) *env {
	t.Helper()
	start := time.Now()
	e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: addrs}, NoWait: true})
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("creating the limiter took %v with Redis out; it must not block", took)
	}
	return e
}

func TestRedisStoppedFromTheStart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	srv.Stop()
	e := newUnconnected(t, srv.Addr())
	assertOutageAnswers(t, e)
	srv.Start()
	awaitRecovery(t, e, 10*time.Second)
}

func TestRedisStoppedWhileRunning(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{srv.Addr()}}})
	e.acquire(t, newUser(t), "closed", "")
	srv.Stop()
	assertOutageAnswers(t, e)
	srv.Start()
	awaitRecovery(t, e, 10*time.Second)
}

// TestRedisRefusingThePassword: Redis's password is rotated while the
// limiter runs with the old one (or none the file gives it). Once its
// connections drop, every reconnect is refused: Redis is unusable, so each
// plan's failure mode answers, as for any outage, and Up turns false.
func TestRedisRefusingThePassword(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	srv.SetPassword(t, "", "old-password")
	e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{srv.Addr()}, Password: "old-password"}})
	e.acquire(t, newUser(t), "closed", "")
	srv.SetPassword(t, "old-password", "new-password")
	assertOutageAnswers(t, e)
	time.Sleep(cluster.DownAfter + 100*time.Millisecond)
	assertOutageAnswers(t, e) // the calls themselves record the outage
	if e.redis.Up() {
		t.Errorf("Up() = true while Redis refused every connection's password, want false")
	}
	srv.SetPassword(t, "new-password", "old-password")
	awaitRecovery(t, e, 10*time.Second)
}

func TestRedisBlackHoledFromTheStart(t *testing.T) {
	t.Parallel()
	e := newUnconnected(t, testenv.BlackHole(t))
	assertOutageAnswers(t, e)
}

func TestRedisBlackHoledWhileRunning(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}}})
	e.acquire(t, newUser(t), "closed", "")
	proxy.BlackHole()
	assertOutageAnswers(t, e)
	proxy.Restore()
	awaitRecovery(t, e, 10*time.Second)
}

func TestClusterSeedsUnreachableFromTheStart(t *testing.T) {
	t.Parallel()
	e := newUnconnected(t, testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t))
	assertOutageAnswers(t, e)
}

func TestOutageWarningsAreRateLimited(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	lim := limitertest.New(t, limitertest.Options{
		Redis:   cluster.Options{Addrs: []string{testenv.FreeAddr(t)}},
		Limiter: limiter.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		NoWait:  true,
	}).Limiter
	for range 100 {
		res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: "u", Plan: "three"})
		if err != nil || !res.Degraded {
			t.Fatalf("Acquire = %+v, %v; want degraded", res, err)
		}
	}
	if n := strings.Count(logs.String(), "granting acquire degraded"); n != 1 {
		t.Errorf("100 degraded acquires logged %d warnings, want 1 (rate-limited):\n%s", n, logs.String())
	}
}

// TestARefusingRedisIsNotAnOutage: an error reply no retry will fix (here a
// key of the wrong type under the prefix) is reported, on every plan,
// instead of failing open forever and hiding the misconfiguration.
func TestARefusingRedisIsNotAnOutage(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		user := newUser(t)
		raw := e.raw(t)
		if err := raw.Do(context.Background(), raw.B().Set().Key(e.key(t, user)).Value("not a sorted set").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		for _, plan := range []string{"three", "closed"} {
			res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: plan})
			if !errors.Is(err, limiter.ErrRedisRefused) || res.Degraded {
				t.Errorf("plan %s: Acquire on a key of the wrong type = %+v, %v; want ErrRedisRefused, not degraded", plan, res, err)
			}
		}
		if _, err := e.lim.Heartbeat(context.Background(), limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: "s"}); !errors.Is(err, limiter.ErrRedisRefused) {
			t.Errorf("Heartbeat on a key of the wrong type = %v, want ErrRedisRefused", err)
		}
	})
}
