package hold_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/holdtest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// env is a Holder on a limiter on the shared standalone Redis, with its
// metrics served as /metrics would serve them and its Redis calls counted.
type env struct {
	*holdtest.Env
	calls *callCounter
}

func newEnv(t *testing.T, opts hold.Options, stackOpts limitertest.Options) *env {
	t.Helper()
	calls := &callCounter{ops: map[string]int{}}
	stackOpts.Limiter.Observer = calls
	return &env{Env: holdtest.New(t, holdtest.Options{Stack: stackOpts, Hold: opts}), calls: calls}
}

func (e *env) acquire(t *testing.T, user, plan string) *hold.Stream {
	t.Helper()
	st, res, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: plan})
	if err != nil || st == nil {
		t.Fatalf("Acquire(%s, %s) = %v, %+v, %v; want a stream", user, plan, st, res, err)
	}
	return st
}

func newUser() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "hold-" + hex.EncodeToString(b[:])
}

// callCounter is a limiter.Observer that counts Redis round trips by op.
type callCounter struct {
	mu  sync.Mutex
	ops map[string]int
}

func (c *callCounter) Acquired(context.Context, tiers.Tier, limiter.AcquireResult, error) {}
func (c *callCounter) Heartbeated(context.Context, limiter.HeartbeatResult, error)        {}
func (c *callCounter) Released(context.Context, limiter.ReleaseResult, error)             {}
func (c *callCounter) Reclaimed(context.Context, string, int)                             {}
func (c *callCounter) Waiting(context.Context, tiers.Tier, int)                           {}
func (c *callCounter) Waited(context.Context, tiers.Tier, limiter.WaitOutcome, time.Duration) {
}
func (c *callCounter) Joined(context.Context, string, limiter.JoinOutcome, int, int) {}
func (c *callCounter) PoolReclaimed(context.Context, string, int)                    {}
func (c *callCounter) PoolWaiting(context.Context, string, int, int)                 {}
func (c *callCounter) PoolWaited(context.Context, string, int, limiter.WaitOutcome, time.Duration) {
}
func (c *callCounter) RedisCall(_ context.Context, op string, _ time.Duration, _ error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[op]++
}

func (c *callCounter) count(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops[op]
}

func (c *callCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.ops)
}

func TestReleaseOnEveryEnd(t *testing.T) {
	e := newEnv(t, hold.Options{}, limitertest.Options{})
	for _, end := range []hold.End{hold.EndComplete, hold.EndClientGone, hold.EndUpstreamError, hold.EndPanic, hold.EndShutdown, hold.EndLost} {
		t.Run(string(end), func(t *testing.T) {
			user := newUser()
			st := e.acquire(t, user, "one")
			if got := e.Used(t, user); got != 1 {
				t.Fatalf("after Acquire: %d slots held, want 1", got)
			}
			// The end path's own context is often gone already (a client
			// that disconnected): the release must happen all the same.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if !st.Release(ctx, end) {
				t.Fatalf("Release(%s) = false on the first call", end)
			}
			if st.Release(context.Background(), hold.EndComplete) {
				t.Errorf("a second Release = true, want false (idempotent)")
			}
			if got := e.Used(t, user); got != 0 {
				t.Errorf("after Release(%s): %d slots held, want 0", end, got)
			}
			if got := e.Metric(t, `limiter_streams_held_total{end="`+string(end)+`",mode="test"}`); got != "1" {
				t.Errorf("limiter_streams_held_total{end=%q}: got %q, want 1", end, got)
			}
		})
	}
	if got := e.Metric(t, `limiter_streams_active{mode="test"}`); got != "0" {
		t.Errorf("limiter_streams_active after every release: got %q, want 0", got)
	}
	if got := e.Holder.Held(); got != 0 {
		t.Errorf("Held() = %d, want 0", got)
	}
}

// Releases race from every end path at once: exactly one of them releases.
// Every stream counter's series is on /metrics at 0 from the start, for
// each end and reason: a series that first appears at the value of its
// first increase (the first stalled stream, say) is one rate() and
// increase() cannot see.
func TestStreamCountersStartAtZero(t *testing.T) {
	e := newEnv(t, hold.Options{}, limitertest.Options{})
	series := []string{`limiter_streams_active{mode="test"}`, `limiter_streams_lost_total{mode="test"}`}
	for _, end := range []string{"complete", "client_gone", "upstream_error", "panic", "shutdown", "lost", "idle", "stalled"} {
		series = append(series, `limiter_streams_held_total{end="`+end+`",mode="test"}`)
	}
	for _, reason := range []string{"limit", "unavailable", "unknown_plan", "unknown_pool", "identity", "plan_not_allowed", "invalid", "lost", "error"} {
		series = append(series, `limiter_streams_refused_total{mode="test",reason="`+reason+`"}`)
	}
	for _, s := range series {
		if got := e.Metric(t, s); got != "0" {
			t.Errorf("%s before any stream: got %q, want 0", s, got)
		}
	}
}

func TestConcurrentReleasesReleaseOnce(t *testing.T) {
	e := newEnv(t, hold.Options{}, limitertest.Options{})
	user := newUser()
	st := e.acquire(t, user, "one")
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for _, end := range []hold.End{hold.EndComplete, hold.EndClientGone, hold.EndUpstreamError, hold.EndPanic} {
		wg.Go(func() {
			if st.Release(context.Background(), end) {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d releases reported true, want exactly 1", wins)
	}
	if got := e.Used(t, user); got != 0 {
		t.Errorf("%d slots held after the releases, want 0", got)
	}
}

func TestLimitIsAResultNotAnError(t *testing.T) {
	e := newEnv(t, hold.Options{}, limitertest.Options{})
	user := newUser()
	first := e.acquire(t, user, "one")
	defer first.Release(context.Background(), hold.EndComplete)
	st, res, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "one"})
	if st != nil || err != nil || res.Granted || res.RetryAfter <= 0 {
		t.Fatalf("second Acquire on a plan of 1 = %v, %+v, %v; want no stream, no error, a RetryAfter", st, res, err)
	}
	if got := e.Metric(t, `limiter_streams_refused_total{mode="test",reason="limit"}`); got != "1" {
		t.Errorf("refused{reason=limit}: got %q, want 1", got)
	}
	_, _, err = e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "nope"})
	if !errors.Is(err, limiter.ErrUnknownPlan) {
		t.Errorf("Acquire on an unknown plan: err %v, want ErrUnknownPlan", err)
	}
	if got := e.Metric(t, `limiter_streams_refused_total{mode="test",reason="unknown_plan"}`); got != "1" {
		t.Errorf("refused{reason=unknown_plan}: got %q, want 1", got)
	}
}

// Many streams of one interval share one HeartbeatBatch call per interval,
// and their slots live on far past their TTL.
func TestOneBatchPerIntervalForAllStreams(t *testing.T) {
	e := newEnv(t, hold.Options{}, limitertest.Options{})
	const users, perUser = 40, 3 // plan "short": 3 slots, TTL 300ms, heartbeat 100ms
	var streams []*hold.Stream
	var ids []string
	for range users {
		user := newUser()
		ids = append(ids, user)
		for range perUser {
			streams = append(streams, e.acquire(t, user, "short"))
		}
	}
	e.calls.reset()
	const window = 1200 * time.Millisecond // 4x the TTL
	time.Sleep(window)
	batches, singles := e.calls.count("heartbeat_batch"), e.calls.count("heartbeat")
	// 12 intervals in the window; a loaded machine may run late.
	if batches < 6 || batches > 13 || singles != 0 {
		t.Errorf("%d streams over %v of 100ms heartbeats: %d batch calls and %d single heartbeats, want about 12 batches and no single one",
			len(streams), window, batches, singles)
	}
	for _, user := range ids {
		if got := e.Used(t, user); got != perUser {
			t.Fatalf("user %s holds %d slots after 4x the TTL, want %d (kept alive)", user, got, perUser)
		}
	}
	for _, st := range streams {
		select {
		case <-st.Lost():
			t.Fatalf("stream %s lost: %v", st.ID(), st.Err())
		default:
		}
		st.Release(context.Background(), hold.EndComplete)
	}
}

// Streams of two intervals are heartbeated in two groups, each at its own
// interval.
func TestBatchesGroupedByInterval(t *testing.T) {
	e := newEnv(t, hold.Options{}, limitertest.Options{})
	fast := e.acquire(t, newUser(), "short") // 100ms
	slow := e.acquire(t, newUser(), "one")   // 1s
	defer fast.Release(context.Background(), hold.EndComplete)
	defer slow.Release(context.Background(), hold.EndComplete)
	e.calls.reset()
	time.Sleep(2100 * time.Millisecond)
	// 21 fast batches and 2 slow ones.
	if got := e.calls.count("heartbeat_batch"); got < 14 || got > 24 {
		t.Errorf("%d batch calls in 2.1s for a 100ms and a 1s stream, want about 23", got)
	}
}

func TestLostWhenTheSlotIsRemovedBehindItsBack(t *testing.T) {
	e := newEnv(t, hold.Options{}, limitertest.Options{})
	user := newUser()
	st := e.acquire(t, user, "short")
	ctx, cancel := st.Context(context.Background())
	defer cancel()
	// Support unlocks the account.
	if _, err := e.Stack.Limiter.ReleaseAll(context.Background(), user, "audit-"+user); err != nil {
		t.Fatal(err)
	}
	select {
	case <-st.Lost():
	case <-time.After(time.Second):
		t.Fatal("Lost did not close within 1s of the slot's removal (heartbeat 100ms)")
	}
	if err := st.Err(); !errors.Is(err, hold.ErrLost) || !errors.Is(err, limiter.ErrSlotLost) {
		t.Errorf("Err() = %v, want ErrLost wrapping limiter.ErrSlotLost", err)
	}
	select {
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), hold.ErrLost) {
			t.Errorf("the stream context's cause is %v, want ErrLost", context.Cause(ctx))
		}
	default:
		t.Error("the stream's context was not cancelled when its slot was lost")
	}
	if got := e.Metric(t, `limiter_streams_lost_total{mode="test"}`); got != "1" {
		t.Errorf("limiter_streams_lost_total: got %q, want 1", got)
	}
	if !st.Release(context.Background(), hold.EndLost) {
		t.Error("Release after a loss = false, want true (the holder's end is still recorded)")
	}
	// A context asked for after the loss is born cancelled.
	late, cancelLate := st.Context(context.Background())
	defer cancelLate()
	if late.Err() == nil {
		t.Error("a Context taken after the loss is not cancelled")
	}
}

func TestCloseReleasesEveryStreamStillHeld(t *testing.T) {
	e := newEnv(t, hold.Options{}, limitertest.Options{})
	user := newUser()
	var streams []*hold.Stream
	for range 3 {
		streams = append(streams, e.acquire(t, user, "three"))
	}
	streams[0].Release(context.Background(), hold.EndComplete)
	if cut, released := e.Holder.Close(context.Background()); cut != 2 || released != 2 {
		t.Errorf("Close cut %d streams and released %d, want the 2 still held, both", cut, released)
	}
	if got := e.Used(t, user); got != 0 {
		t.Errorf("%d slots held after Close, want 0", got)
	}
	for _, st := range streams[1:] {
		select {
		case <-st.Lost():
			if !errors.Is(st.Err(), hold.ErrShutdown) {
				t.Errorf("Err() = %v, want ErrShutdown", st.Err())
			}
		default:
			t.Error("a stream released by Close was not told (Lost open)")
		}
		if st.Release(context.Background(), hold.EndComplete) {
			t.Error("the holder's own Release after Close = true, want false")
		}
	}
	if _, _, err := e.Holder.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three"}); !errors.Is(err, hold.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
	if got := e.Used(t, user); got != 0 {
		t.Errorf("Acquire after Close left %d slots, want 0", got)
	}
	if got := e.Metric(t, `limiter_streams_held_total{end="shutdown",mode="test"}`); got != "2" {
		t.Errorf("held_total{end=shutdown}: got %q, want 2", got)
	}
}

func TestIdleStreamsAreReleased(t *testing.T) {
	e := newEnv(t, hold.Options{IdleTimeout: 300 * time.Millisecond}, limitertest.Options{})
	idleUser, busyUser := newUser(), newUser()
	idle := e.acquire(t, idleUser, "short")
	busy := e.acquire(t, busyUser, "short")
	defer busy.Release(context.Background(), hold.EndComplete)
	deadline := time.Now().Add(800 * time.Millisecond)
	for time.Now().Before(deadline) {
		busy.Touch()
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-idle.Lost():
		if !errors.Is(idle.Err(), hold.ErrIdle) {
			t.Errorf("idle stream Err() = %v, want ErrIdle", idle.Err())
		}
	default:
		t.Fatal("a stream untouched for 800ms (IdleTimeout 300ms) is still held")
	}
	if got := e.Used(t, idleUser); got != 0 {
		t.Errorf("idle stream's user holds %d slots, want 0", got)
	}
	select {
	case <-busy.Lost():
		t.Fatalf("a touched stream was lost: %v", busy.Err())
	default:
	}
	if got := e.Used(t, busyUser); got != 1 {
		t.Errorf("touched stream's user holds %d slots, want 1", got)
	}
}

// TestCloseCutsAtOnceAndReleasesWithinItsContext: with Redis hung, Close
// cuts every stream still held at once, starts no release once its ctx
// has ended, returns by ctx's deadline however many releases are left,
// and counts none released that Redis did not free.
func TestCloseCutsAtOnceAndReleasesWithinItsContext(t *testing.T) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	e := newEnv(t, hold.Options{ReleaseConcurrency: 2}, limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 500 * time.Millisecond}})
	var streams []*hold.Stream
	for range 3 {
		user := newUser()
		for range 3 {
			streams = append(streams, e.acquire(t, user, "three"))
		}
	}
	path.BlackHole()
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	start := time.Now()
	type closed struct{ cut, released int }
	done := make(chan closed, 1)
	go func() {
		cut, released := e.Holder.Close(ctx)
		done <- closed{cut, released}
	}()
	for i, st := range streams {
		select {
		case <-st.Lost():
		case <-time.After(200 * time.Millisecond):
			t.Fatalf("stream %d of %d was not cut within 200ms of Close (ReleaseConcurrency 2, Redis hung)", i+1, len(streams))
		}
		if !errors.Is(st.Err(), hold.ErrShutdown) {
			t.Errorf("stream %d: Err() = %v, want ErrShutdown", i+1, st.Err())
		}
	}
	var got closed
	select {
	case got = <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not return within 3s")
	}
	// Five waves of two at 500ms each would take 2.5s.
	if took := time.Since(start); took > time.Second {
		t.Errorf("Close returned %v on, with a 700ms context; want by its deadline", took.Round(time.Millisecond))
	}
	if got.cut != len(streams) || got.released != 0 {
		t.Errorf("Close = %d cut, %d released, with Redis hung; want %d cut, 0 released", got.cut, got.released, len(streams))
	}
	for _, st := range streams {
		if st.Release(context.Background(), hold.EndComplete) {
			t.Error("the holder's own Release after Close = true, want false: Close ended it")
		}
	}
}

// TestCloseOwnsTheStreamsItCuts: with Redis hung, each stream's holder
// releases it as soon as Close cuts it, as a proxy's handler does. Close
// has ended the stream as it cut it: the holder's Release returns at once
// (its answer to the client is not held up by a release that Redis does
// not answer), and Close counts every stream cut, none released.
func TestCloseOwnsTheStreamsItCuts(t *testing.T) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	e := newEnv(t, hold.Options{}, limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: time.Second}})
	const n = 8
	streams := make([]*hold.Stream, n)
	for i := range streams {
		streams[i] = e.acquire(t, newUser(), "three")
	}
	path.BlackHole()
	type ended struct {
		took     time.Duration
		released bool
	}
	handlers := make(chan ended, n)
	// Each holder releases its stream the moment Close has cut it, before
	// Close goes on.
	defer hold.SetCloseCut(func(st *hold.Stream) {
		<-st.Lost()
		start := time.Now()
		released := st.Release(context.Background(), hold.EndComplete)
		handlers <- ended{time.Since(start), released}
	})()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	cut, released := e.Holder.Close(ctx)
	if cut != n || released != 0 {
		t.Errorf("Close = %d cut, %d released, with Redis hung; want %d cut, 0 released", cut, released, n)
	}
	for range n {
		if h := <-handlers; h.released || h.took > 200*time.Millisecond {
			t.Errorf("a holder's Release once its stream was cut: %v after %v; want false at once: Close ended the stream", h.released, h.took.Round(time.Millisecond))
		}
	}
}

// A stream granted degraded while Redis did not answer is acquired again,
// under its own stream id, once Redis answers: it counts from then on.
func TestDegradedStreamIsCountedOnceRedisAnswers(t *testing.T) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	e := newEnv(t, hold.Options{}, limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 200 * time.Millisecond}})
	user := newUser()
	path.BlackHole()
	st := e.acquire(t, user, "short")
	if !st.Degraded() {
		t.Fatal("Acquire while Redis is black-holed was not degraded")
	}
	defer st.Release(context.Background(), hold.EndComplete)
	time.Sleep(300 * time.Millisecond) // degraded heartbeats meanwhile
	path.Restore()
	deadline := time.Now().Add(5 * time.Second)
	for {
		slots, err := e.Stack.Limiter.Slots(context.Background(), user)
		if err == nil && slots.Used == 1 && slots.Slots[0].StreamID == st.ID() && !st.Degraded() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s after Redis came back: slots %+v (err %v), degraded %v; want the stream's own slot counted", slots, err, st.Degraded())
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-st.Lost():
		t.Fatalf("the degraded stream was lost: %v", st.Err())
	default:
	}
}

// releaseOnLost releases a stream from inside the heartbeat batch's
// answer that says its degraded slot is not in Redis: the stream ends
// just before the holder acquires it again.
type releaseOnLost struct {
	callCounter
	mu       sync.Mutex
	st       *hold.Stream
	released bool
}

func (o *releaseOnLost) Heartbeated(_ context.Context, _ limiter.HeartbeatResult, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.st != nil && errors.Is(err, limiter.ErrSlotLost) {
		o.released = o.st.Release(context.Background(), hold.EndComplete)
		o.st = nil
	}
}

// A degraded stream that ends while its re-acquire is on its way (Redis
// answering again) gives the slot the re-acquire takes back: its user,
// whose plan allows 1, streams again at once, and holds no slot in Redis.
func TestADegradedStreamEndedWhileRejoiningKeepsNoSlot(t *testing.T) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	obs := &releaseOnLost{callCounter: callCounter{ops: map[string]int{}}}
	stackOpts := limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 200 * time.Millisecond}}
	stackOpts.Limiter.Observer = obs
	e := &env{Env: holdtest.New(t, holdtest.Options{Stack: stackOpts}), calls: &obs.callCounter}
	user := newUser()
	path.BlackHole()
	st := e.acquire(t, user, "one")
	if !st.Degraded() {
		t.Fatal("Acquire while Redis is black-holed was not degraded")
	}
	obs.mu.Lock()
	obs.st = st
	obs.mu.Unlock()
	path.Restore()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		obs.mu.Lock()
		released := obs.released
		obs.mu.Unlock()
		if released {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stream was not released from the heartbeat's answer within 5s")
		}
	}
	time.Sleep(500 * time.Millisecond) // the re-acquire lands, and its give-back
	if got := e.Used(t, user); got != 0 {
		t.Errorf("the stream ended while it rejoined; its user holds %d slots in Redis, want 0", got)
	}
	next := e.acquire(t, user, "one")
	next.Release(context.Background(), hold.EndComplete)
}
